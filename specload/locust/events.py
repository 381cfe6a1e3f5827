"""Locust request events from a record: the live view in the web UI and Locust's CSV files.

Each request becomes one HTTP row (E2E time, output tokens as the length) plus metric rows for
TTFT, TPOT and per-request tok/s, all named by level so they read as per-level statistics.
These rows are bucketed by Locust (about two significant digits); the report's figures come
from the exact records instead.
"""

from __future__ import annotations

from typing import Any

from specload.records import OK, PHASE_WARMUP, RequestRecord, level_label


class RequestFailed(Exception):
    """The reason a request is not OK, as Locust's failure table shows it."""


def fire_record(fire: Any, rec: RequestRecord, path: str) -> None:
    label = level_label(rec.concurrency, rec.repeat, rec.rate)
    warm = rec.phase == PHASE_WARMUP
    name = f"{label} warmup {path}" if warm else f"{label} {path}"
    fire(
        request_type="POST",
        name=name,
        response_time=rec.e2e_s * 1000.0,
        response_length=rec.output_tokens,
        exception=None if rec.status == OK else RequestFailed(f"{rec.status}: {rec.reason}"),
        context={"level": rec.level, "phase": rec.phase},
        response=None,
        url=path,
        start_time=rec.t_send,
    )
    if warm or rec.status != OK:
        return
    for metric, value in (
        ("ttft", None if rec.ttft_s is None else rec.ttft_s * 1000.0),
        ("tpot", None if rec.tpot_s is None else rec.tpot_s * 1000.0),
        ("tok/s", rec.per_request_tok_s),
    ):
        if value is not None:
            fire(
                request_type="METRIC", name=f"{label} {metric}", response_time=value, response_length=0,
                exception=None, context={}, response=None, url=path, start_time=rec.t_send,
            )  # fmt: skip
