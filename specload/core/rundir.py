"""The run directory: where a sweep's raw results land, written as they happen, and what run.json holds.

Records are appended and flushed one by one (a crash loses at most the request in flight), and
``run.json`` is rewritten atomically (temp file + rename) at every level boundary, so whatever
stops the sweep, the directory on disk is complete up to that moment and reportable.

run.json's schema is the msgspec Structs below (``RunMeta``, ``LevelMeta``, ``ClientClock``, and
``ServerInfo`` kept whole): the sweep's owner writes one with ``write_run_meta`` and every reader goes
through ``RunMeta.from_json``. Reading is lenient on purpose (``lenient``): a run directory outlives
the code that wrote it (older files have no ``schema_version`` and count as version 1), so unknown
keys are ignored and a malformed value becomes its field's default instead of an exception. ``specload.analysis.run.load_run`` reads a whole directory back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar, cast, get_args, get_origin, get_type_hints

import msgspec
import orjson

from specload.core import safeopen

# File names inside a run directory (docs/DESIGN-CONTRACTS.md).
RECORDS = "records.jsonl"
RUN_JSON = "run.json"
SERVER_SAMPLES = "server_samples.jsonl"
LOCUST_PREFIX = "locust"
LOCUST_JSON = f"{LOCUST_PREFIX}.json"  # Locust --json-file RUN/locust
LOCUST_CSV = f"{LOCUST_PREFIX}_stats.csv"  # Locust --csv RUN/locust
REPORT_MD = "report.md"

# run.json schema version written by this code; a file without the field is version 1.
SCHEMA_VERSION = 1

# RunMeta.status values.
RUN_RUNNING = "running"
RUN_COMPLETED = "completed"
RUN_INTERRUPTED = "interrupted"
RUN_FAILED = "failed"


MAX_LABEL = 100  # a run directory's name must stay well under the file system's 255 bytes


def safe_name(label: str) -> str:
    """``label`` as part of a file name: anything outside [A-Za-z0-9._-] becomes '-'.

    Labels come from users and run.json; this keeps them from naming a path outside results/ or
    needing shell quotes.
    """
    return re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-") or "run"


def new_run_dir(results_dir: str, label: str) -> str:
    """Create ``results_dir/<label>-<UTC time>/``; never reuse an existing directory."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = os.path.join(results_dir, f"{safe_name(label)}-{stamp}")
    path, n = base, 1
    while True:
        try:
            os.makedirs(path)
            return path
        except FileExistsError:
            n += 1
            path = f"{base}-{n}"


def claim_run_dir(path: str) -> str:
    """Use ``path`` as the run directory if it holds no run yet; otherwise refuse, never overwrite."""
    if os.path.exists(os.path.join(path, RUN_JSON)) or os.path.exists(os.path.join(path, RECORDS)):
        raise FileExistsError(
            f"{path} already holds a run; choose a new directory (runs are never overwritten)"
        )
    os.makedirs(path, exist_ok=True)
    return path


def write_json_atomic(path: str, data: Any) -> None:
    """Write through a temp file and a rename, so a reader (or a crash) never sees half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str) -> Any:
    """One JSON document from a regular file of sane size (``safeopen``): a FIFO or a device in a
    run directory is an OSError, never a hang."""
    return orjson.loads(safeopen.read_bytes(path))


def read_jsonl(
    path: str | Path, skipped: list[int] | None = None, max_bytes: int | None = safeopen.MAX_DOCUMENT_BYTES
) -> Iterator[Any]:
    """Each line's JSON value, in file order. Raises OSError when the file cannot be opened, or is
    not a regular file of at most ``max_bytes`` (``safeopen.open_regular``).

    Blank, torn and malformed lines are skipped (their 1-based numbers go to ``skipped``, for a
    note): files are appended while the sweep runs, so a crash (or a reader racing the writer)
    leaves at most a torn last line and the rest is good.
    """
    with safeopen.open_regular(path, max_bytes) as f:
        for no, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield orjson.loads(line)
            except orjson.JSONDecodeError:
                if skipped is not None:
                    skipped.append(no)


class RecordWriter:
    """Appends one JSON line per record and flushes it at once."""

    def __init__(self, run_dir: str) -> None:
        self.path = os.path.join(run_dir, RECORDS)
        self._f = open(self.path, "ab")  # noqa: SIM115 - kept open for the whole run
        self.count = 0

    def write(self, line: bytes) -> None:
        """One record's line (``records.record_line``), its newline added."""
        self._f.write(line + b"\n")
        self._f.flush()
        self.count += 1

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()


# ---------------------------------------------------------------- run.json schema

T = TypeVar("T")


