"""Speculation's change per prompt category: the answer for a mixed workload.

A categorised dataset (SPEED-Bench's rows, ``specload.workload.datasets``) gives every record its
row's category, and ``mixstats`` gives each level one ``GroupStats`` per category (its accept
length, its per-request and aggregate tok/s). Here a comparison's runs are lined up per category
and level: the change of each treatment against the baseline, with the comparison's own arithmetic
(``comparison.change_of``, ``crossover``, ``crossover_sentence``) and the level's comparability,
so that a category whose speedup ends at a lower concurrency than the mix's says so.
docs/metrics.md, "Prompt categories".
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from specload.analysis.comparison import (
    Change,
    Comparison,
    Crossover,
    change_of,
    crossover,
    crossover_sentence,
)
from specload.analysis.metrics import RepeatedLevelStats, mean
from specload.analysis.mixstats import GroupStats


def _groups(f: RepeatedLevelStats, category: str) -> list[GroupStats]:
    """The category's figures in each repeat of one level."""
    return [g for s in f.levels if s.mix is not None for g in s.mix.categories if g.key == category]


def _values(groups: list[GroupStats], attr: str) -> list[float]:
    return [v for v in (getattr(g, attr) for g in groups) if v is not None]


@dataclass
class CategoryFigures:
    """One run's figures of one category at one level, over its repeats (means)."""

    sent: int = 0
    agg_tok_s: float | None = None
    per_req_tok_s: float | None = None
    accept_length: float | None = None
    agg_values: list[float] = field(default_factory=list)
    per_req_values: list[float] = field(default_factory=list)


def category_figures(f: RepeatedLevelStats, category: str) -> CategoryFigures:
    gs = _groups(f, category)
    agg, per = _values(gs, "agg_tok_s"), _values(gs, "per_req_tok_s")
    return CategoryFigures(
        sum(g.sent for g in gs), mean(agg), mean(per), mean(_values(gs, "accept_length")), agg, per
    )


@dataclass
class CategoryComparison:
    """One category across the comparison: per run and level its figures, per treatment its changes."""

    category: str
    figures: dict[str, list[CategoryFigures]]  # run label -> per level of the comparison
    agg: dict[str, list[Change]]  # treatment label -> change of the category's Agg tok/s per level
    per_req: dict[str, list[Change]]
    crossovers_agg: dict[str, list[Crossover]]
    crossovers_per_req: dict[str, list[Crossover]]
    sentences: list[str]


def categories(comp: Comparison) -> list[str]:
    """Every category some run has at some level, sorted."""
    return sorted(
        {
            str(g.key)
            for r in comp.runs
            for f in r.figures.values()
            for s in f.levels
            if s.mix is not None
            for g in s.mix.categories
        }
    )


def _change(b: CategoryFigures, n: CategoryFigures, attr: str, comparable: bool) -> Change:
    ch = change_of(
        getattr(b, f"{attr}_values"),
        getattr(n, f"{attr}_values"),
        getattr(b, f"{attr}_tok_s"),
        getattr(n, f"{attr}_tok_s"),
    )
    return ch if comparable else replace(ch, comparable=False)


def compare_categories(comp: Comparison) -> list[CategoryComparison]:
    """Each category's changes and verdict; [] when no run has categories."""
    out = []
    for cat in categories(comp):
        figs = {r.label: [category_figures(r.figures[c], cat) for c in comp.levels] for r in comp.runs}
        base = figs[comp.baseline.label]
        cc = CategoryComparison(cat, figs, {}, {}, {}, {}, [])
        for t in comp.treatments:
            ok = [k.comparable for k in comp.checks[t.label]]
            new = figs[t.label]
            cc.agg[t.label] = [_change(b, n, "agg", k) for b, n, k in zip(base, new, ok, strict=True)]
            cc.per_req[t.label] = [_change(b, n, "per_req", k) for b, n, k in zip(base, new, ok, strict=True)]
            cc.crossovers_agg[t.label] = crossover(comp.levels, cc.agg[t.label])
            cc.crossovers_per_req[t.label] = crossover(comp.levels, cc.per_req[t.label])
            cc.sentences.append(
                crossover_sentence(
                    f"{t.label} on {cat} prompts",
                    comp.levels,
                    cc.agg[t.label],
                    cc.per_req[t.label],
                    axis=comp.axis,
                )
            )
        out.append(cc)
    return out
