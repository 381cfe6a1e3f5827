"""What a terminal shows of a wide table: the column priority, the named sets, and fitting to a width.

The per-level table has about 20 columns (some 250 characters) and ``compare``'s grows with every
run: printed whole, a terminal wraps it into an unreadable block. So the tables printed for people
(``specload sweep``, ``report``, ``demo``, ``compare``) show by default what fits the terminal,
choosing columns in the order of ``PRIORITY`` below (the one place that ranks them), and say in
one line what they hid; ``--columns`` picks sets or single columns instead. The files (report.md,
comparison.md) and the machine formats (csv, json) always keep every column.

Each table names its columns by the figure table's keys (analysis.figures: report.level_columns, compare's
table_columns): a key may cover several columns (compare's ``agg`` is every run's Agg tok/s and
each change), which are shown or hidden together.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specload.analysis.figures import FIGURES as ALL_FIGURES
from specload.analysis.figures import SETS, Figure

DEFAULT_WIDTH = 120  # when the output is not a terminal and COLUMNS is not set

AUTO = "auto"  # the default: by priority, what fits
ALL = "all"


# Most important first: by default a table shows the longest head of this ranking that fits the
# width (dropping from the tail until it fits), in the table's own column order. The ranks are the
# figure table's (specload.analysis.figures: the seed's columns and the acceptance length, then
# whether the level's requests came back whole, how it felt, the server's queue, then the rest).
# A key a table does not have (or a column no level has a value for) is skipped.
PRIORITY: tuple[Figure, ...] = tuple(
    sorted((f for f in ALL_FIGURES if f.rank is not None), key=lambda f: f.rank or 0)
)
FIGURES: dict[str, Figure] = {f.key: f for f in PRIORITY}
# compare's repeats to settle the signs of Δ agg and Δ per-req: a column of its own, not a figure,
# kept right after the per-request tok/s
SETTLE = "settle"
SETTLE_HEADER = "Repeats to settle"
RANK: dict[str, float] = {f.key: i for i, f in enumerate(PRIORITY)}
RANK[SETTLE] = RANK["per_req"] + 0.5
_TITLES = {SETTLE: SETTLE_HEADER}  # the names of the ranked columns that are no figure
AXES = ("rate", "c")  # a table's levels: in every set, always shown
ALWAYS_SHOWN = (*AXES, "agg")  # a table without these says nothing, whatever the width


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


_BY_NAME: dict[str, str] = {
    **{_norm(f.title): f.key for f in PRIORITY},
    **{_norm(f.key): f.key for f in PRIORITY},
}


def columns_help() -> str:
    """The ``--columns`` help text, the same for every command that prints a table."""
    sets = "; ".join(
        f"{s}: {', '.join(f.title for f in PRIORITY if s in f.sets and f.key not in AXES)}" for s in SETS
    )
    text = (
        f"columns of the table printed here: '{AUTO}' (default: the most important that fit the terminal's "
        f"width; not on a terminal: $COLUMNS, else {DEFAULT_WIDTH}), '{ALL}', sets ({sets}) or single columns "
        f"by name, combined with commas (e.g. seed,latency or seed,fail,srv_queue_max); the files and csv/json "
        f"keep every column"
    )
    return text.replace(
        "%", "%%"
    )  # argparse formats help with %: a column such as "Good %" would break --help


@dataclass(frozen=True)
class TableView:
    """How much of a table to print: ``keys`` chosen by ``--columns`` (exactly those), or, with
    ``keys`` None, the most important columns that fit ``width`` characters (None: no limit, the
    whole table)."""

    keys: frozenset[str] | None = None
    width: int | None = None

    @property
    def whole(self) -> bool:
        return self.keys is None and self.width is None


WHOLE = TableView()


def parse_columns(text: str) -> frozenset[str] | None:
    """A ``--columns`` value -> the keys it names; None for ``auto``. ValueError naming the accepted names."""
    keys: set[str] = set()
    words = [w.strip() for w in text.split(",") if w.strip()]
    for w in words:
        low = w.lower()
        if low == AUTO:
            if len(words) > 1:
                raise ValueError(f"--columns: '{AUTO}' goes alone (it is the default), got {text!r}")
            return None
        if low == ALL:
            keys.update(FIGURES)
        elif low in SETS:
            keys.update(f.key for f in PRIORITY if low in f.sets)
        elif _norm(w) in _BY_NAME:
            keys.add(_BY_NAME[_norm(w)])
        else:
            names = ", ".join(f.key for f in PRIORITY)
            raise ValueError(
                f"--columns: unknown column or set {w!r}; use {AUTO}, {ALL}, a set "
                f"({', '.join(SETS)}) or column names ({names}), separated by commas"
            )
    if not keys:
        raise ValueError(f"--columns: expected {AUTO}, {ALL}, a set or column names, got {text!r}")
    return frozenset(keys | set(AXES))


def terminal_width() -> int:
    """The width tables are fitted to: COLUMNS when set, else the terminal's (stdout), else DEFAULT_WIDTH."""
    return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns


