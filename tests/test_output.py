"""specload.present.output (the one table renderer of report and compare) and specload.core.text."""

from __future__ import annotations

import csv
import io
import json

import pytest

from specload.core.text import MISSING, fmt_count, fmt_num, fmt_pct, shorten
from specload.present import output
from specload.present.output import (
    Table,
    check_format,
    is_document,
    is_known_format,
    render_table,
    render_view,
)
from specload.present.tableview import TableView

HEADERS = ["C", "Agg tok/s"]
ROWS = [["1", "5.0"], ["16", MISSING]]


def test_formatters() -> None:
    assert [fmt_num(x, 1) for x in (5, 2.25, None)] == ["5.0", "2.2", MISSING]
    assert [fmt_count(x) for x in (48.0, 10.5, None)] == ["48", "10.5", MISSING]
    assert [fmt_pct(x) for x in (12.4, -32.48, 0.3, -0.4, None)] == ["+12%", "-32%", "0%", "0%", MISSING]


def test_tabulate_formats_right_aligned() -> None:
    text = render_table(HEADERS, ROWS, "github")
    assert text.splitlines()[0] == "|   C |   Agg tok/s |"
    assert text.splitlines()[3] == "|  16 |           - |"
    assert "|" not in render_table(HEADERS, ROWS, "plain")


def test_csv_has_empty_cells_for_missing() -> None:
    rows = list(csv.reader(io.StringIO(render_table(HEADERS, ROWS, "csv"))))
    assert rows == [HEADERS, ["1", "5.0"], ["16", ""]]


def test_json_is_the_given_data_else_the_cells() -> None:
    assert json.loads(render_table(HEADERS, ROWS, "json", json_data=lambda: {"unrounded": 5.0123})) == {
        "unrounded": 5.0123
    }
    assert json.loads(render_table(HEADERS, ROWS, "json")) == [
        {"C": "1", "Agg tok/s": "5.0"},
        {"C": "16", "Agg tok/s": "-"},
    ]


def test_json_data_is_built_only_for_json() -> None:
    def boom() -> None:
        raise AssertionError("built for a non-json format")

    render_table(HEADERS, ROWS, "github", json_data=boom)
    render_table(HEADERS, ROWS, "csv", json_data=boom)


def test_unknown_format() -> None:
    assert is_known_format("github") and is_known_format("csv") and not is_known_format("nope")
    with pytest.raises(ValueError, match="unknown format 'nope'; use csv, json or one of"):
        render_table(HEADERS, ROWS, "nope")
    with pytest.raises(ValueError):
        check_format("nope")


def test_shorten() -> None:
    assert shorten("  a\n  b\tc ") == "a b c"
    assert shorten("x" * 200) == "x" * 157 + "..."
    assert shorten("x" * 200, 120) == "x" * 117 + "..." and len(shorten("y" * 121, 120)) == 120
    assert shorten("x" * 120, 120) == "x" * 120


def test_csv_and_json_are_registered_documents() -> None:
    assert is_document("csv") and is_document("json") and {"csv", "json"} <= set(output.FORMATS)
    assert not is_document("github") and not is_document("nope")


def test_a_registered_format_gets_the_cells_and_the_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(output, "FORMATS", dict(output.FORMATS))
    seen: list[Table] = []

    def record(table: Table) -> str:
        seen.append(table)
        return f"{len(table.rows)} rows, {table.data()}"

    output.register("count", record)
    assert render_table(HEADERS, ROWS, "count", json_data=lambda: "raw") == "2 rows, raw"
    assert list(seen[0].headers) == HEADERS and seen[0].rows == ROWS
    assert render_table(HEADERS, ROWS, "count").startswith("2 rows, [{'C': '1'")  # no data: the cells
    # a document keeps every column whatever the terminal's width; a table format is fitted to it
    output.register("cells", lambda t: "\n".join(" ".join(r) for r in [t.headers, *t.rows]), document=False)
    headers, keys = ["C", "Agg tok/s", "Tokens"], ["c", "agg", "tokens"]
    rows = [["1", "5.0", "40"], ["16", "7.5", "80"]]
    narrow = TableView(width=12)
    assert render_view(headers, keys, rows, "count", narrow, "report.md").startswith(
        "2 rows, [{'C': '1', 'Agg"
    )
    assert "'Tokens': '40'" in render_view(headers, keys, rows, "count", narrow, "report.md")
    fitted = render_view(headers, keys, rows, "cells", narrow, "report.md")
    assert fitted.splitlines()[:3] == ["C Agg tok/s", "1 5.0", "16 7.5"] and "report.md" in fitted
