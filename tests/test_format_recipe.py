"""CONTRIBUTING.md's recipe "Add an output format", followed end to end.

A format registered here, outside specload, is what ``specload report`` and ``specload compare``
print through: nothing else in specload names it. A new format's own test has this shape (without
the fixture that registers it: its ``register`` line lives in specload/present/output.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specload.cli import main
from specload.core.text import MISSING
from specload.present import output
from specload.present.output import Table
from tests.fixtures.make_compare_runs import LEVELS, write_reference_pair

SAMPLE_RUN = Path(__file__).parent / "fixtures" / "sample_run"


def ndjson(table: Table) -> str:
    """One JSON object per row, header -> cell (a missing value: null): one level a line."""
    return "".join(
        json.dumps({h: None if c == MISSING else c for h, c in zip(table.headers, row, strict=True)}) + "\n"
        for row in table.rows
    )


def tabbed(table: Table) -> str:
    """Tab-separated cells: a table format inside the report's text, as tabulate's are."""
    return "\n".join("\t".join(map(str, line)) for line in [table.headers, *table.rows])


@pytest.fixture
def formats(monkeypatch: pytest.MonkeyPatch) -> None:
    """The two formats registered for one test (a copy of the registry, put back after it)."""
    monkeypatch.setattr(output, "FORMATS", dict(output.FORMATS))
    output.register("ndjson", ndjson)
    output.register("tabbed", tabbed, document=False)


@pytest.fixture
def sample_run(tmp_path: Path) -> Path:
    return Path(shutil.copytree(SAMPLE_RUN, tmp_path / "sample_run"))


def test_report_prints_through_a_registered_document_format(
    formats: None, sample_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(sample_run), "--format", "ndjson", "--no-write"]) == 0
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]
    assert rows and all(set(r) >= {"C", "Agg tok/s"} for r in rows)
    assert [r["C"] for r in rows] == sorted({r["C"] for r in rows}, key=int)
    # a document is the whole of stdout; the header and notes go to stderr, as for csv and json
    assert "# specload report" not in captured.out and "specload report" in captured.err


def test_compare_prints_through_a_registered_document_format(
    formats: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, mtp = write_reference_pair(tmp_path / "runs")
    out = tmp_path / "out"
    assert main(["compare", str(base), str(mtp), "--format", "ndjson", "--out", str(out), "--no-plot"]) == 0
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]
    assert [int(r["C"]) for r in rows] == list(LEVELS)
    assert rows[4]["Δ agg mtp"] == "-32% (1 run)" and rows[0]["Accept len baseline"] is None
    assert (
        "## Verdict" not in captured.out
        and "aggregate tok/s changes sign between C=32 and C=64" in captured.err
    )
    assert (out / "comparison.md").read_text().startswith("# specload comparison")  # always markdown


def test_a_table_format_renders_every_table_of_the_text(
    formats: None, sample_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(sample_run), "--format", "tabbed", "--no-write"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# specload report")  # the words stay in the text
    assert "\nC\tAgg tok/s\t" in text and "|" not in text.split("\n\n")[1]


def test_the_registry_is_all_there_is(formats: None, sample_run: Path) -> None:
    assert output.is_known_format("ndjson") and output.is_document("ndjson")
    assert not output.is_document("tabbed") and not output.is_document("github")
    assert "ndjson" in output.format_help() and "json" in output.format_help()
    with pytest.raises(ValueError, match="a tabulate format already"):
        output.register("github", ndjson)


def test_an_unregistered_name_is_refused(sample_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert not output.is_known_format("ndjson")
    assert main(["report", str(sample_run), "--format", "ndjson", "--no-write"]) == 2
    assert "unknown format 'ndjson'" in capsys.readouterr().err
