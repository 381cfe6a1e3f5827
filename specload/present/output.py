"""Tables as text: any tabulate format for people, and a registry of the other formats (csv, json).

``specload report`` and ``specload compare`` both print a table in whatever ``--format`` names;
this is the one place that dispatches on it, so the two commands accept the same formats and
treat a missing value the same way (``-`` in a table, an empty CSV cell, null or absent in JSON).
Cells arrive pre-formatted, so the rounding a caller chose is exactly what is printed.
What a terminal gets of a wide table (``render_view``: the columns specload.present.tableview keeps for its
width or ``--columns``, laid out compactly) is decided here too; files get ``render_table``'s whole.

A format that is not tabulate's is one ``register(name, function)`` call (CONTRIBUTING.md, "Add an
output format"): the function turns a ``Table`` into text. A *document* format (csv, json) is the
whole output, so that it parses: ``report`` and ``compare`` print only the per-level or side-by-side
table in it, every column, and their header and notes on stderr. A format registered with
``document=False`` renders each table inside the usual text instead, as a tabulate format does.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import textwrap
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import tabulate as tabulate_module
from tabulate import tabulate, tabulate_formats

from specload.core.text import MISSING
from specload.present.tableview import TableView, choose, hidden_note


@dataclass(frozen=True)
class Table:
    """One table as a format receives it: the header, the cells as the caller formatted them, and
    (for formats that carry numbers, not words) the unrounded data behind them."""

    headers: Sequence[str]
    rows: Sequence[Sequence[Any]]
    json_data: Callable[[], Any] | None = None

    def data(self) -> Any:
        """The caller's unrounded data (built only now: it can cost more than the cells), else one
        object per row, header -> cell."""
        if self.json_data is not None:
            return self.json_data()
        return [dict(zip(self.headers, row, strict=True)) for row in self.rows]


@dataclass(frozen=True)
class Format:
    name: str
    render: Callable[[Table], str]
    document: bool  # the whole output: only the table, every column, the words on stderr


FORMATS: dict[str, Format] = {}


def register(name: str, render: Callable[[Table], str], *, document: bool = True) -> Format:
    """Make ``--format NAME`` print through ``render`` in report, compare and sweep. Raises
    ValueError for a name tabulate already has (it would hide that format)."""
    if name in tabulate_formats:
        raise ValueError(f"{name!r} is a tabulate format already")
    fmt = Format(name, render, document)
    FORMATS[name] = fmt
    return fmt


# Page formats: the whole report or comparison as one file of its own (specload.present.htmlpage),
# written next to report.md / comparison.md while the terminal gets the usual text. "html" is also
# a tabulate table format; as --format it means the page.
PAGES: dict[str, str] = {}  # format -> the file it writes, in the run or comparison directory


def register_page(name: str, suffix: str) -> None:
    PAGES[name] = suffix


def is_page(fmt: str) -> bool:
    return fmt in PAGES


register_page("html", ".html")


def is_known_format(fmt: str) -> bool:
    return fmt in FORMATS or fmt in tabulate_formats


def is_document(fmt: str) -> bool:
    """Whether ``fmt`` is a whole document (csv, json): printed alone, its words on stderr."""
    f = FORMATS.get(fmt)
    return f is not None and f.document


def check_format(fmt: str) -> None:
    """Raise ValueError naming the accepted formats when ``fmt`` is not one of them."""
    if not is_known_format(fmt):
        raise ValueError(
            f"unknown format {fmt!r}; use {', '.join(FORMATS)} or one of: {', '.join(tabulate_formats)}"
        )


def format_help() -> str:
    """``--format``'s help: the registered formats as they are when the parser is made."""
    return (
        f"github (default), plain, any other tabulate format, {', '.join(FORMATS)}; "
        "html: also write one self-contained HTML file (report.html / comparison.html) with the charts"
    )


def _csv(table: Table) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(table.headers)
    for row in table.rows:
        w.writerow(["" if c == MISSING else c for c in row])  # CSV readers expect empty cells
    return buf.getvalue()


def _json(table: Table) -> str:
    return json.dumps(table.data(), indent=2) + "\n"


register("csv", _csv)
register("json", _json)


def render_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    fmt: str = "github",
    *,
    json_data: Callable[[], Any] | None = None,
    align_right: bool = True,
) -> str:
    """The table in ``fmt``: a tabulate format or a registered one (``csv``: the same cells;
    ``json``: ``json_data``'s result, else one object per row, header -> cell).

    Cells are normally strings, formatted by the caller; a non-string cell is left to tabulate
    (which right-aligns numbers while strings stay left-aligned unless ``align_right``).

    ``json_data`` gives the unrounded data behind the cells, built only when a format asks for it.
    ``align_right`` right-aligns every column of a tabulate table (numbers line up whatever their
    width). Raises ValueError for an unknown format.
    """
    registered = FORMATS.get(fmt)
    if registered is not None:
        return registered.render(Table(headers, rows, json_data))
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
    that has them all). A whole view and a document format (csv, json) get the whole table, as
    render_table makes it."""
    if view.whole or is_document(fmt):
        return render_table(headers, rows, fmt, json_data=json_data)

    def table(cols: Sequence[int]) -> str:
        return render_table([headers[i] for i in cols], [[row[i] for i in cols] for row in rows], fmt)

    with _compact():
        choice = choose(keys, view, lambda cols: _width(table(cols)))
        text = table(choice.shown)
    if choice.hidden:
        text += "\n\n" + hidden_note(choice.hidden, view.width, kept_in, choice.hidden_columns(len(headers)))
    return text


def _pipe_cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _fit_pipe_table(lines: Sequence[str], width: int, kept_in: str) -> list[str]:
    """A github table wider than ``width`` with its rightmost columns left out until it fits (the
    first always kept), and the line naming them. The secondary tables (distributions, throughput,
    SLO, lengths) put their columns in the order that matters: the per-level table, whose columns
    are ranked by tableview.PRIORITY, is fitted before it is printed (render_view)."""
    headers = _pipe_cells(lines[0])
    rows = [_pipe_cells(line) for line in lines[2:]]
    if any(len(r) != len(headers) for r in rows):
        return list(lines)  # not a table this function made sense of: leave it as it is
    n = len(headers)
    with _compact():
        while True:
            text = render_table(headers[:n], [r[:n] for r in rows], "github")
            if _width(text) <= width or n == 1:
                break
            n -= 1
    out = text.splitlines()
    if n < len(headers):
        hidden = headers[n:]
        note = f"{len(hidden)} more column{'s' if len(hidden) > 1 else ''} in {kept_in}: {', '.join(hidden)}"
        out += ["", *textwrap.wrap(note, width, break_long_words=False)]
    return out


def fit_text(text: str, width: int | None, kept_in: str) -> str:
    """A report's or comparison's text as a terminal of ``width`` columns shows it: every github
    table fitted to the width, and every longer line of words wrapped at word boundaries (a list
    item's continuation indented under its text). None: unchanged. The files keep the whole text."""
    if width is None:
        return text
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("|"):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            block = lines[i:j]
            too_wide = max(len(b) for b in block) > width
            out += _fit_pipe_table(block, width, kept_in) if too_wide and len(block) >= 2 else block
            i = j
            continue
        if len(line) > width:
            indent = "  " if line.startswith("- ") else ""
            out += textwrap.wrap(
                line, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
            ) or [line]
        else:
            out.append(line)
        i += 1
    return "\n".join(out)
