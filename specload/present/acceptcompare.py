"""The comparison's acceptance columns, cells, JSON and source lines, and its reasoning changes' JSON.

The figures come finished with the Comparison (``Comparison.accept``, ``accept_delta``: see
``specload.analysis.accept_compare``; the reasoning figures are the figure table's, combined over
repeats as every figure is); here they become the side-by-side table's columns (each run's figure,
then each treatment's change; a change column only where some level has one, a figure's columns
only where some run has it), the JSON of each run and change, and the lines naming each run's
acceptance sources. ``specload.present.compare`` calls these from its table, text and JSON, so the
terminal, comparison.md, its CSV and JSON and the HTML page all carry the same cells.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from specload.analysis.accept_compare import AcceptChange, AcceptFigures
from specload.analysis.comparison import ComparedRun, Comparison, change_pct
from specload.core.text import MISSING, fmt_num
from specload.present.acceptview import acceptance_notes


def _signed(v: float | None, digits: int) -> str:
    return MISSING if v is None else f"{v:+.{digits}f}"


def _joined(vs: Sequence[float | None], cell: Callable[[float | None], str], sep: str = "/") -> str:
    return sep.join(cell(v) for v in vs) if vs else MISSING


def _pct0(v: float | None) -> str:
    return fmt_num(None if v is None else v * 100.0, 0)


def _hist(vs: Sequence[float | None]) -> str:
    return (
        " ".join(f"{j}:{_pct0(v)}%" if v is not None else f"{j}:{MISSING}" for j, v in enumerate(vs))
        or MISSING
    )


def _hist_change(vs: Sequence[float | None]) -> str:
    return " ".join(f"{j}:{_signed(v, 0)}" for j, v in enumerate(vs)) or MISSING


class _Grid:
    """Every run's acceptance and every treatment's change, per level (Comparison.accept, accept_delta)."""

    def __init__(self, comp: Comparison) -> None:
        self.comp = comp
        self.accept, self.accept_delta = comp.accept, comp.accept_delta

    def any_accept(self, has: Callable[[AcceptFigures], object]) -> bool:
        return any(a is not None and has(a) for xs in self.accept.values() for a in xs)

    def any_change(self, has: Callable[[AcceptChange], object]) -> bool:
        return any(d is not None and has(d) for xs in self.accept_delta.values() for d in xs)


_RunCell = Callable[[AcceptFigures | None], str]
_ChangeCell = Callable[[AcceptChange | None], str]


def _accept_groups(g: _Grid) -> list[tuple[str, str, _RunCell | None, _ChangeCell | None]]:
    """(header, key, cell of a run's figures, cell of a treatment's change) of each column group shown."""
    groups: list[tuple[str, str, _RunCell | None, _ChangeCell | None]] = []
    if g.any_change(lambda d: d.length is not None):
        groups.append(("Δ accept len", "accept", None, lambda d: _signed(None if d is None else d.length, 2)))
    if g.any_change(lambda d: d.rate_pp is not None):
        groups.append(
            ("Δ accept rate pp", "accept_rate", None, lambda d: _signed(None if d is None else d.rate_pp, 1))
        )
    if g.any_accept(lambda a: a.per_position):
        groups.append(
            ("Accept >=k %", "accept_pos", lambda a: _joined(a.per_position, _pct0) if a else MISSING, None)
        )
    if g.any_change(lambda d: d.per_position_pp):
        groups.append(
            (
                "Δ accept >=k pp",
                "accept_pos",
                None,
                lambda d: _joined(d.per_position_pp, lambda v: _signed(v, 0)) if d else MISSING,
            )
        )
    if g.any_accept(lambda a: a.histogram):
        groups.append(("Accept hist %", "accept_hist", lambda a: _hist(a.histogram) if a else MISSING, None))
    if g.any_change(lambda d: d.histogram_pp):
        groups.append(
            (
                "Δ accept hist pp",
                "accept_hist",
                None,
                lambda d: _hist_change(d.histogram_pp) if d else MISSING,
            )
        )
    bucket = next((a.along_bucket for xs in g.accept.values() for a in xs if a is not None and a.along), None)
    if bucket is not None:
        groups.append(
            (
                f"Accept len per {bucket} tok",
                "accept_along",
                lambda a: _joined(a.along, lambda v: fmt_num(v, 2), " ") if a else MISSING,
                None,
            )
        )
    if g.any_change(lambda d: d.along):
        groups.append(
            (
                "Δ accept along",
                "accept_along",
                None,
                lambda d: _joined(d.along, lambda v: _signed(v, 2), " ") if d else MISSING,
            )
        )
    return groups


def extra_columns(comp: Comparison) -> list[tuple[str, str]]:
    """(header, tableview key) of the acceptance and reasoning columns, in order."""
    g = _Grid(comp)
    cols: list[tuple[str, str]] = []
    for head, key, run_cell, _ in _accept_groups(g):
        who = comp.runs if run_cell is not None else comp.treatments
        cols += [(f"{head} {r.label}", key) for r in who]
    return cols


def extra_rows(comp: Comparison) -> list[list[str]]:
    """Per level, the cells of ``extra_columns``."""
    g = _Grid(comp)
    rows: list[list[str]] = []
    for i in range(len(comp.levels)):
        row: list[str] = []
        for _, _, run_cell, change_cell in _accept_groups(g):
            if run_cell is not None:
                row += [run_cell(g.accept[r.label][i]) for r in comp.runs]
            elif change_cell is not None:
                row += [change_cell(g.accept_delta[t.label][i]) for t in comp.treatments]
        rows.append(row)
    return rows


def _asdict(x: Any) -> dict[str, Any] | None:
    return None if x is None else asdict(x)


def run_json(r: ComparedRun, c: float, comp: Comparison) -> dict[str, Any]:
    """A run's acceptance figures at level ``c``, for the comparison's JSON."""
    return {"acceptance": _asdict(comp.accept[r.label][comp.levels.index(c)])}


def change_json(comp: Comparison, t: ComparedRun, c: float) -> dict[str, Any]:
    """A treatment's acceptance changes at level ``c`` and its reasoning figures' changes (in %),
    for the comparison's JSON."""
    base, new = comp.baseline.figures[c], t.figures[c]
    return {
        "acceptance": _asdict(comp.accept_delta[t.label][comp.levels.index(c)]),
        "reasoning": {
            f"{k}_pct": change_pct(base.of(field), new.of(field)) for k, field in _REASONING.items()
        },
    }


# The reasoning figures whose changes compare's JSON gives (as ``<name>_pct``): name -> the table's field.
_REASONING = {
    "reasoning_tokens": "reasoning_tokens_mean",
    "answer_ttft_p50": "answer_ttft_p50_ms",
    "answer_tok_s": "answer_tok_s_mean",
    "agg_answer_tok_s": "agg_answer_tok_s",
}


def source_lines(comp: Comparison) -> list[str]:
    """Per run, where each acceptance figure came from and where its sources disagree ([] without any)."""
    return [f"{r.label}: {n}" for r in comp.runs for n in acceptance_notes(r.run.levels)]
