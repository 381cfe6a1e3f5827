"""A comparison's acceptance figures per level: each run's over its repeats, and each treatment's change.

``specload compare`` shows per level the figures a report shows (``specload.analysis.acceptance``):
the rate, the share accepting at least k per draft position, the histogram of accepted tokens per
step and the acceptance length along the output. Repeats of a level are combined by their mean, as
the comparison's other figures are (a histogram as the mean of each repeat's shares, so that a
repeat of more steps does not outweigh the others). A change is the treatment's figure minus the
baseline's in the figure's own unit: percentage points for a share, tokens per step for a length,
since a relative change of a share near 0 says little. docs/metrics.md, "Comparing runs".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from specload.analysis.acceptance import Acceptance
from specload.analysis.metrics import RepeatedLevelStats, mean


@dataclass
class AcceptFigures:
    """One run's acceptance figures at one level, over its repeats (None / empty: no repeat has it)."""

    length: float | None = None
    rate: float | None = None  # accepted / drafted
    per_position: list[float | None] = field(default_factory=list)  # k = 1..K: share of steps accepting >= k
    histogram: list[float | None] = field(default_factory=list)  # j: share of steps accepting exactly j
    along: list[float | None] = field(default_factory=list)  # length per along_bucket output positions
    along_bucket: int | None = None
    sources: dict[str, str] = field(default_factory=dict)  # figure -> sources (acceptance.sources), joined


@dataclass
class AcceptChange:
    """A treatment's acceptance figures minus the baseline's at one level (None: either side lacks it)."""

    length: float | None = None  # tokens per step
    rate_pp: float | None = None  # percentage points
    per_position_pp: list[float | None] = field(default_factory=list)
    histogram_pp: list[float | None] = field(default_factory=list)
    along: list[float | None] = field(default_factory=list)  # tokens per step, per bucket


def _elementwise_mean(rows: Sequence[Sequence[float | None]]) -> list[float | None]:
    """Position i: the mean of the rows' values at i (rows may differ in length; None is no value)."""
    n = max((len(r) for r in rows), default=0)
    return [mean(r[i] for r in rows if i < len(r)) for i in range(n)]


def _shares(hist: Sequence[int]) -> list[float | None]:
    total = sum(hist)
    return [h / total for h in hist] if total else []


def accept_figures(f: RepeatedLevelStats) -> AcceptFigures | None:
    """The level's acceptance figures over its repeats; None when no repeat has any."""
    acs: list[Acceptance] = [s.acceptance for s in f.levels if s.acceptance is not None]
    if not acs:
        return None
    sources: dict[str, set[str]] = {}
    for a in acs:
        for figure, source in a.sources.items():
            sources.setdefault(figure, set()).update(source.split(" + "))
    return AcceptFigures(
        length=mean(a.length for a in acs),
        rate=mean(a.rate for a in acs),
        per_position=_elementwise_mean([list(a.per_position) for a in acs if a.per_position]),
        histogram=_elementwise_mean([_shares(a.histogram) for a in acs if sum(a.histogram)]),
        along=_elementwise_mean([a.along for a in acs if a.along]),
        along_bucket=next((a.along_bucket for a in acs if a.along), None),
        sources={k: " + ".join(sorted(v)) for k, v in sources.items()},
    )


def _minus(b: float | None, n: float | None, scale: float = 1.0) -> float | None:
    return None if b is None or n is None else (n - b) * scale


def _minus_each(
    b: Sequence[float | None], n: Sequence[float | None], scale: float = 1.0
) -> list[float | None]:
    """Element by element, over the positions both have (a longer side's extra positions: None)."""
    if not b or not n:
        return []
    return [
        _minus(b[i] if i < len(b) else None, n[i] if i < len(n) else None, scale)
        for i in range(max(len(b), len(n)))
    ]


def accept_change(base: AcceptFigures | None, new: AcceptFigures | None) -> AcceptChange | None:
    """``new`` minus ``base``; None when either has no acceptance (a baseline without speculation)."""
    if base is None or new is None:
        return None
    along = _minus_each(base.along, new.along) if base.along_bucket == new.along_bucket else []
    return AcceptChange(
        length=_minus(base.length, new.length),
        rate_pp=_minus(base.rate, new.rate, 100.0),
        per_position_pp=_minus_each(base.per_position, new.per_position, 100.0),
        histogram_pp=_minus_each(base.histogram, new.histogram, 100.0),
        along=along,
    )
