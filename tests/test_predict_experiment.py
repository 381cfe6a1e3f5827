"""``specload experiment --predict`` and ``specload predict``: the deciding levels, the sign test, and one
whole predicted experiment on the demo pair of simulators (marked slow: about a minute of sweeps).

The full experiment's verdict is taken from the simulator's exact timing (specload.sim.virtual): the
demo pair's speculative aggregate is above the baseline's at C=32 and below it at C=64, the crossover
the demo measures near C=39. The test's ladder brackets it with 24 and 64 (each sign clear of a single
run's noise), and has levels below the probes that the speculative arm never needs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specload.analysis import stepcost as sc
from specload.analysis.metrics import Dist, LevelStats
from specload.analysis.predict import PREDICTION_JSON, decode
from specload.analysis.run import Run
from specload.experiment.predicted import deciding_levels, level_sign
from specload.sim.batch import load_preset
from specload.sim.virtual import closed_loop_level
from tests.conftest import REPO, Procs, specload_cmd

PLAN = REPO / "scenarios" / "experiment-demo.toml"
LADDER = [1, 2, 4, 8, 16, 24, 64]


def _run(aggs: dict[int, list[float]], tpot_sd: float = 0.0) -> Run:
    """A run whose level C has one repeat per value in aggs[C] (TPOT mean 10 ms, sd tpot_sd, 100 requests)."""
    levels = [
        LevelStats(
            concurrency=c,
            repeat=i,
            label=f"c{c:03d}",
            ok=100,
            sent=100,
            output_tokens=100 * 250,
            agg_tok_s=a,
            prompt_tokens_mean=1000.0,
            dists={
                "ttft": Dist(n=100, mean=0.1, std=0.0),
                "tpot": Dist(n=100, mean=0.010, std=tpot_sd),
            },
        )
        for c, values in aggs.items()
        for i, a in enumerate(values)
    ]
    return Run(run_dir=Path("x"), meta={}, levels=levels)


def test_deciding_levels_bracket_the_crossover_and_add_the_cap() -> None:
    x = sc.Crossover(c_star=39.0, lo=35.0, hi=45.0, sentence="")
    assert deciding_levels([1, 4, 16, 32, 64], x, 48) == ([32, 64], [32, 64])
    assert deciding_levels([1, 4, 16, 32, 48, 64, 128], x, 48) == ([32, 48], [32, 48])
    assert deciding_levels([1, 4, 16, 32, 64, 128], x, 100) == ([32, 64], [32, 64, 128])
    none = sc.Crossover(c_star=None, lo=None, hi=None, sentence="")
    assert deciding_levels([1, 4, 16], none, 48) == ([16], [16])


def test_sign_from_repeats_uses_the_comparisons_noise_test() -> None:
    base = _run({32: [100.0, 101.0, 99.0]})
    clear = level_sign([base], [_run({32: [110.0, 111.0, 109.0]})], 32)
    assert clear.test == "repeats" and clear.settled and clear.change == pytest.approx(0.10)
    noisy = level_sign([base], [_run({32: [90.0, 115.0, 104.0]})], 32)
    assert noisy.test == "repeats" and not noisy.settled and "inside the repeats' noise" in noisy.why


def test_sign_of_single_runs_against_the_requests_spread() -> None:
    # TPOT sd 2 ms on a 10 ms mean over 100 requests: 2 % standard error a side, 1.96 x 2.83 % = 5.5 %
    base = _run({32: [100.0]}, tpot_sd=0.002)
    small = level_sign([base], [_run({32: [104.0]}, tpot_sd=0.002)], 32)
    assert small.test == "per-request" and small.noise == pytest.approx(1.96 * 0.02 * 2**0.5)
    assert not small.settled and "+4.0 % is inside the requests' noise" in small.why
    assert level_sign([base], [_run({32: [90.0]}, tpot_sd=0.002)], 32).settled
    assert not level_sign([base], [_run({16: [90.0]})], 32).settled


@pytest.mark.slow
def test_predict_then_verify_on_the_demo_pair(tmp_path: Path, procs: Procs, sim: Any) -> None:
    # the full experiment's verdict, from the simulator's exact timing: pays at 32, loses at 64
    b, m = load_preset("baseline"), load_preset("mtp")
    for c, pays in ((24, True), (64, False)):
        vb, vm = (closed_loop_level(p, c, 1000, 250, 2 * c) for p in (b, m))
        assert (vm.agg_tok_s > vb.agg_tok_s) is pays
    out = tmp_path / "out"
    proc = procs.popen(
        specload_cmd(
            "experiment",
            str(PLAN),
            "--predict",
            "--repeat",
            "auto",
            "--budget",
            "150",
            "--levels",
            ",".join(map(str, LADDER)),
            "--out",
            str(out),
            "--no-plot",
        )
    )
    code = proc.wait(timeout=400)
    log = procs.log(proc)
    assert code == 0, log
    (directory,) = out.glob("experiment-*")
    doc = json.loads((directory / "experiment.json").read_text())
    pr = doc["comparison"]["predict"]
    # the same verdict as the full experiment
    assert pr["verdict"].startswith("crossover measured between C=24 and C=64"), pr["verdict"]
    assert [s["concurrency"] for s in pr["signs"]] == [24, 64] and all(s["settled"] for s in pr["signs"])
    # the speculative arm was never swept at C=4, and the first prediction is checked at C=64 within 10 %
    mtp_levels = {
        int(c)
        for r in doc["runs"]
        if r["arm"] == "mtp"
        for c in json.loads(Path(r["run_dir"], "run.json").read_text())["scenario"]["levels"]
    }
    assert mtp_levels == {1, 16, 24, 64}, mtp_levels
    at64 = next(c for c in pr["checked"] if c["concurrency"] == 64)
    assert not at64["probed"] and abs(at64["error"]) < 0.10, at64
    first = pr["first_crossover"]
    assert 24 <= first["c_star"] <= 64
    # at most half the full experiment's wall time (both arms, every level, --repeat 2), and said so
    saving = pr["saving"]
    assert saving["full_repeats"] == 2 and saving["wall_s"] <= 0.5 * saving["full_wall_s"], saving
    assert "saved " in log and "against the full two-arm ladder at --repeat 2" in log
    pred = decode((directory / PREDICTION_JSON).read_bytes())
    assert pred.version == 1 and pred.probe_levels == [1, 16, 24]
    assert (directory / "predicted-experiment.md").read_text().startswith("# Predict, then verify")

    # `specload predict` on the same runs: the prediction written where asked, and checked at C=64
    base = next(r["run_dir"] for r in doc["runs"] if r["arm"] == "baseline")
    probes = [r["run_dir"] for r in doc["runs"] if r["arm"] == "mtp"]
    target = tmp_path / "pred"
    target.mkdir()
    cli = procs.popen(specload_cmd("predict", base, "--probe", probes[0], "--out-dir", str(target)))
    assert cli.wait(timeout=60) == 0, procs.log(cli)
    again = decode((target / PREDICTION_JSON).read_bytes())
    assert again.crossover.c_star == pytest.approx(first["c_star"])
    assert {w.name for w in again.whatifs} == {"cap", "draft_tokens", "output_tokens"}
    assert "Predicted speculative arm (a model, not a measurement)" in (target / "prediction.md").read_text()

    # `specload predict --host`: the probes run by specload itself, against a server it did not start,
    # with the baseline run's own scenario at the levels chosen from the server's cap (48: 1, 16, 24)
    mtp = sim("--engine", "batch", "--preset", "mtp", "--time-scale", "0.25", "--model", "sim-model")
    hosted = procs.popen(specload_cmd("predict", base, "--host", mtp.url, "--out", str(tmp_path / "probes")))
    assert hosted.wait(timeout=120) == 0, procs.log(hosted)
    (probe_dir,) = (tmp_path / "probes").glob("probe-*")
    own = decode((probe_dir / PREDICTION_JSON).read_bytes())
    assert own.probe_levels == [1, 16, 24] and own.fit.spec_cap == 48
    assert own.crossover.c_star is not None and 24 <= own.crossover.c_star <= 64
    assert "probing " + mtp.url + " at C = 1, 16, 24" in procs.log(hosted)
