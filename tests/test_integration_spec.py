"""The speculation story end to end: server introspection, simulator presets, compare."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import pytest

from specload.present.report import load_run
from tests.conftest import specload_cmd

SMALL = ("--levels", "1,2", "--input-tokens", "16", "--output-tokens", "8", "--requests-per-level", "2")


def _only_run(out: Path) -> Path:
    (run,) = [d for d in out.iterdir() if d.is_dir()]
    return run


def test_server_without_metrics_or_server_info_still_reports(sim, tmp_path: Path) -> None:
    server = sim("--ttft-ms", "20", "--itl-ms", "5", "--metrics-style", "none")
    out = subprocess.run(
        specload_cmd("sweep", "--host", server.url, *SMALL, "--backend", "sglang", "--out", str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    run_dir = _only_run(tmp_path)
    meta = orjson.loads((run_dir / "run.json").read_bytes())
    assert meta["server_metrics"] == "unavailable"
    assert "max_running_requests" not in meta["server"]
    assert not (run_dir / "server_samples.jsonl").exists()
    run = load_run(run_dir)
    assert [lv.ok for lv in run.levels] == [2, 2]
    assert all(lv.server_running_max is None and lv.figure("accept") is None for lv in run.levels)
    assert "Srv run max" not in out.stdout and "Accept len" not in out.stdout


def test_server_introspection_is_recorded(sim, tmp_path: Path) -> None:
    server = sim("--ttft-ms", "20", "--itl-ms", "5", "--max-running", "1")
    # 60 tokens at 5 ms: each request holds the single slot ~0.3 s, three 0.1-s samples see the queue.
    flags = (*SMALL[:4], "--output-tokens", "60", *SMALL[6:])
    out = subprocess.run(
        specload_cmd(
            "sweep", "--host", server.url, *flags, "--out", str(tmp_path), "--metrics-interval", "0.1"
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    meta = orjson.loads((_only_run(tmp_path) / "run.json").read_bytes())
    assert meta["server"]["max_running_requests"] == 1 and meta["simulated"] is True
    assert "levels above C=1 will queue" in out.stderr + out.stdout
    run = load_run(_only_run(tmp_path))
    c2 = run.levels[1]
    assert c2.server_running_max == 1 and c2.server_queued_max == 1  # the second request waited
    assert any(
        "exceeds the server's max_running_requests (1)" in n for n in run.crosscheck + run.notices
    ) or ("exceeds the server's max_running_requests (1)" in out.stdout)


@pytest.mark.slow  # two sweeps at C=32 and 64, 150 tokens each (~1 min of both cores): make test-slow
def test_presets_tell_the_story(tmp_path: Path) -> None:
    """Baseline and MTP presets, shortened (150 output tokens, time x2 faster, C = 32, 64): the
    comparison must name the crossover between C=32 and C=64 and the MTP server's cap of 48."""
    from specload.demo import sim_args
    from specload.sim.process import start_sim

    runs = []
    for preset in ("baseline", "mtp"):
        server = start_sim(sim_args(preset))
        try:
            out = subprocess.run(
                specload_cmd(
                    "sweep",
                    "--host",
                    server.url,
                    "--scenario",
                    "scenarios/demo.toml",
                    "--levels",
                    "32,64",
                    "--output-tokens",
                    "150",
                    "--warmup-requests",
                    "0",
                    "--label",
                    preset,
                    "--out",
                    str(tmp_path / preset),
                ),
                capture_output=True,
                text=True,
                timeout=240,
            )
        finally:
            server.stop()
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        runs.append(_only_run(tmp_path / preset))
    base, mtp = (load_run(r) for r in runs)
    assert [lv.ok for lv in mtp.levels] == [64, 128]
    assert all(lv.figure("accept") is not None and 1.9 < lv.figure("accept") <= 2.0 for lv in mtp.levels)
    assert mtp.levels[1].server_running_max == 48 and mtp.levels[1].server_queued_max > 0
    # Steady tok/s against a batching server whose prefill and decode share steps (audit F2): the
    # saturated rate, so never below the level's average (Agg) nor above its busiest second.
    for lv in [*base.levels, *mtp.levels]:
        assert lv.steady_tok_s is not None and lv.agg_tok_s is not None, lv.label
        assert lv.agg_tok_s <= lv.steady_tok_s <= max(lv.tok_s_series) * 1.02, (
            lv.label,
            lv.agg_tok_s,
            lv.steady_tok_s,
            lv.tok_s_series,
        )
    cmp = subprocess.run(
        specload_cmd("compare", str(runs[0]), str(runs[1]), "--out", str(tmp_path / "cmp"), "--no-plot"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cmp.returncode == 0, cmp.stderr
    # one run of each: the crossover is told as the measured sign change, not as a finding
    assert "each side is a single run" in cmp.stdout, cmp.stdout
    assert "aggregate tok/s changes sign between C=32 and C=64 (near C≈" in cmp.stdout, cmp.stdout
    assert "max_running_requests is 48" in cmp.stdout
    assert (tmp_path / "cmp" / "comparison.md").exists()
