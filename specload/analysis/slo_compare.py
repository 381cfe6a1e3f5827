"""Runs side by side under one SLO: capacities, why each stops, and the per-user vs aggregate
trade-off (the Pareto picture). Pure: ``specload.analysis.comparison`` calls ``compare_slo`` with its runs
and keeps the result on the Comparison, so the text, the JSON and the plots show the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specload.analysis.capacity import Capacity, compare_sentence, limit_reason
from specload.analysis.metrics import LevelStats, RepeatedLevelStats, mean
from specload.analysis.run import Run
from specload.core.slo import Slo, Target


@dataclass(frozen=True)
class ParetoPoint:
    """One level of one run in the trade-off picture."""

    x: float  # the level: concurrency C (or a rate)
    agg_tok_s: float  # aggregate output tok/s (the x axis)
    user_tok_s: float  # per-user decode tok/s: 1 / the level's TPOT statistic (the y axis)
    met: bool | None  # the level met the SLO (None: no SLO)


@dataclass
class SloComparison:
    """What the comparison says under its SLO, and the trade-off picture's points."""

    slo: Slo | None  # the one SLO every run was judged against; None: none, or they differ
    capacities: dict[str, Capacity | None] = field(default_factory=dict)  # by run label
    reasons: dict[str, str | None] = field(default_factory=dict)  # why each run fails where it does
    sentences: list[str] = field(default_factory=list)  # one per treatment
    pareto: dict[str, list[ParetoPoint]] = field(default_factory=dict)  # by run label
    user_stat: str = "TPOT p50"  # which TPOT the per-user tok/s is 1 / of
    floor_tok_s: float | None = None  # the per-user floor the SLO's TPOT target implies
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "slo": self.slo.text if self.slo is not None else None,
            "capacities": {k: (c.to_json() if c is not None else None) for k, c in self.capacities.items()},
            "reasons": self.reasons,
            "sentences": self.sentences,
            "pareto": {k: [p.__dict__ for p in pts] for k, pts in self.pareto.items()},
            "user_stat": self.user_stat,
            "floor_tok_s": self.floor_tok_s,
        }


def level_met(f: RepeatedLevelStats) -> bool | None:
    """The concurrency met the SLO: every repeat with a verdict did (None: none has one)."""
    verdicts = [s.slo.met for s in f.levels if s.slo is not None and s.slo.met is not None]
    return all(verdicts) if verdicts else None


def _tpot_stat(s: LevelStats, target: Target | None) -> float | None:
    d = s.dists.get("tpot")
    if d is None or not d.n:
        return None
    if target is None:
        return d.p.get(50.0)
    return d.mean if target.q is None else d.p.get(target.q)


def user_tok_s(levels: Sequence[LevelStats], target: Target | None) -> float | None:
    """Per-user decode speed: 1 / TPOT (at the SLO's TPOT statistic, else its median), mean over repeats.

    The TPOT target's own statistic, so that a point lies above the SLO's floor (1 / threshold)
    exactly when the level met that target."""
    return mean(1.0 / v for s in levels if (v := _tpot_stat(s, target)) is not None and v > 0)


def _common_slo(runs: Sequence[Run]) -> tuple[Slo | None, list[str]]:
    texts = [r.slo.text if r.slo is not None else None for r in runs]
    if len(set(texts)) <= 1:
        return runs[0].slo, []
    shown = ", ".join(f"{r.label} {t or 'none'}" for r, t in zip(runs, texts, strict=True))
    return None, [
        f"the runs were judged against different SLOs ({shown}): no capacity comparison; "
        "`specload compare --slo ...` judges all against one"
    ]


def compare_slo(
    runs: Sequence[tuple[str, Run, dict[float, RepeatedLevelStats]]], unlike: Sequence[str] = ()
) -> SloComparison:
    """``runs``: (label, run, figures by concurrency), the baseline first; ``unlike``: the comparison's
    notes that call the runs not like for like (then each capacity is stated, no change between them)."""
    slo, notes = _common_slo([r for _, r, _ in runs])
    tpot = slo.target("tpot") if slo is not None else None
    out = SloComparison(slo, notes=notes)
    out.user_stat = tpot.label if tpot is not None else "TPOT p50"
    out.floor_tok_s = 1.0 / tpot.threshold_s if tpot is not None else None
    for label, run, figures in runs:
        pts = []
        for c in sorted(figures):
            f = figures[c]
            y = user_tok_s(f.levels, tpot)
            if (agg := f.of("agg_tok_s")) is not None and y is not None:
                pts.append(ParetoPoint(c, agg, y, level_met(f) if slo is not None else None))
        out.pareto[label] = pts
        if slo is not None:
            cap = run.capacity()
            out.capacities[label] = cap
            out.reasons[label] = limit_reason(cap, run.limits_at(cap.hi)) if cap is not None else None
    if slo is None:
        return out
    base_label = runs[0][0]
    base = out.capacities.get(base_label)
    for label, _, _ in runs[1:]:
        treat = out.capacities.get(label)
        if base is not None and treat is not None:
            why = {base_label: out.reasons.get(base_label), label: out.reasons.get(label)}
            out.sentences.append(
                compare_sentence(base_label, base, label, treat, why, "; ".join(unlike) or None)
            )
    return out