def lenient(cls: type[T], data: Any) -> T | None:
    """``data`` as a ``cls`` (a msgspec Struct or a dataclass), each field read on its own.

    A value that does not fit its field's type leaves the field at its default (None for the
    optional ones); a list of Structs keeps the items that read; keys ``cls`` does not know are
    ignored. None when ``data`` is not an object or a required field has no usable value: a run
    directory outlives the code that wrote it, and one bad value must not hide the rest.
    """
    if not isinstance(data, Mapping):
        return None
    with contextlib.suppress(msgspec.ValidationError):  # the common case: every field fits
        return msgspec.convert(data, cls, strict=False, dec_hook=_dec_hook)
    names, hints = _fields(cast(Any, cls))
    values: dict[str, Any] = {}
    for name in names:
        if name not in data:
            continue
        tp, value = hints[name], data[name]
        item = get_args(tp)[0] if get_origin(tp) is list else None
        if isinstance(item, type) and issubclass(item, msgspec.Struct) and isinstance(value, list):
            values[name] = [x for x in (lenient(item, v) for v in value) if x is not None]
            continue
        with contextlib.suppress(msgspec.ValidationError):
            values[name] = msgspec.convert(value, tp, strict=False, dec_hook=_dec_hook)
    try:
        return cls(**values)
    except (TypeError, ValueError):
        return None


@functools.cache
def _fields(cls: Any) -> tuple[list[str], dict[str, Any]]:
    """The field names of a Struct or dataclass, and their types."""
    fs = msgspec.structs.fields(cls) if issubclass(cls, msgspec.Struct) else dataclasses.fields(cls)
    return [f.name for f in fs], get_type_hints(cls, include_extras=True)


class LevelMeta(msgspec.Struct, kw_only=True):
    """One level's entry in run.json ``levels``: its plan, its boundaries and how it ended.

    ``status`` is ``completed``, ``incomplete`` or ``running``; ``lost`` counts requests written
    off with a lost worker (``note`` says which). Times are wall-clock epoch seconds.
    """

    index: int | None = None
    concurrency: int
    repeat: int = 0
    budget: int | None = None  # measured requests planned (None: the level runs for duration_s)
    warmup: int = 0
    duration_s: float | None = None
    t_start: float | None = None
    t_measure_start: float | None = None
    t_end: float | None = None
    status: str | None = None
    granted: int | None = None
    received: int | None = None
    granted_warmup: int | None = None
    received_warmup: int | None = None
    lost: int = 0
    refused: int = 0  # measured requests refused during a server outage (counted as failed)
    outage_s: float = 0.0  # seconds the level waited for the server to come back
    note: str | None = None
    # The client's own load during the level (specload.analysis.clientcheck.ClientFigures.to_json); None
    # in runs made before it was measured.
    client: dict[str, Any] | None = None
    # A rate level's requests/s (open loop; ``concurrency`` is then its user pool); None: a
    # concurrency level.
    rate: Annotated[float, msgspec.Meta(gt=0)] | None = None

    @property
    def x(self) -> float:
        """The level's value on a report's x axis: its rate, or its concurrency."""
        return self.rate if self.rate is not None else self.concurrency

    @classmethod
    def from_json(cls, d: Any) -> LevelMeta | None:
        """None when ``d`` is not a level (not an object, or no usable ``concurrency``)."""
        return lenient(cls, d)


class ServerInfo:
    """run.json ``server``: the server's own account of its configuration (introspect.server_config).

    Kept whole as written, because every engine and version describes itself differently and the
    raw answer is worth keeping; the few keys specload reasons about are read through the typed
    properties below. ``{}`` means the server said nothing.
    """

    __slots__ = ("data",)

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self.data: Mapping[str, Any] = dict(data or {})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ServerInfo) and self.data == other.data

    def __repr__(self) -> str:
        return f"ServerInfo({self.data!r})"

    @classmethod
    def from_json(cls, d: Any) -> ServerInfo:
        return cls(d if isinstance(d, Mapping) else {})

    def get(self, key: str) -> Any:
        """A raw value (None when absent), e.g. to tell whether two runs had the same server."""
        return self.data.get(key)

    @property
    def engine(self) -> str | None:
        return _str(self.data.get("engine"))

    @property
    def speculative_algorithm(self) -> str | None:
        return _str(self.data.get("speculative_algorithm"))

    @property
    def reports_speculation(self) -> bool:
        """The server said which speculative algorithm it runs (None counts: it runs none)."""
        return "speculative_algorithm" in self.data

    @property
    def max_running_requests(self) -> int | None:
        """The configured cap on requests decoded at once."""
        return _positive_int(self.data.get("max_running_requests"))

    @property
    def max_running(self) -> int | None:
        """The cap that applies: the effective value (SGLang lowers the configured one for
        speculative decoding, e.g. to 48) wins over the configured one; None when unknown."""
        return _positive_int(self.data.get("max_running_requests_effective")) or self.max_running_requests

    @property
    def simulated(self) -> bool:
        return bool(self.data.get("simulated", False))

    def summary(self) -> str | None:
        """The configuration in one line; None if the server said nothing worth a line.

        E.g. ``engine sglang, speculative_algorithm NEXTN, max_running_requests 48 (configured 64)``.
        """
        parts: list[str] = []
        if "engine" in self.data:
            parts.append(f"engine {self.data['engine']}")
        if self.reports_speculation:
            parts.append(f"speculative_algorithm {self.data['speculative_algorithm'] or 'none'}")
        cap = self.max_running
        if cap is not None:
            configured = self.max_running_requests
            parts.append(
                f"max_running_requests {cap}"
                + (f" (configured {configured})" if configured not in (None, cap) else "")
            )
        return ", ".join(parts) or None


