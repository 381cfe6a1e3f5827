"""A big run's figures kept next to its records, so the next report or compare need not read them.

Reading a 5M-record records.jsonl costs about two minutes of CPU (docs/bench.md), and `compare`
reads every run it is given. When a run's report is written (at the end of the run, or by
``specload report`` without ``--no-write``), the figures of a run whose records.jsonl is big
(``MIN_BYTES``) are kept in ``RUN/figures.cache``; ``load_run`` uses them only when they were made

- from the same files: records.jsonl, run.json, server_samples.jsonl, locust.json and capacity.json
  with the same size, modification time and inode (any change, even a touch, reads the records
  again),
- by the same code: a hash of every module of the installed specload package,
- against the same SLO,
- and on this machine by this user: the file carries an HMAC with a secret kept in
  ``~/.cache/specload/figures.key`` (mode 0600). The figures are a pickle, and unpickling runs code:
  a cache that came with a run directory from elsewhere is never unpickled, only ignored.

Any doubt (missing, other key, bad MAC, unreadable) means: read the records, as without a cache.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import pickle
from pathlib import Path
from typing import Any

from specload.analysis.capacity import CAPACITY_JSON
from specload.core.rundir import LOCUST_JSON, RECORDS, RUN_JSON, SERVER_SAMPLES

CACHE_FILE = "figures.cache"
MIN_BYTES = 64 << 20  # records.jsonl from this size (~90k requests) on: reading it takes seconds
_MAGIC = b"specload-figures-1\n"
_INPUTS = (RECORDS, RUN_JSON, SERVER_SAMPLES, LOCUST_JSON, CAPACITY_JSON)


@functools.lru_cache(maxsize=1)
def code_hash() -> bytes:
    """The installed specload package's modules, hashed (a change in how figures are made must not
    serve figures made the old way)."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(path.read_bytes())
    return h.digest()


def key(run_dir: str | Path, slo: str) -> bytes:
    """What the figures of ``run_dir`` judged against ``slo`` (its text) are made from."""
    d = Path(run_dir)
    h = hashlib.sha256(code_hash())
    for name in _INPUTS:
        try:
            st = (d / name).stat()
            h.update(f"{name} {st.st_size} {st.st_mtime_ns} {st.st_ino}\n".encode())
        except OSError:
            h.update(f"{name} absent\n".encode())
    h.update(b"slo " + slo.encode())
    return h.digest()


def _secret() -> bytes:
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specload"
    path = home / "figures.key"
    try:
        return path.read_bytes()
    except FileNotFoundError:
        home.mkdir(parents=True, exist_ok=True)
        secret = os.urandom(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secret)
        return secret


def _mac(secret: bytes, k: bytes, payload: bytes) -> bytes:
    return hmac.new(secret, k + payload, hashlib.sha256).digest()


def worth_keeping(run_dir: str | Path) -> bool:
    try:
        return (Path(run_dir) / RECORDS).stat().st_size >= MIN_BYTES
    except OSError:
        return False


def load(run_dir: str | Path, k: bytes) -> Any | None:
    """The figures kept for key ``k``; None when there are none that can be trusted."""
    try:
        data = (Path(run_dir) / CACHE_FILE).read_bytes()
    except OSError:
        return None
    head = len(_MAGIC)
    if not data.startswith(_MAGIC) or data[head : head + 32] != k:
        return None
    mac, payload = data[head + 32 : head + 64], data[head + 64 :]
    try:
        if not hmac.compare_digest(mac, _mac(_secret(), k, payload)):
            return None
        return pickle.loads(payload)
    except Exception:  # noqa: BLE001 - a cache that cannot be read is no cache
        return None


def save(run_dir: str | Path, k: bytes, figures: Any) -> bool:
    """Keep ``figures`` under key ``k`` when records.jsonl is big enough to be worth it; False when
    not kept (small run, or the directory or the key file cannot be written: never an error)."""
    d = Path(run_dir)
    if not worth_keeping(d):
        return False
    tmp = d / f".{CACHE_FILE}.{os.getpid()}"
    try:
        payload = pickle.dumps(figures, protocol=pickle.HIGHEST_PROTOCOL)
        tmp.write_bytes(_MAGIC + k + _mac(_secret(), k, payload) + payload)
        os.replace(tmp, d / CACHE_FILE)
    except (OSError, pickle.PicklingError):
        tmp.unlink(missing_ok=True)
        return False
    return True
