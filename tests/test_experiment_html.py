"""An experiment's pooled comparison as HTML, and made again from the experiment directory alone
(review 3a7af2e newcomer N5: ``--format html`` wrote no comparison.html, and ``specload compare
EXPERIMENT_DIR`` answered "give at least two run directories")."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from specload.experiment.pooled import arms_of, compare_main
from tests.conftest import ExperimentRun, specload_cmd


def test_the_experiment_writes_its_pooled_comparison_as_html_and_compare_remakes_it(
    tmp_path: Path, example_experiment: ExperimentRun
) -> None:
    """(The example experiment, --repeat 2 --format html, is the session's: tests/conftest.py.)"""
    out = example_experiment.out
    assert example_experiment.code == 0, example_experiment.log[-3000:]
    (directory,) = out.glob("experiment-*")
    doc = json.loads((directory / "experiment.json").read_text())
    page = directory / "comparison.html"
    assert doc["comparison"]["html"] == str(page) and page.is_file()
    html = page.read_text()
    # self-contained, the pooled comparison: two runs per arm as the repeats of each level
    assert not re.search(r'(src|href)="|<script|<link|url\(', html)
    assert "specload comparison: baseline vs mtp" in html and html.count("<svg") >= 5
    assert "repeats per run (baseline/mtp): C=1 2/2, C=4 2/2" in html
    assert "mtp: 2 runs pooled as repeats of each level" in html

    # made again from the directory alone, after it moved (experiment.json's run paths are relative to
    # where the experiment ran): the same pooled figures, in another format and place
    moved = tmp_path / "moved"
    shutil.copytree(directory, moved)
    away = directory.with_name(directory.name + ".away")  # (the session's copy, put back after)
    directory.rename(away)
    try:
        _remade(tmp_path, moved)
    finally:
        away.rename(directory)


def _remade(tmp_path: Path, moved: Path) -> None:
    assert [len(a.runs) for a in arms_of(moved)] == [2, 2]
    again = tmp_path / "again"
    done = subprocess.run(
        specload_cmd("compare", str(moved), "--format", "json", "--no-plot", "--out", str(again)),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert [r["label"] for r in data["runs"]] == ["baseline", "mtp"]
    assert "repeats per run (baseline/mtp): C=1 2/2, C=4 2/2" in (again / "comparison.md").read_text()
    assert compare_main([str(moved), "--format", "html", "--no-plot"]) == 0
    assert "repeats per run (baseline/mtp): C=1 2/2, C=4 2/2" in (moved / "comparison.html").read_text()


def test_compare_of_an_experiment_directory_alone(tmp_path: Path) -> None:
    (tmp_path / "experiment.json").write_text(json.dumps({"arms": [{"label": "a"}], "runs": []}))
    assert compare_main([str(tmp_path)]) == 2
    with pytest.raises(SystemExit):  # an experiment's arms are its runs: nothing else beside it
        compare_main([str(tmp_path), str(tmp_path)])
