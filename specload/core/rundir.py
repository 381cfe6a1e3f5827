"""The run directory: where a sweep's raw results land, written as they happen, and what run.json holds.

Records are appended and flushed one by one (a crash loses at most the request in flight), and
``run.json`` is rewritten atomically (temp file + rename) at every level boundary, so whatever
stops the sweep, the directory on disk is complete up to that moment and reportable.

run.json's schema is the dataclasses below (``RunMeta``, ``LevelMeta``, ``ServerInfo``): the
sweep's owner writes one with ``write_run_meta`` and every reader goes through ``RunMeta.from_json``.
Reading is lenient on purpose: a run directory outlives the code that wrote it (older files have
no ``schema_version`` and count as version 1), so unknown keys are kept and malformed values
become None instead of an exception. ``specload.analysis.run.load_run`` reads a whole directory back.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import orjson

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
    with open(path, "rb") as f:
        return orjson.loads(f.read())


def read_jsonl(path: str | Path, skipped: list[int] | None = None) -> Iterator[Any]:
    """Each line's JSON value, in file order. Raises OSError when the file cannot be opened.

    Blank, torn and malformed lines are skipped (their 1-based numbers go to ``skipped``, for a
    note): files are appended while the sweep runs, so a crash (or a reader racing the writer)
    leaves at most a torn last line and the rest is good.
    """
    with open(path, "rb") as f:
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
# Lenient converters: a value of the wrong type reads as None (or the default), never raises.


def _int(v: Any) -> int | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        return None


def _float(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _str(v: Any) -> str | None:
    return None if v is None else str(v)


def _positive_int(v: Any) -> int | None:
    """A cap the server reported: only a positive integer counts (not a bool, not a string)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _extra(d: Mapping[str, Any], cls: type) -> dict[str, Any]:
    known = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k not in known}


