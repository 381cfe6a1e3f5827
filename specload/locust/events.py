"""Locust request events from a record: Locust's own Statistics, header, charts, CSV and HTML report.

Each request becomes exactly one Locust request row, named by level, so Locust's totals (the
header's RPS and failure %, the Aggregated row, the charts) count real generation requests only.
response_time is the E2E time; response_length is 0, because specload counts tokens, not bytes
(Locust's column says bytes). TTFT, TPOT and tok/s are specload's own figures: they live in
specload's view of the web UI (``specload.locust.webui``) and the report, computed from the exact
records (Locust buckets response times to about two significant digits).
"""

from __future__ import annotations

from typing import Any

from specload.core.records import OK, PHASE_WARMUP, RequestRecord, level_label


class RequestFailed(Exception):
    """The reason a request is not OK, as Locust's failure table shows it."""


_names: dict[tuple[Any, ...], str] = {}


def row_name(rec: RequestRecord, path: str) -> str:
    """The record's Locust row: ``c016 /v1/completions``, ``c016 warmup ...`` (made once per level)."""
    key = (rec.concurrency, rec.repeat, rec.rate, rec.phase == PHASE_WARMUP, path)
    name = _names.get(key)
    if name is None:
        label = level_label(rec.concurrency, rec.repeat, rec.rate)
        name = f"{label} warmup {path}" if rec.phase == PHASE_WARMUP else f"{label} {path}"
        if len(_names) > 4096:
            _names.clear()
        _names[key] = name
    return name


def fire_record(fire: Any, rec: RequestRecord, path: str) -> None:
    name = row_name(rec, path)
    fire(
        request_type="POST",
        name=name,
        response_time=rec.e2e_s * 1000.0,
        response_length=0,
        exception=None if rec.status == OK else RequestFailed(f"{rec.status}: {rec.reason}"),
        context={"level": rec.level, "phase": rec.phase},
        response=None,
        url=path,
        start_time=rec.t_send,
    )
