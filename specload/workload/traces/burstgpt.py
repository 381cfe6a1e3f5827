"""BurstGPT (HPMLL/BurstGPT): CSV rows of ``Timestamp,Model,Request tokens,Response tokens,Total tokens,
Log Type``, the column layout its README publishes.

Units, fixed here: ``Timestamp`` is seconds since the trace's start; the lengths are tokens. A
file covers two months, so the span allowed is longer than other formats'. Rows with 0 response
tokens are the failed requests the log keeps; they cannot be replayed as they were and are
counted out (``Trace.skipped``). No prefix blocks.
"""

from __future__ import annotations

from pathlib import Path

from specload.workload.traces.jsonrows import csv_rows
from specload.workload.traces.model import Trace, TraceRequest, length, number, read_rows

FORMAT = "burstgpt"
TIME_UNIT = "s"
COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")
MAX_SPAN_S = 130 * 86400.0  # BurstGPT's release covers 121 days


def read(path: str | Path) -> Trace:
    source = str(path)

    def request(row: int, d: dict[str, str]) -> TraceRequest:
        return TraceRequest(
            row,
            number(source, row, "Timestamp", d["Timestamp"]),
            length(source, row, "Request tokens", d["Request tokens"]),
            length(source, row, "Response tokens", d["Response tokens"]),
        )

    return read_rows(FORMAT, source, TIME_UNIT, 1.0, None, csv_rows(source, COLUMNS), request, MAX_SPAN_S)
