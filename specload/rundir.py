"""The run directory: where a sweep's raw results land, written as they happen.

Records are appended and flushed one by one (a crash loses at most the request in flight), and
``run.json`` is rewritten atomically (temp file + rename) at every level boundary, so whatever
stops the sweep, the directory on disk is complete up to that moment and reportable.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

import orjson

RECORDS = "records.jsonl"
RUN_JSON = "run.json"
LOCUST_PREFIX = "locust"


def new_run_dir(results_dir: str, label: str) -> str:
    """Create ``results_dir/<label>-<UTC time>/``; never reuse an existing directory."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-") or "run"
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = os.path.join(results_dir, f"{safe}-{stamp}")
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
        raise FileExistsError(f"{path} already holds a run; choose a new directory (runs are never overwritten)")
    os.makedirs(path, exist_ok=True)
    return path


def write_json_atomic(path: str, data: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str) -> Any:
    with open(path, "rb") as f:
        return orjson.loads(f.read())


class RecordWriter:
    """Appends one JSON line per record and flushes it at once."""

    def __init__(self, run_dir: str) -> None:
        self.path = os.path.join(run_dir, RECORDS)
        self._f = open(self.path, "ab")  # noqa: SIM115 - kept open for the whole run
        self.count = 0

    def write(self, rec: dict[str, Any]) -> None:
        self._f.write(orjson.dumps(rec) + b"\n")
        self._f.flush()
        self.count += 1

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
