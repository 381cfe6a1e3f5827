"""What one run can show: single runs are told as measurements, never as findings, and a level whose
throughput drifted within itself is flagged (docs/metrics.md, "Single runs" and "Drift within a level")."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from specload.analysis.comparison import SINGLE_MARK, build_comparison
from specload.analysis.drift import DRIFT_MIN_PCT, drift_of
from specload.analysis.run import load_run
from specload.present.compare import render_table, to_dict
from specload.present.report import render_report
from tests.conftest import run_together, specload_cmd


def _sweep(server: Any, out: Path, *flags: str) -> Path:
    done = subprocess.run(
        specload_cmd("sweep", "--host", server.url, "--out", str(out), "--read-timeout", "30", *flags),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    return run_dir


# ---------------------------------------------------------------- the drift statistic by hand


def test_a_step_half_way_is_drift_and_the_same_wobble_without_it_is_not() -> None:
    wobble = [100.0, 104.0, 98.0, 102.0, 100.0, 104.0, 98.0, 102.0]
    flat = drift_of(wobble)
    assert flat is not None and not flat.flagged and flat.pct == pytest.approx(0.0)
    # Successive differences within each half: 4, -6, 4 and 4, -6, 4: s^2 = 6 * 16 + 2 * 36 ... / (2 * 6)
    s = ((4 * 16 + 2 * 36) / 12) ** 0.5
    assert flat.noise_pct == pytest.approx(s / 101.0 * 100)
    stepped = drift_of(wobble[:4] + [y * 1.5 for y in wobble[4:]])
    assert stepped is not None and stepped.flagged and stepped.pct == pytest.approx(50.0)
    # The step itself does not inflate the noise: only differences within a half count.
    assert stepped.threshold_pct < 15.0
    # A level as noisy as its drift is not flagged: the noise allows it.
    noisy = drift_of([60.0, 140.0, 60.0, 140.0, 70.0, 150.0, 70.0, 150.0])
    assert noisy is not None and noisy.pct == pytest.approx(10.0) and not noisy.flagged
    # A steady level never flags under DRIFT_MIN_PCT, however small its noise.
    tiny = drift_of([100.0] * 4 + [103.0] * 4)
    assert tiny is not None and tiny.threshold_pct == DRIFT_MIN_PCT and not tiny.flagged
    assert drift_of([1.0, 2.0, 3.0, 4.0, 5.0]) is None  # under 3 segments a half


# ---------------------------------------------------------------- on the simulator


SAME = ("--engine", "batch", "--preset", "mtp", "--time-scale", "0.2")
SWEEP = ("--backend", "sglang", "--levels", "1,4,16", "--requests-per-user", "0.5", "--min-requests", "8")
SWEEP += ("--input-tokens", "128", "--output-tokens", "32")


def test_two_single_sweeps_of_one_server_are_no_finding(sim: Any, tmp_path: Path) -> None:
    """The issue's case: two single sweeps of one and the same simulated server compared. Whatever
    their changes, the verdict may not read as a rise, a fall or a crossover."""
    server = sim(*SAME)
    a = load_run(_sweep(server, tmp_path / "a", "--label", "a", *SWEEP))
    b = load_run(_sweep(server, tmp_path / "b", "--label", "b", *SWEEP))
    comp = build_comparison([a, b])
    (sentence,) = comp.sentences
    # (led by any sign change of the single runs' changes, told as measured)
    assert sentence.startswith("b vs a: ")
    assert "t C=1, 4, 16 each side is a single run, so these changes are no finding yet" in sentence
    for firm in ("raises", "lowers", "higher", "lower", "crossover", "outside the noise", "faster", "slower"):
        assert firm not in sentence, (firm, sentence)
    assert "--repeat 3" in sentence and "specload experiment --repeat 3" in sentence
    assert all(ch.single for ch in comp.agg["b"] + comp.per_req["b"])
    assert all(x.single_runs for xs in (comp.crossovers["b"].agg, comp.crossovers["b"].per_req) for x in xs)
    table = render_table(comp)
    assert table.count(SINGLE_MARK) == 2 * 3, table  # next to every change, agg and per-req, at 3 levels
    doc = to_dict(comp)
    assert all(lv["changes"]["b"]["agg"]["single_run"] for lv in doc["levels"])
    # A steady server: no level drifted within itself.
    assert not [n for n in comp.notes if "drifted" in n], comp.notes


def test_a_server_that_speeds_up_half_way_through_a_level_is_flagged(sim: Any, tmp_path: Path) -> None:
    # One level of 40 requests at C=2 (no warm-up); the smoke and probe requests come first, so the
    # switch after 22 admissions falls about half-way through the level. The gaps are 20 ms, then
    # 10: with 8 and 4 ms, a loaded machine's wake-up delays (a few ms a token) hid most of the
    # speed-up (+30 % measured against +100 %, within the segments' noise).
    flags = ("--levels", "2", "--min-requests", "40", "--requests-per-user", "20", "--warmup-requests", "0")
    flags += ("--input-tokens", "16", "--output-tokens", "24")
    steady = sim("--ttft-ms", "20", "--itl-ms", "20")
    fast = sim("--ttft-ms", "20", "--itl-ms", "20", "--speed-up-after", "22", "--speed-up", "2")
    base, drifting = run_together(  # (each on its own server: at once)
        lambda: load_run(_sweep(steady, tmp_path / "a", "--label", "steady", *flags)),
        lambda: load_run(_sweep(fast, tmp_path / "b", "--label", "drifting", *flags)),
    )
    (lb,), (ld,) = base.levels, drifting.levels
    assert lb.drift is not None and not lb.drift.flagged, lb.drift
    assert ld.drift is not None and ld.drift.flagged and ld.drift.pct > 40, ld.drift
    comp = build_comparison([base, drifting])
    notes = [n for n in comp.notes if "drifted" in n]
    assert len(notes) == 1 and notes[0].startswith("C=2: drifting's throughput drifted within the level"), (
        notes
    )
    assert "(drift)" in render_table(comp)
    drifted = [n for n in render_report(drifting).splitlines() if "drifted within the level" in n]
    assert len(drifted) == 1 and drifted[0].startswith("- c002: the throughput drifted"), drifted
    assert "drifted" not in render_report(base)
