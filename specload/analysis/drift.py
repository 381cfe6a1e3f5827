"""Did a level's throughput drift within itself? ``drift_of(rates) -> Drift | None``.

A level is one stretch of time at one load, and its figures are averages over it. When the server
got faster or slower during that stretch (vLLM on CPU compiling for a new batch shape, a warm-up, a
neighbour on the machine), the average describes neither half, and a comparison of two such levels
compares the moments they were measured at. The flag compares the two halves of the level's steady
window with the noise of the level itself, so that it fires on a change of speed and not on the
ordinary wobble of tokens arriving in bursts. docs/metrics.md ("Drift within a level") defines it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specload.core.tdist import t_quantile_975

# The steady window is cut into this many equal segments (half of them in each half).
DRIFT_SEGMENTS = 8
# A drift smaller than this (percent) is not flagged, however steady the level: the changes a
# comparison reports are rounded to whole percents, and a few percent of drift changes none of them.
DRIFT_MIN_PCT = 5.0


@dataclass(frozen=True)
class Drift:
    """The second half of a level's steady window against its first (output tok/s)."""

    first_tok_s: float  # mean tok/s of the first half's segments
    second_tok_s: float  # ... of the second half's
    pct: float  # (second / first - 1) x 100
    threshold_pct: float  # how far it may go before it counts: max(DRIFT_MIN_PCT, the noise's 95% bound)
    noise_pct: float  # the segments' own standard deviation, relative to the first half (percent)
    segments: int  # segments used (both halves)

    @property
    def flagged(self) -> bool:
        """The level's throughput changed within it by more than its own noise allows."""
        return abs(self.pct) > self.threshold_pct

    def describe(self) -> str:
        """'+48% from its first half to its second (more than its noise allows: ±9%)'."""
        return (
            f"{self.pct:+.0f}% from the first half of its steady window to the second "
            f"({self.first_tok_s:.1f} to {self.second_tok_s:.1f} tok/s; its own noise allows ±{self.threshold_pct:.0f}%)"
        )


def drift_of(rates: Sequence[float]) -> Drift | None:
    """The drift of a level from its steady window's segment rates (tok/s, in time order).

    With k segments (an odd one in the middle is dropped), h = k/2 in each half: the change is
    mean(second half) / mean(first half) - 1. The segments' noise is estimated from the successive
    differences *within* each half only (von Neumann: s^2 = sum(d^2) / (2 m) over their m
    differences), so that the step or trend being tested barely inflates it. The change counts
    when |change| exceeds both DRIFT_MIN_PCT and t_{0.975, m} x s x sqrt(2 / h) / mean(first half).
    None with fewer than 3 segments per half or a first half without tokens.
    """
    k = len(rates)
    h = k // 2
    if h < 3:
        return None
    first, second = list(rates[:h]), list(rates[k - h :])
    m1, m2 = sum(first) / h, sum(second) / h
    if m1 <= 0:
        return None
    diffs = [b - a for half in (first, second) for a, b in zip(half, half[1:], strict=False)]
    s = math.sqrt(sum(d * d for d in diffs) / (2 * len(diffs)))
    bound = t_quantile_975(len(diffs)) * s * math.sqrt(2.0 / h) / m1 * 100.0
    return Drift(
        first_tok_s=m1,
        second_tok_s=m2,
        pct=(m2 / m1 - 1.0) * 100.0,
        threshold_pct=max(DRIFT_MIN_PCT, bound),
        noise_pct=s / m1 * 100.0,
        segments=2 * h,
    )
