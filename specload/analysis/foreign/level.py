"""One level of another tool's result, as specload's figures: ``ForeignLevel`` -> ``LevelStats``.

Each reader (vllm, sglang, guidellm, genai_bench) fills a ForeignLevel from its tool's file, from
the per-request values when the file has them (then the figure is specload's own definition
computed from the tool's timings) or else from the tool's own aggregates. How a figure's
definition differs from docs/metrics.md is said by the reader's ``Mark``s, never hidden here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from specload.analysis import figures
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
    """The LevelStats that the comparison reads, with only the figures the tool gave filled in: each
    figure of the figure table (analysis.figures) where the table reads it (a percentile into
    ``dists``, the acceptance length into ``acceptance``, any other into its field)."""
    s = LevelStats(
        f.concurrency, repeat, level_label(f.concurrency, repeat, f.rate), rate=f.rate, status="completed"
    )
    s.extra = dict(f.extra)
    for name in _FIELDS:
        v = getattr(f, name)
        fig = figures.BY_FIELD.get(name)
        if fig is not None and fig.dist is not None:
            if v is not None:
                dist, q, scale = fig.dist
                s.dists.setdefault(dist, Dist(n=1, exact=dist != "itl")).p[q] = v / scale
        elif name == "accept_length":
            s.acceptance = None if v is None else Acceptance(length=v)
        else:
            setattr(s, name, v)
    return s


# ForeignLevel's figures (every field but the level's coordinates and ``extra``).
_FIELDS = tuple(x.name for x in fields(ForeignLevel) if x.name not in ("concurrency", "rate", "extra"))


def repeats_in_order(levels: Sequence[ForeignLevel]) -> list[LevelStats]:
    """LevelStats of every level, a second result at the same level numbered as its repeat 1, 2, ..."""
    seen: dict[tuple[int, float | None], int] = {}
    out = []
    for f in levels:
        key = (f.concurrency, f.rate)
        out.append(level_stats(f, seen.get(key, 0)))
        seen[key] = seen.get(key, 0) + 1
    return out
