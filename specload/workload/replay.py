"""A trace replay: the scenario's trace read and cut to its window, and each request's due time.

The file is read once per process (``replay_of``, memoised by path, size and modification time)
and only by the sweep's owner: the owner hands each ticket its trace request with its due time
(``TicketReply.trace``), so workers need no copy of the file, and any number of processes keep
one schedule. What each request's prompt is: ``specload.workload.traceprompt``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from specload.workload.config import Scenario
from specload.workload.traces import Layout, Trace, TraceError, TraceRequest, read_trace
from specload.workload.traces.window import Window, cut, due_offsets, ideal_hit_rate

__all__ = ["Replay", "TraceError", "replay_of"]


@dataclass(frozen=True)
class Replay:
    """The part of a trace a run replays."""

    trace: Trace
    window: Window
    requests: tuple[TraceRequest, ...]  # the window's, in arrival order: ticket seq k sends requests[k]
    offsets: tuple[float, ...]  # seconds after the replay's start each is due (speed-up applied)

    @property
    def rate(self) -> float:
        """The window's mean requests/s as replayed (its requests over its span)."""
        span = self.offsets[-1] if self.offsets else 0.0
        return (len(self.requests) - 1) / span if span > 0 else float(len(self.requests))

    def describe(self) -> dict[str, Any]:
        """run.json ``trace``: what was replayed and what its numbers mean."""
        t, w = self.trace, self.window
        span = self.requests[-1].arrival_s - self.requests[0].arrival_s
        return {
            "file": os.path.basename(t.source),
            "format": t.format,
            "time_unit": t.time_unit,
            "block_size": t.block_size,
            "rows": t.rows,
            "requests_in_file": len(t.requests),
            "skipped": dict(t.skipped),
            "file_span_s": round(t.span_s, 6),
            "start_s": w.start_s,
            "duration_s": w.duration_s,
            "first_n": w.first_n,
            "speedup": w.speedup,
            "requests": len(self.requests),
            "first_index": min(r.index for r in self.requests),
            "last_index": max(r.index for r in self.requests),
            "window_span_s": round(span, 6),
            "replay_span_s": round(self.offsets[-1], 6),
            "input_tokens": sum(r.input_tokens for r in self.requests),
            "output_tokens": sum(r.output_tokens for r in self.requests),
            "ideal_hit_rate": ideal_hit_rate(self.requests, t.block_size),
        }


def layout_of(sc: Scenario) -> Layout | None:
    if sc.trace_format not in ("jsonl", "csv"):
        return None
    return Layout(
        sc.trace_time_unit or "",
        sc.trace_time_field,
        sc.trace_input_field,
        sc.trace_output_field,
        sc.trace_hash_field,
        sc.trace_block_size,
    )


_read: dict[tuple[Any, ...], Trace] = {}


def _trace(path: str, fmt: str, layout: Layout | None) -> Trace:
    try:
        st = os.stat(path)
    except OSError as e:
        raise TraceError(f"{path}: cannot read the trace file: {e.strerror or e}") from None
    key = (path, st.st_size, st.st_mtime_ns, fmt, layout)
    got = _read.get(key)
    if got is None:
        if len(_read) >= 4:
            _read.clear()
        got = _read[key] = read_trace(path, fmt, layout)
    return got


def replay_of(sc: Scenario) -> Replay | None:
    """The scenario's trace replay (None without ``--trace``); TraceError when the file cannot be
    replayed as declared."""
    if not sc.trace:
        return None
    assert sc.trace_format is not None
    trace = _trace(sc.trace, sc.trace_format, layout_of(sc))
    w = Window(sc.trace_start_s, sc.trace_duration_s, sc.trace_requests, sc.trace_speedup)
    reqs = cut(trace.requests, w, trace.source)
    return Replay(trace, w, reqs, due_offsets(reqs, w.speedup))
