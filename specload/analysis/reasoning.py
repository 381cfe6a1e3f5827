"""A level's reasoning streams: how long the answer waited behind the reasoning, and how fast it came.

A reasoning model streams its reasoning (chat deltas with ``reasoning`` / ``reasoning_content``)
before its answer. TTFT stays the first token of any kind; the user waits for the answer's first
token, and the answer's rate is what they read at. The records of such streams carry
``t_first_answer``, ``reasoning_tokens`` and its source (``specload.client.backends.chat``,
``client.stream``). Pure functions over a level's columns, called once per level by
``metrics.summarize``; the definitions are in docs/metrics.md, "Reasoning streams".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specload.analysis.columns import LevelColumns
from specload.core.records import OK
from specload.core.stats import percentiles


@dataclass
class ReasoningStats:
    """The reasoning streams of one level (its OK requests that streamed reasoning)."""

    requests: int = 0  # OK requests with reasoning
    reasoning_tokens: int = 0  # Σ reasoning tokens of those
    reasoning_tokens_mean: float | None = None
    reasoning_share: float | None = None  # Σ reasoning tokens / Σ output tokens, over those requests
    sources: tuple[str, ...] = ()  # where the counts came from: "usage" (the server's), "chunks" (counted)
    ttft_p50_ms: float | None = None  # first token of any kind, over those requests
    ttft_p99_ms: float | None = None
    answer_ttft_p50_ms: float | None = None  # first answer token, over those with an answer
    answer_ttft_p99_ms: float | None = None
    answer_tok_s_mean: float | None = None  # mean of (answer tokens - 1) / (t_last - t_first_answer)
    agg_answer_tok_s: float | None = None  # (Σ output - Σ reasoning tokens) of every measured request / wall


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


def reasoning_stats(c: LevelColumns, wall: float | None) -> ReasoningStats | None:
    """The level's reasoning figures; None when no request of it streamed reasoning."""
    reasoning = c.col("reasoning")
    has = ~np.isnan(reasoning)
    if not has.any():
        return None
    ok = c.is_label("status", OK) & has
    tokens, t_send = c.col("tokens"), c.col("t_send")
    r = ReasoningStats(requests=int(ok.sum()))
    r.sources = tuple(sorted(str(v) for v in c.labels["reasoning_source"] if v is not None))
    all_reasoning = float(reasoning[has].sum())
    if wall:
        r.agg_answer_tok_s = (float(np.maximum(tokens, 0).sum()) - all_reasoning) / wall
    if not r.requests:
        return r
    rs, out = reasoning[ok], tokens[ok]
    r.reasoning_tokens = int(rs.sum())
    r.reasoning_tokens_mean = float(rs.mean())
    r.reasoning_share = float(rs.sum()) / float(out.sum()) if out.sum() > 0 else None
    r.ttft_p50_ms, r.ttft_p99_ms = map(_ms, percentiles(c.present("ttft", ok), (50.0, 99.0)))
    t_answer = c.col("t_answer")
    answered = ok & ~np.isnan(t_answer)
    r.answer_ttft_p50_ms, r.answer_ttft_p99_ms = map(
        _ms, percentiles((t_answer - t_send)[answered], (50.0, 99.0))
    )
    span = c.col("t_last") - t_answer
    after = tokens - reasoning - 1.0
    usable = answered & (after >= 1) & (span > 0)
    if usable.any():
        r.answer_tok_s_mean = float((after[usable] / span[usable]).mean())
    return r
