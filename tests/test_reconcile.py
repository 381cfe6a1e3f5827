"""The report says when the records and run.json's counts disagree (review ab9c161, M11)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from specload.analysis.run import load_run

SAMPLE = Path(__file__).parent / "fixtures" / "sample_run"


def _copy(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(SAMPLE, d)
    return d


def test_a_whole_run_has_no_reconciliation_note(tmp_path: Path) -> None:
    run = load_run(_copy(tmp_path))
    assert not [n for n in run.notices if "measured record(s)" in n], run.notices


def test_records_cut_short_are_named_against_run_json(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    lines = (d / "records.jsonl").read_text().splitlines(keepends=True)
    # Drop level 2's measured records (c008: run.json received 16).
    kept = [ln for ln in lines if not (json.loads(ln)["level"] == 2 and json.loads(ln)["phase"] == "measure")]
    (d / "records.jsonl").write_text("".join(kept))
    run = load_run(d)
    gone = len(lines) - len(kept)
    assert (
        f"c008: {gone} measured record(s) missing: records.jsonl holds {16 - gone}, run.json received 16"
        in (run.notices)
    ), run.notices


def test_a_run_json_that_claims_fewer_than_the_records_is_named(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    meta = json.loads((d / "run.json").read_text())
    meta["levels"][0]["received"] = 2
    (d / "run.json").write_text(json.dumps(meta))
    run = load_run(d)
    assert any(n.startswith("c001: 2 measured record(s) more than it counted") for n in run.notices), (
        run.notices
    )
