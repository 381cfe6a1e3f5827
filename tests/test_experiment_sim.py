"""scenarios/experiment-sim.toml shows where MTP stops paying (review 3a7af2e newcomer N6: its levels
stopped at C=16, under the MTP preset's cap of 48, so the one-command experiment never crossed over)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from specload.experiment.plan import load_plan
from tests.conftest import REPO, specload_cmd

EXAMPLE = REPO / "scenarios" / "experiment-sim.toml"
PRESET = REPO / "specload" / "sim" / "presets" / "mtp.toml"


def test_its_levels_go_past_the_mtp_servers_cap() -> None:
    line = next(x for x in PRESET.read_text().splitlines() if x.startswith("spec_max_running_requests"))
    cap = int(line.split("=")[1].split("#")[0])
    levels = load_plan(str(EXAMPLE)).scenario.levels
    assert max(levels) > cap and any(c < cap for c in levels if c > 16), (levels, cap)


@pytest.mark.slow
def test_the_experiment_as_shipped_names_where_mtp_stops_paying(tmp_path: Path) -> None:
    t0 = time.monotonic()
    done = subprocess.run(
        specload_cmd("experiment", str(EXAMPLE), "--out", str(tmp_path), "--no-plot"),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    wall = time.monotonic() - t0
    assert done.returncode == 0, done.stderr[-3000:]
    verdict = done.stdout[done.stdout.index("## Verdict") :]
    # the simulator's timings: MTP pays up to C=32 and loses at C=64 (its cap of 48 queues the rest)
    assert "aggregate tok/s changes sign between C=32 and C=64" in verdict
    assert "its max_running_requests is 48" in verdict
    assert wall < 120, wall  # about 25 s on 2 quiet cores
