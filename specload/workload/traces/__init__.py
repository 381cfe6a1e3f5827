"""Production request traces: readers with explicit units (``read_trace``), the replay window and the
trace's own shape (``window``)."""

from __future__ import annotations

from pathlib import Path

from specload.workload.traces import azure, burstgpt, generic, mooncake
from specload.workload.traces.generic import Layout
from specload.workload.traces.model import UNITS, Trace, TraceError, TraceRequest

MOONCAKE, AZURE, BURSTGPT, JSONL, CSV = "mooncake", "azure", "burstgpt", generic.JSONL, generic.CSV
FORMATS = (MOONCAKE, AZURE, BURSTGPT, JSONL, CSV)

__all__ = ["FORMATS", "UNITS", "Layout", "Trace", "TraceError", "TraceRequest", "read_trace"]


def read_trace(path: str | Path, fmt: str, layout: Layout | None = None) -> Trace:
    """The trace file read as ``fmt``: its own reader's units, or ``layout``'s declarations (jsonl, csv)."""
    if fmt == MOONCAKE:
        return mooncake.read(path)
    if fmt == AZURE:
        return azure.read(path)
    if fmt == BURSTGPT:
        return burstgpt.read(path)
    if fmt in (JSONL, CSV):
        if layout is None:
            raise TraceError(
                f"{path}: a generic {fmt} trace needs its layout declared (--trace-time-unit, ...)"
            )
        return generic.read(path, fmt, layout)
    raise TraceError(f"{path}: unknown trace format {fmt!r} (one of {', '.join(FORMATS)})")
