"""What part of a trace is replayed and when each request is due; the trace's own prefix sharing.

A window is cut in the trace's own time (``start_s``, ``duration_s``, then the first ``first_n``
requests), and replayed from its first request: request k is due ``(arrival_k - arrival_0) /
speedup`` seconds after the replay starts. The ideal prefix-cache hit rate is what a cache that
never evicts would serve of the window's prompt tokens, replayed in order: each request's leading
blocks whose ids were already seen (a prefix cache serves a prefix, so the first unseen block
ends it), with the last block counted at its true length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specload.workload.traces.model import TraceError, TraceRequest


@dataclass(frozen=True)
class Window:
    start_s: float = 0.0
    duration_s: float | None = None
    first_n: int | None = None
    speedup: float = 1.0


def cut(requests: Sequence[TraceRequest], w: Window, source: str = "trace") -> tuple[TraceRequest, ...]:
    """The window's requests, in arrival order."""
    end = None if w.duration_s is None else w.start_s + w.duration_s
    out = [r for r in requests if r.arrival_s >= w.start_s and (end is None or r.arrival_s < end)]
    if w.first_n is not None:
        out = out[: w.first_n]
    if not out:
        last = requests[-1].arrival_s if requests else 0.0
        raise TraceError(
            f"{source}: no request in the window (start {w.start_s:g} s, duration "
            f"{'to the end' if w.duration_s is None else f'{w.duration_s:g} s'}); the trace spans 0 to {last:g} s"
        )
    return tuple(out)


def due_offsets(requests: Sequence[TraceRequest], speedup: float = 1.0) -> tuple[float, ...]:
    """Each request's due time in seconds after the replay's start (the first is due at 0)."""
    if not requests:
        return ()
    t0 = requests[0].arrival_s
    return tuple((r.arrival_s - t0) / speedup for r in requests)


def prefix_blocks_seen(requests: Sequence[TraceRequest], block_size: int) -> list[int]:
    """Per request, the prompt tokens of its leading blocks already seen in an earlier request."""
    seen: set[int] = set()
    out: list[int] = []
    for r in requests:
        hit, leading = 0, True
        for i, h in enumerate(r.hash_ids):
            block = max(0, min(block_size, r.input_tokens - i * block_size))
            if leading and h in seen:
                hit += block
            else:
                leading = False
            seen.add(h)
        out.append(hit)
    return out


def ideal_hit_rate(requests: Sequence[TraceRequest], block_size: int | None) -> float | None:
    """The share of the prompt tokens an unbounded prefix cache would serve; None without blocks."""
    if not block_size or not any(r.hash_ids for r in requests):
        return None
    total = sum(r.input_tokens for r in requests)
    return sum(prefix_blocks_seen(requests, block_size)) / total if total else None
