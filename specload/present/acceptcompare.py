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
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from specload.analysis.accept_compare import AcceptChange, AcceptFigures
from specload.analysis.comparison import ComparedRun, Comparison
from specload.core.text import MISSING, fmt_num
from specload.present.acceptview import acceptance_notes


def _signed(digits: int) -> Callable[[float | None], str]:
    return lambda v: MISSING if v is None else f"{v:+.{digits}f}"


def _each(cell: Callable[[float | None], str], sep: str = "/") -> Callable[[Sequence[float | None]], str]:
    return lambda vs: sep.join(cell(v) for v in vs) if vs else MISSING


def _pct0(v: float | None) -> str:
    return fmt_num(None if v is None else v * 100.0, 0)


def _hist(vs: Sequence[float | None]) -> str:
    return (
        " ".join(f"{j}:{_pct0(v)}%" if v is not None else f"{j}:{MISSING}" for j, v in enumerate(vs))
        or MISSING
    )


def _hist_change(vs: Sequence[float | None]) -> str:
    return " ".join(f"{j}:{_signed(0)(v)}" for j, v in enumerate(vs)) or MISSING


# The acceptance column groups, in order: header ({bucket}: the along-the-output bucket), tableview
# key, whether it is a change (AcceptChange, per treatment) or a figure (AcceptFigures, per run), its
# field there and its cell. A group is shown where some level has a value.
_COLUMNS: tuple[tuple[str, str, bool, str, Callable[[Any], str]], ...] = (
    ("Δ accept len", "accept", True, "length", _signed(2)),
    ("Δ accept rate pp", "accept_rate", True, "rate_pp", _signed(1)),
    ("Accept >=k %", "accept_pos", False, "per_position", _each(_pct0)),
    ("Δ accept >=k pp", "accept_pos", True, "per_position_pp", _each(_signed(0))),
    ("Accept hist %", "accept_hist", False, "histogram", _hist),
    ("Δ accept hist pp", "accept_hist", True, "histogram_pp", _hist_change),
    ("Accept len per {bucket} tok", "accept_along", False, "along", _each(lambda v: fmt_num(v, 2), " ")),
    ("Δ accept along", "accept_along", True, "along", _each(_signed(2), " ")),
)


@dataclass(frozen=True)
class Group:
    """A column group of compare's table: a figure's cell for each run (``run``) or a change's for
    each treatment (``change``), given the run and the level's index. Laid out wide (a column per
    run or treatment, headed ``header label``) or long (one column, a row per run)."""

    header: str
    key: str  # its key in tableview's ranking
    run: Callable[[ComparedRun, int], str] | None = None
    change: Callable[[ComparedRun, int], str] | None = None


def _cell(
    grid: dict[str, list[AcceptFigures | None]] | dict[str, list[AcceptChange | None]],
    name: str,
    cell: Callable[[Any], str],
    r: ComparedRun,
    i: int,
) -> str:
    x = grid[r.label][i]
    return MISSING if x is None else cell(getattr(x, name))


def accept_groups(comp: Comparison) -> list[Group]:
    """The acceptance columns' groups (Comparison.accept, accept_delta), in order."""
    bucket = next(
        (a.along_bucket for xs in comp.accept.values() for a in xs if a is not None and a.along), None
    )
    out = []
    for head, key, delta, name, cell in _COLUMNS:
        grid = comp.accept_delta if delta else comp.accept
        values = [getattr(x, name) for xs in grid.values() for x in xs if x is not None]
        if all(v is None or v == [] for v in values):
            continue
        at = partial(_cell, grid, name, cell)
        out.append(
            Group(head.format(bucket=bucket), key, change=at)
            if delta
            else Group(head.format(bucket=bucket), key, run=at)
        )
    return out


def _asdict(x: Any) -> dict[str, Any] | None:
    return None if x is None else asdict(x)


def run_json(r: ComparedRun, c: float, comp: Comparison) -> dict[str, Any]:
    """A run's acceptance figures at level ``c``, for the comparison's JSON."""
    return {"acceptance": _asdict(comp.accept[r.label][comp.levels.index(c)])}


def change_json(comp: Comparison, t: ComparedRun, c: float) -> dict[str, Any]:
    """A treatment's acceptance changes at level ``c`` and its reasoning figures' changes (in %),
    for the comparison's JSON."""
    i = comp.levels.index(c)
    changes = comp.changes[t.label]
    return {
        "acceptance": _asdict(comp.accept_delta[t.label][i]),
        "reasoning": {
            f"{name}_pct": chs[i].pct if (chs := changes.get(key)) else None
            for name, key in _REASONING.items()
        },
    }


# The reasoning figures whose changes compare's JSON gives (as ``<name>_pct``): name -> the table's key.
_REASONING = {
    "reasoning_tokens": "reasoning_tokens",
    "answer_ttft_p50": "first_answer",
    "answer_tok_s": "answer_tok_s",
    "agg_answer_tok_s": "agg_answer",
}


def source_lines(comp: Comparison) -> list[str]:
    """Per run, where each acceptance figure came from and where its sources disagree ([] without any)."""
    return [f"{r.label}: {n}" for r in comp.runs for n in acceptance_notes(r.run.levels)]