@dataclass
class LevelMeta:
    """One level's entry in run.json ``levels``: its plan, its boundaries and how it ended.

    ``status`` is ``completed``, ``incomplete`` or ``running``; ``lost`` counts requests written
    off with a lost worker (``note`` says which). Times are wall-clock epoch seconds.
    """

    index: int | None
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
    rate: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys this schema does not know, kept as read

    @property
    def x(self) -> float:
        """The level's value on a report's x axis: its rate, or its concurrency."""
        return self.rate if self.rate is not None else self.concurrency

    @classmethod
    def from_json(cls, d: Any) -> LevelMeta | None:
        """None when ``d`` is not a level (not an object, or no usable ``concurrency``)."""
        if not isinstance(d, Mapping):
            return None
        concurrency = _int(d.get("concurrency"))
        if concurrency is None:
            return None
        return cls(
            index=_int(d.get("index")),
            concurrency=concurrency,
            repeat=_int(d.get("repeat")) or 0,
            budget=_int(d.get("budget")),
            warmup=_int(d.get("warmup")) or 0,
            duration_s=_float(d.get("duration_s")),
            t_start=_float(d.get("t_start")),
            t_measure_start=_float(d.get("t_measure_start")),
            t_end=_float(d.get("t_end")),
            status=_str(d.get("status")),
            granted=_int(d.get("granted")),
            received=_int(d.get("received")),
            granted_warmup=_int(d.get("granted_warmup")),
            received_warmup=_int(d.get("received_warmup")),
            lost=_int(d.get("lost")) or 0,
            refused=_int(d.get("refused")) or 0,
            outage_s=_float(d.get("outage_s")) or 0.0,
            note=_str(d.get("note")),
            client=dict(d["client"]) if isinstance(d.get("client"), Mapping) else None,
            rate=rate if (rate := _float(d.get("rate"))) is not None and rate > 0 else None,
            extra=_extra(d, cls),
        )

    def to_json(self) -> dict[str, Any]:
        out = dict(self.extra)
        out.update({f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"})
        return out


@dataclass(frozen=True)
class ServerInfo:
    """run.json ``server``: the server's own account of its configuration (introspect.server_config).

    Kept whole as written, because every engine and version describes itself differently and the
    raw answer is worth keeping; the few keys specload reasons about are read through the typed
    properties below. ``{}`` means the server said nothing.
    """

    data: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Any) -> ServerInfo:
        return cls(dict(d) if isinstance(d, Mapping) else {})

    def to_json(self) -> dict[str, Any]:
        return dict(self.data)

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


@dataclass(frozen=True)
class ClientClock:
    """run.json ``clients``: one worker's clock against the master's (specload.core.clocks), measured when
    the run started or the worker joined. ``offset_ms`` > 0: the worker's clock is ahead."""

    worker: str
    offset_ms: float
    rtt_ms: float
    samples: int = 0
    measured_at: float | None = None

    @classmethod
    def from_json(cls, d: Any) -> ClientClock | None:
        if not isinstance(d, Mapping):
            return None
        worker, offset, rtt = _str(d.get("worker")), _float(d.get("offset_ms")), _float(d.get("rtt_ms"))
        if worker is None or offset is None or rtt is None:
            return None
        return cls(worker, offset, rtt, _int(d.get("samples")) or 0, _float(d.get("measured_at")))

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class RunMeta:
    """run.json: what was run, against what, and how far it got (docs/DESIGN-CONTRACTS.md).

    Every field but ``schema_version`` may be missing from a file, hence the defaults; a run
    directory without run.json reads as ``RunMeta()``.
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
    scenario: dict[str, Any] = field(default_factory=dict)  # every resolved Scenario field
    started_at: float | None = None
    ended_at: float | None = None
    status: str | None = None  # RUN_RUNNING | RUN_COMPLETED | RUN_INTERRUPTED | RUN_FAILED
    reason: str | None = None  # why the run did not complete
    mode: str | None = None  # local | master
    levels: list[LevelMeta] = field(default_factory=list)
    server: ServerInfo = field(default_factory=ServerInfo)
    simulated: bool = False
    server_metrics: str | None = None  # off | sampled | unavailable
    prompts: dict[str, Any] = field(
        default_factory=dict
    )  # PromptSource.describe(): what prompts were made of
    clients: list[ClientClock] = field(default_factory=list)  # workers' clock offsets (distributed runs)
    extra: dict[str, Any] = field(default_factory=dict)  # keys this schema does not know, kept as read

    @classmethod
    def from_json(cls, d: Any) -> RunMeta:
        """Any parsed run.json, old or new; what is not an object reads as an empty RunMeta."""
        if not isinstance(d, Mapping):
            return cls()
        levels = d.get("levels")
        scenario = d.get("scenario")
        return cls(
            schema_version=_int(d.get("schema_version")) or 1,
            specload_version=_str(d.get("specload_version")),
            locust_version=_str(d.get("locust_version")),
            label=_str(d.get("label")),
            host=_str(d.get("host")),
            backend=_str(d.get("backend")),
            model=_str(d.get("model")),
            model_source=_str(d.get("model_source")),
            scenario_file=_str(d.get("scenario_file")),
            scenario=dict(scenario) if isinstance(scenario, Mapping) else {},
            started_at=_float(d.get("started_at")),
            ended_at=_float(d.get("ended_at")),
            status=_str(d.get("status")),
            reason=_str(d.get("reason")),
            mode=_str(d.get("mode")),
            levels=[
                lv
                for lv in (LevelMeta.from_json(x) for x in (levels if isinstance(levels, list) else []))
                if lv is not None
            ],
            server=ServerInfo.from_json(d.get("server")),
            simulated=bool(d.get("simulated", False)),
            server_metrics=_str(d.get("server_metrics")),
            prompts=dict(d["prompts"]) if isinstance(d.get("prompts"), Mapping) else {},
            clients=[
                c
                for c in (
                    ClientClock.from_json(x)
                    for x in (d["clients"] if isinstance(d.get("clients"), list) else [])
                )
                if c is not None
            ],
            extra=_extra(d, cls),
        )

    def to_json(self) -> dict[str, Any]:
        out = dict(self.extra)
        for f in fields(self):
            if f.name != "extra":
                out[f.name] = getattr(self, f.name)
        out["levels"] = [lv.to_json() for lv in self.levels]
        out["server"] = self.server.to_json()
        out["scenario"] = dict(self.scenario)
        if self.prompts:
            out["prompts"] = dict(self.prompts)
        else:
            out.pop("prompts")  # a run before prompts were recorded reads back as it was written
        if self.clients:
            out["clients"] = [c.to_json() for c in self.clients]
        else:
            out.pop("clients")  # local runs have none
        return out


def write_run_meta(run_dir: str | Path, meta: RunMeta) -> Path:
    """Write ``run_dir/run.json`` atomically (a reader never sees half a file); returns its path."""
    path = Path(run_dir) / RUN_JSON
    write_json_atomic(str(path), meta.to_json())
    return path


def read_run_meta(run_dir: str | Path) -> RunMeta:
    """``run_dir/run.json`` as a RunMeta; raises OSError (no file) or ValueError (not JSON)."""
    return RunMeta.from_json(read_json(str(Path(run_dir) / RUN_JSON)))
