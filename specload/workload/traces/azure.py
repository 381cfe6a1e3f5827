"""Azure's LLM inference traces (Azure/AzurePublicDataset, 2023 and 2024): CSV rows of
``TIMESTAMP,ContextTokens,GeneratedTokens``.

Units, fixed here: ``TIMESTAMP`` is an absolute wall-clock date-time (``2023-11-16 18:17:03.9799600``,
seven decimals of a second in 2023), read to the microsecond and made relative to the first row;
the lengths are tokens. The traces have no prefix blocks: every prompt is its own.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from specload.workload.traces.jsonrows import csv_rows
from specload.workload.traces.model import Trace, TraceError, TraceRequest, length, read_rows

FORMAT = "azure"
TIME_UNIT = "datetime"
COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MAX_SPAN_S = 31 * 86400.0  # the 2024 traces cover a week (May 10-19)


def epoch_seconds(source: str, row: int, text: str) -> float:
    """A ``YYYY-MM-DD HH:MM:SS[.fraction]`` date-time (any number of decimals; taken as UTC: only
    differences are used) in seconds since the epoch."""
    whole, _, frac = text.strip().partition(".")
    try:
        t = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
        if frac:
            if not frac.isdigit():
                raise ValueError(frac)
            t += int(frac[:9]) / 10 ** len(frac[:9])
    except ValueError:
        raise TraceError(
            f"{source}: row {row}: TIMESTAMP {text!r} is not a date-time like 2023-11-16 18:17:03.9799600"
        ) from None
    return t


def read(path: str | Path) -> Trace:
    source = str(path)

    def request(row: int, d: dict[str, str]) -> TraceRequest:
        return TraceRequest(
            row,
            epoch_seconds(source, row, d["TIMESTAMP"] or ""),
            length(source, row, "ContextTokens", d["ContextTokens"]),
            length(source, row, "GeneratedTokens", d["GeneratedTokens"]),
        )

    return read_rows(FORMAT, source, TIME_UNIT, 1.0, None, csv_rows(source, COLUMNS), request, MAX_SPAN_S)
