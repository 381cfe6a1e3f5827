"""A big run's per-level figures kept beside its records (``figures.msgpack``).

Why it exists: decoding records.jsonl costs ~8 µs of CPU a record (docs/bench.md), so comparing
two 5M-record runs spends 74-84 s of CPU before the first figure (44-51 s over two cores, near the
60 s goal, and over it on a slower or busier machine), while the figures themselves are a few KB
to a few MB: read from here, that compare takes 0.6 s. ``load_run`` therefore keeps what it
computed from a big records file (each level's LevelStats and the reading's notes) and uses it
again only while everything it came from is unchanged:

- run.json, records.jsonl and server_samples.jsonl (each file's size and modification time),
- the SLO the levels were judged against,
- the figure code itself: a digest of specload/core and specload/analysis and the names of the
  figure table's computed figures (``figures.FIGURES``), so an upgraded or edited specload, or one
  with another figure plugged in, never reads figures another computed.

Anything else (another SLO, one more record, another specload) decodes the records again and writes
the file anew; ``report --reread`` / ``compare --reread`` skip it. It is written only for records
files of at least ``MIN_RECORDS_BYTES`` and only once the run has ended: below that size decoding is
quicker than reading one more file, and a running sweep's records still grow.

Safety: msgpack decoded into the typed LevelStats, never a pickle, so a forged file can forge
figures (as editing records.jsonl could) but can run nothing. It is opened without following a link,
read only when it is a regular file under ``MAX_BYTES``, and written to a temporary file that is then
renamed, so a full disk leaves no half-written file.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import stat
import tempfile
from pathlib import Path

import msgspec

import specload
from specload.analysis import figures
from specload.analysis.metrics import LevelStats
from specload.core.rundir import RECORDS, RUN_JSON, RUN_RUNNING, SERVER_SAMPLES
from specload.core.slo import Slo

FIGURES_FILE = "figures.msgpack"
FORMAT = 1  # this file's layout; a file of another format is ignored and written anew
MIN_RECORDS_BYTES = 64 << 20  # ~60k records: below, decoding them is quicker than the saving
# A few KB a level and its tok/s series (12 MB for the bench's 5M run, 46 h a level): bigger is not ours.
MAX_BYTES = 256 << 20


class Saved(msgspec.Struct):
    """What figures.msgpack holds: the key it was computed under, and load_run's figures."""

    format: int
    key: str
    levels: list[LevelStats]
    notices: list[str]  # the records reading's notes (torn lines, dropped fields)


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Saved)


@functools.cache
def code_digest() -> str:
    """A digest of the figure code (specload/core and specload/analysis, every .py file)."""
    root = Path(specload.__file__).parent
    h = hashlib.sha256()
    for sub in ("core", "analysis"):
        for path in sorted((root / sub).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def key_of(run_dir: Path, slo: Slo | None) -> str:
    """The key figures are kept under: the inputs' stamps, the SLO, the code's digest."""
    parts = [
        FORMAT,
        specload.__version__,
        code_digest(),
        [f.field for f in figures.FIGURES if f.compute is not None],  # the table's computed figures
        [_stamp(run_dir / name) for name in (RUN_JSON, RECORDS, SERVER_SAMPLES)],
        None if slo is None else slo.text,
    ]
    return hashlib.sha256(_ENCODER.encode(parts)).hexdigest()


def load(run_dir: Path, key: str) -> Saved | None:
    """The figures kept under ``key``, else None (absent, stale, foreign, unreadable or not a file)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(run_dir / FIGURES_FILE, flags)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        saved = _DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return saved if saved.format == FORMAT and saved.key == key else None


def worth_saving(run_dir: Path, status: str | None) -> bool:
    """True for an ended run whose records file is big enough to be worth not decoding again."""
    size = (_stamp(run_dir / RECORDS) or (0, 0))[0]
    return status != RUN_RUNNING and size >= MIN_RECORDS_BYTES


def save(run_dir: Path, key: str, levels: list[LevelStats], notices: list[str]) -> None:
    """Keep the figures under ``key``; a directory that cannot take the file goes without it."""
    data = _ENCODER.encode(Saved(FORMAT, key, levels, notices))
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{FIGURES_FILE}.", dir=run_dir)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, run_dir / FIGURES_FILE)
        tmp = None
    except OSError:
        pass  # read-only or full: the next reading decodes the records again, as it would without
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
