"""specload.present.output (the one table renderer of report and compare) and specload.core.text."""

from __future__ import annotations

import csv
import io
import json

import pytest

from specload.core.text import MISSING, fmt_count, fmt_num, fmt_pct, shorten
from specload.present.output import check_format, is_known_format, render_table

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
