"""``specload experiment`` replaying a window of the real Mooncake trace against the baseline and MTP
simulators: the arms get the same requests at the same due times, and the comparison pairs them.

The window's E2E spans about 10x across requests (their lengths), while MTP's change on each request
is much the same: the paired median difference must come with a narrower 95 % interval than the
difference of the arms' medians, and the report must show both."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO, Procs, specload_cmd

MOONCAKE = REPO / "tests" / "fixtures" / "traces" / "mooncake_conversation_head300.jsonl"
WINDOW = 60
SIM = [
    "{python}", "-m", "specload.sim", "--port", "{port}", "--engine", "batch", "--time-scale", "0.25",
    "--model", "sim-model", "--max-model-len", "131072",
]  # fmt: skip


@pytest.mark.slow  # two simulators replaying 60 requests each: about a minute
def test_an_experiment_on_a_trace_pairs_the_arms_request_by_request(tmp_path: Path, procs: Procs) -> None:
    plan = tmp_path / "exp.toml"
    plan.write_text(
        textwrap.dedent(
            f"""
            name = "trace-pair"
            [sweep]
            backend = "sglang"
            trace = {json.dumps(str(MOONCAKE))}
            trace_format = "mooncake"
            trace_requests = {WINDOW}
            trace_speedup = 4.0
            read_timeout_s = 60.0

            [[arms]]
            label = "baseline"
            command = {json.dumps([*SIM, "--preset", "baseline"])}
            ready_timeout_s = 30

            [[arms]]
            label = "mtp"
            speculative = true
            command = {json.dumps([*SIM, "--preset", "mtp"])}
            ready_timeout_s = 30
            """
        )
    )
    out = tmp_path / "out"
    proc = procs.popen(specload_cmd("experiment", str(plan), "--out", str(out), "--no-plot"))
    code = proc.wait(timeout=300)
    log = procs.log(proc)
    assert code == 0, log[-4000:]
    (directory,) = out.glob("experiment-*")
    doc = json.loads((directory / "experiment.json").read_text())
    (paired,) = doc["comparison"]["paired"]
    assert paired["base"] == "baseline" and paired["new"] == "mtp"
    assert paired["window"] == WINDOW and paired["paired"] == WINDOW, paired["unpaired"]
    e2e = next(f for f in paired["figures"] if f["key"] == "e2e")
    assert e2e["n"] == WINDOW
    ci, unpaired = e2e["diff_ci"], e2e["unpaired_ci"]
    assert ci["hi"] < 0, e2e  # MTP is faster on the typical request, outside the noise
    assert ci["hi"] - ci["lo"] < unpaired["hi"] - unpaired["lo"], e2e
    assert e2e["faster_share"] > 0.5, e2e  # most requests got faster (under this overload, 75-85 %)
    # every request of the window went to both arms with the trace's lengths
    for f in ("by_input", "by_output"):
        assert sum(b["n"] for b in paired[f]) == WINDOW
    # each request has the trace's own lengths: the level's table is not n/c for lengths that differ
    assert not any("not comparable" in n for n in doc["comparison"]["notes"]), doc["comparison"]["notes"]
    md = (directory / "comparison.md").read_text()
    assert "## Paired by trace request: mtp vs baseline (baseline)" in md
    assert "Δ paired median (95% CI)" in md and "Δ unpaired, of medians (95% CI)" in md
    assert "pairing made the interval" in md