def _str(v: Any) -> str | None:
    return None if v is None else str(v)


def _positive_int(v: Any) -> int | None:
    """A cap the server reported: only a positive integer counts (not a bool, not a string)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _dec_hook(tp: type, obj: Any) -> Any:
    if tp is ServerInfo:
        return ServerInfo.from_json(obj)
    raise NotImplementedError(tp)


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, ServerInfo):
        return dict(obj.data)
    raise NotImplementedError(type(obj))


class ClientClock(msgspec.Struct, frozen=True):
    """run.json ``clients``: one worker's clock against the master's (specload.core.clocks), measured when
    the run started or the worker joined. ``offset_ms`` > 0: the worker's clock is ahead."""

    worker: str
    offset_ms: float
    rtt_ms: float
    samples: int = 0
    measured_at: float | None = None


class RunMeta(msgspec.Struct):
    """run.json: what was run, against what, and how far it got (docs/DESIGN-CONTRACTS.md).

    Every field but ``schema_version`` may be missing from a file, hence the defaults; a run
    directory without run.json reads as ``RunMeta()``. ``scenario`` is the resolved Scenario as
    written (``Scenario.to_dict``): the field table lives above this layer, in
    specload.workload.config, and ``specload.workload.recorded.recorded_scenario`` types it.
    """

    schema_version: int = SCHEMA_VERSION
    specload_version: str | None = None
    locust_version: str | None = None
    label: str | None = None
    host: str | None = None  # without credentials
    backend: str | None = None
    model: str | None = None
    model_source: str | None = None  # how the model name was found (scenario/flag, /v1/models)
    scenario_file: str | None = None
    scenario: dict[str, Any] = {}  # every resolved Scenario field
    started_at: float | None = None
    ended_at: float | None = None
    status: str | None = None  # RUN_RUNNING | RUN_COMPLETED | RUN_INTERRUPTED | RUN_FAILED
    reason: str | None = None  # why the run did not complete
    mode: str | None = None  # local | master
    levels: list[LevelMeta] = []
    server: ServerInfo = msgspec.field(default_factory=ServerInfo)
    simulated: bool = False
    server_metrics: str | None = None  # off | sampled | unavailable
    # PromptSource.describe(): what prompts were made of; left out of the file when empty (runs before
    # prompts were recorded read back as they were written).
    prompts: dict[str, Any] = {}
    clients: list[ClientClock] = []  # workers' clock offsets (distributed runs); left out when empty
    # A trace replay (specload.workload.replay.Replay.describe): the file, its units, the window and the
    # trace's own ideal prefix-cache hit rate; left out when the run replayed no trace.
    trace: dict[str, Any] = {}

    @classmethod
    def from_json(cls, d: Any) -> RunMeta:
        """Any parsed run.json, old or new; what is not an object reads as an empty RunMeta.
        A file without ``schema_version`` is version 1."""
        if not isinstance(d, Mapping):
            return cls()
        return lenient(cls, {"schema_version": 1, **d}) or cls()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = msgspec.to_builtins(self, enc_hook=_enc_hook)
        for key in ("prompts", "clients", "trace"):
            if not out[key]:
                del out[key]
        return out


def write_run_meta(run_dir: str | Path, meta: RunMeta) -> Path:
    """Write ``run_dir/run.json`` atomically (a reader never sees half a file); returns its path."""
    path = Path(run_dir) / RUN_JSON
    write_json_atomic(str(path), meta.to_json())
    return path


def read_run_meta(run_dir: str | Path) -> RunMeta:
    """``run_dir/run.json`` as a RunMeta; raises OSError (no file) or ValueError (not JSON)."""
    return RunMeta.from_json(read_json(str(Path(run_dir) / RUN_JSON)))
