"""One level of another tool's result, as specload's figures: ``ForeignLevel`` -> ``LevelStats``.

Each reader (vllm, sglang, guidellm, genai_bench) fills a ForeignLevel from its tool's file, from
the per-request values when the file has them (then the figure is specload's own definition
computed from the tool's timings) or else from the tool's own aggregates. How a figure's
definition differs from docs/metrics.md is said by the reader's ``Mark``s, never hidden here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specload.analysis.acceptance import Acceptance
from specload.analysis.metrics import Dist, LevelStats
from specload.core.records import level_label


@dataclass(frozen=True)
class ForeignLevel:
    """The figures of one level that a foreign result gives (None: the tool does not say)."""

    concurrency: int  # the level's concurrency (max_concurrency, streams, num_concurrency)
    rate: float | None = None  # requests/s for an open-loop level (None: a concurrency level)
    sent: int = 0
    ok: int = 0
    failed: int = 0
    output_tokens: int = 0
    wall_s: float | None = None
    agg_tok_s: float | None = None
    per_req_tok_s: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    e2e_p50_s: float | None = None
    e2e_p99_s: float | None = None
    req_s: float | None = None
    accept_length: float | None = None
    requested_output_tokens: int | None = None
    extra: dict[str, float] = field(default_factory=dict)


def pct(values: Sequence[float], q: float) -> float | None:
    """numpy's linear percentile (as docs/metrics.md's percentiles, and as vLLM and SGLang); None when empty."""
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else None


def mean_of(values: Sequence[float]) -> float | None:
    return float(np.mean(np.asarray(values, dtype=float))) if len(values) else None


def ms(v: float | None) -> float | None:
    return None if v is None else v * 1e3


def per_request_tok_s(tokens: Sequence[int], e2e_s: Sequence[float]) -> float | None:
    """Per-req tok/s of docs/metrics.md: mean over OK requests of output_tokens / e2e."""
    rates = [n / e for n, e in zip(tokens, e2e_s, strict=True) if e > 0]
    return mean_of(rates)


def level_stats(f: ForeignLevel, repeat: int = 0) -> LevelStats:
    """The LevelStats that the comparison reads, with only the figures the tool gave filled in."""
    dists = {
        name: Dist(n=1, p={q: v / div for q, v in ((50.0, p50), (99.0, p99)) if v is not None}, exact=exact)
        for name, p50, p99, div, exact in (
            ("ttft", f.ttft_p50_ms, f.ttft_p99_ms, 1e3, True),
            ("tpot", f.tpot_p50_ms, f.tpot_p99_ms, 1e3, True),
            ("e2e", f.e2e_p50_s, f.e2e_p99_s, 1.0, True),
            ("itl", None, f.itl_p99_ms, 1e3, False),
        )
        if p50 is not None or p99 is not None
    }  # the percentiles the tool gave (LevelStats reads its p50/p99 from these)
    return LevelStats(
        concurrency=f.concurrency,
        repeat=repeat,
        label=level_label(f.concurrency, repeat, f.rate),
        status="completed",
        sent=f.sent,
        ok=f.ok,
        failed=f.failed,
        output_tokens=f.output_tokens,
        wall_s=f.wall_s,
        agg_tok_s=f.agg_tok_s,
        per_req_tok_s=f.per_req_tok_s,
        req_s=f.req_s,
        acceptance=None if f.accept_length is None else Acceptance(length=f.accept_length),
        requested_output_tokens=f.requested_output_tokens,
        rate=f.rate,
        dists=dists,
        extra=dict(f.extra),
    )


def repeats_in_order(levels: Sequence[ForeignLevel]) -> list[LevelStats]:
    """LevelStats of every level, a second result at the same level numbered as its repeat 1, 2, ..."""
    seen: dict[tuple[int, float | None], int] = {}
    out = []
    for f in levels:
        key = (f.concurrency, f.rate)
        out.append(level_stats(f, seen.get(key, 0)))
        seen[key] = seen.get(key, 0) + 1
    return out
