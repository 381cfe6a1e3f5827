"""Tables as text: any tabulate format for people, csv and json for machines.

``specload report`` and ``specload compare`` both print a table in whatever ``--format`` names;
this is the one place that dispatches on it, so the two commands accept the same formats and
treat a missing value the same way (``-`` in a table, an empty CSV cell, null or absent in JSON).
Cells arrive pre-formatted, so the rounding a caller chose is exactly what is printed.
What a terminal gets of a wide table (``render_view``: the columns specload.present.tableview keeps for its
width or ``--columns``, laid out compactly) is decided here too; files get ``render_table``'s whole.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tabulate as tabulate_module
from tabulate import tabulate, tabulate_formats

from specload.core.text import MISSING
from specload.present.tableview import TableView, choose, hidden_note

EXTRA_FORMATS = ("csv", "json")  # besides tabulate's own


def is_known_format(fmt: str) -> bool:
    return fmt in EXTRA_FORMATS or fmt in tabulate_formats


def check_format(fmt: str) -> None:
    """Raise ValueError naming the accepted formats when ``fmt`` is not one of them."""
    if not is_known_format(fmt):
        raise ValueError(f"unknown format {fmt!r}; use csv, json or one of: {', '.join(tabulate_formats)}")


def _csv(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(headers)
    for row in rows:
        w.writerow(["" if c == MISSING else c for c in row])  # CSV readers expect empty cells
    return buf.getvalue()


def render_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    fmt: str = "github",
    *,
    json_data: Callable[[], Any] | None = None,
    align_right: bool = True,
) -> str:
    """The table in ``fmt``: a tabulate format, ``csv`` (the same cells) or ``json``.

    Cells are normally strings, formatted by the caller; a non-string cell is left to tabulate
    (which right-aligns numbers while strings stay left-aligned unless ``align_right``).

    ``json_data`` gives what ``json`` prints: the unrounded data behind the cells, built only
    when asked for (without it: one object per row, header -> cell). ``align_right`` right-aligns
    every column (numbers line up whatever their width). Raises ValueError for an unknown format.
    """
    if fmt == "csv":
        return _csv(headers, rows)
    if fmt == "json":
        data = (
            json_data() if json_data is not None else [dict(zip(headers, row, strict=True)) for row in rows]
        )
        return json.dumps(data, indent=2) + "\n"
    check_format(fmt)
    extra: dict[str, Any] = {"colalign": ["right"] * len(headers)} if align_right else {}
    return tabulate(list(rows), headers=list(headers), tablefmt=fmt, disable_numparse=True, **extra)


@contextlib.contextmanager
def _compact() -> Iterator[None]:
    """tabulate without the two spaces it adds to every header's width (``| Agg tok/s |``, not
    ``|   Agg tok/s |``): some 40 characters of a terminal's width on the per-level table. tabulate
    has no argument for it, only this module constant; rendering never yields (no greenlet or
    thread sees the change)."""
    saved = tabulate_module.MIN_PADDING
    tabulate_module.MIN_PADDING = 0
    try:
        yield
    finally:
        tabulate_module.MIN_PADDING = saved


def _width(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def render_view(
    headers: Sequence[str],
    keys: Sequence[str],
    rows: Sequence[Sequence[Any]],
    fmt: str,
    view: TableView,
    kept_in: str,
    *,
    json_data: Callable[[], Any] | None = None,
) -> str:
    """The table as a terminal shows it: the columns ``view`` keeps (``keys``: each column's key in
    tableview.PRIORITY), compact, then one line naming the hidden ones and ``kept_in`` (the file
    that has them all). A whole view, csv and json get the whole table, as render_table makes it."""
    if view.whole or fmt in EXTRA_FORMATS:
        return render_table(headers, rows, fmt, json_data=json_data)

    def table(cols: Sequence[int]) -> str:
        return render_table([headers[i] for i in cols], [[row[i] for i in cols] for row in rows], fmt)

    with _compact():
        choice = choose(keys, view, lambda cols: _width(table(cols)))
        text = table(choice.shown)
    if choice.hidden:
        text += "\n\n" + hidden_note(choice.hidden, view.width, kept_in, choice.hidden_columns(len(headers)))
    return text
