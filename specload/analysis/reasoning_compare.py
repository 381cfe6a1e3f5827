"""A comparison's reasoning figures per level: each run's over its repeats, and each treatment's change.

The report's reasoning figures (``specload.analysis.reasoning``) that say what a user of a
reasoning model waits for: the time to the first answer token, the reasoning tokens before it and
the answer's decode rate. Repeats are combined by their mean and a change is the comparison's
``change_pct`` of those means, as for the other figures. docs/metrics.md, "Comparing runs".
"""

from __future__ import annotations

from dataclasses import dataclass

from specload.analysis.comparison import change_pct
from specload.analysis.metrics import RepeatedLevelStats, mean
from specload.analysis.reasoning import ReasoningStats


@dataclass
class ReasoningFigures:
    """One run's reasoning figures at one level, means over its repeats that streamed reasoning."""

    requests: int = 0  # Σ over the repeats
    reasoning_tokens_mean: float | None = None
    ttft_p50_ms: float | None = None
    answer_ttft_p50_ms: float | None = None
    answer_ttft_p99_ms: float | None = None
    answer_tok_s_mean: float | None = None
    agg_answer_tok_s: float | None = None


@dataclass
class ReasoningChange:
    """A treatment's change against the baseline, percent (None: either side lacks the figure)."""

    reasoning_tokens_pct: float | None = None
    answer_ttft_p50_pct: float | None = None
    answer_tok_s_pct: float | None = None
    agg_answer_tok_s_pct: float | None = None


def reasoning_figures(f: RepeatedLevelStats) -> ReasoningFigures | None:
    """The level's reasoning figures over its repeats; None when no repeat streamed reasoning."""
    rs: list[ReasoningStats] = [s.reasoning for s in f.levels if s.reasoning is not None]
    if not rs:
        return None
    return ReasoningFigures(
        requests=sum(r.requests for r in rs),
        reasoning_tokens_mean=mean(r.reasoning_tokens_mean for r in rs),
        ttft_p50_ms=mean(r.ttft_p50_ms for r in rs),
        answer_ttft_p50_ms=mean(r.answer_ttft_p50_ms for r in rs),
        answer_ttft_p99_ms=mean(r.answer_ttft_p99_ms for r in rs),
        answer_tok_s_mean=mean(r.answer_tok_s_mean for r in rs),
        agg_answer_tok_s=mean(r.agg_answer_tok_s for r in rs),
    )


def reasoning_change(base: ReasoningFigures | None, new: ReasoningFigures | None) -> ReasoningChange | None:
    if base is None or new is None:
        return None
    return ReasoningChange(
        change_pct(base.reasoning_tokens_mean, new.reasoning_tokens_mean),
        change_pct(base.answer_ttft_p50_ms, new.answer_ttft_p50_ms),
        change_pct(base.answer_tok_s_mean, new.answer_tok_s_mean),
        change_pct(base.agg_answer_tok_s, new.agg_answer_tok_s),
    )
