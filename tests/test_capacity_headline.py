"""One capacity headline: no capacity change between runs the same comparison calls not like for like
(review 3a7af2e webui N7), none from a sweep's coarse levels (newcomer N4: "+300 %" then "+67 %")."""

from __future__ import annotations

import json
from pathlib import Path

from specload.present.compare import run_compare
from tests.fixtures.make_compare_runs import write_run


def _pair(tmp_path: Path, other_tokens: int | None) -> tuple[Path, Path]:
    base = write_run(tmp_path / "b", "base", {1: 100.0, 4: 300.0}, {1: 100.0, 4: 80.0})
    mtp = write_run(tmp_path / "m", "mtp", {1: 120.0, 4: 360.0}, {1: 120.0, 4: 95.0})
    if other_tokens is not None:
        meta = json.loads((mtp / "run.json").read_text())
        meta["scenario"]["output_tokens"] = other_tokens
        (mtp / "run.json").write_text(json.dumps(meta))
    return base, mtp


def test_unlike_runs_get_each_capacity_and_no_change(tmp_path: Path) -> None:
    base, mtp = _pair(tmp_path, other_tokens=384)
    comp = run_compare([base, mtp], out=tmp_path / "cmp", plot=False, slo="ttft_p99=100s").comparison
    assert any(n.endswith("the comparison is not like for like") for n in comp.notes), comp.notes
    (sentence,) = comp.slo.sentences
    assert "instead of" not in sentence and "the same" not in sentence
    assert sentence.startswith("mtp meets the SLO at every level measured (up to C=4); base meets")
    assert (
        "no capacity change is claimed, the runs are not like for like (the runs differ in output tokens"
        in (sentence)
    )


def test_like_runs_keep_their_capacity_sentence(tmp_path: Path) -> None:
    base, mtp = _pair(tmp_path, other_tokens=None)
    comp = run_compare([base, mtp], out=tmp_path / "cmp", plot=False, slo="ttft_p99=100s").comparison
    (sentence,) = comp.slo.sentences
    assert sentence.startswith("With mtp the deployment meets the SLO up to the same C=4"), sentence