def view_for(columns: str | None, width: int | None = None) -> TableView:
    """The view a command's ``--columns`` asks for; ``width`` defaults to the terminal's. ValueError
    for an unknown name (commands check it before any work)."""
    keys = parse_columns(columns) if columns else None
    return TableView(keys, None if keys is not None else (width if width is not None else terminal_width()))


@dataclass(frozen=True)
class Choice:
    """The columns to print (indices into the table's, in its order) and the titles of the figures
    hidden (one title for all the columns of a figure: compare's Agg tok/s of each run and its change)."""

    shown: tuple[int, ...]
    hidden: tuple[str, ...]

    def hidden_columns(self, n_columns: int) -> int:
        return n_columns - len(self.shown)


def choose(keys: Sequence[str], view: TableView, measure: Callable[[Sequence[int]], int]) -> Choice:
    """The columns ``view`` keeps of a table whose columns have these ``keys``.

    ``measure(indices)``: the printed width of the table with those columns (rendered, so that any
    format's borders and padding count). A key missing from PRIORITY (a figure added without a
    rank) comes after every ranked one, named by its key.
    """
    everything = tuple(range(len(keys)))
    if view.keys is not None:
        return Choice(tuple(i for i, k in enumerate(keys) if k in view.keys), ())
    if view.width is None:
        return Choice(everything, ())
    ranked = sorted(set(keys), key=lambda k: (RANK.get(k, len(RANK)), keys.index(k)))
    n = len(ranked)
    kept = set(ranked)
    # Drop the least important until it fits (never below the figures a table cannot do without).
    while n > 0 and measure([i for i, k in enumerate(keys) if k in kept]) > view.width:
        if ranked[n - 1] in ALWAYS_SHOWN:
            break
        n -= 1
        kept.discard(ranked[n])
    shown = tuple(i for i, k in enumerate(keys) if k in kept)
    hidden = tuple(
        FIGURES[k].title if k in FIGURES else _TITLES.get(k, k)
        for k in sorted(set(keys) - kept, key=keys.index)
    )
    return Choice(shown, hidden)


def hidden_note(hidden: Sequence[str], width: int | None, kept_in: str, n: int | None = None) -> str:
    """One line naming the hidden figures (``n`` columns in all; default: one each) and how to see
    them, cut (with "...") to ``width``."""
    n = len(hidden) if n is None else n
    head = f"{n} more column{'s' if n > 1 else ''} with --columns {ALL} (or in {kept_in}): "
    names = ", ".join(hidden)
    if width is None or len(head) + len(names) <= width:
        return head + names
    cut = names[: max(0, width - len(head) - 4)]
    cut = cut[: cut.rfind(",")] if "," in cut else ""
    return head + (cut + ", ..." if cut else "...")
