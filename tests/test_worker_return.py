"""A worker written off as lost that comes back (review ab9c161, M2): its late records are refused,
and the level still has at most C requests in flight, though for a while there are more users
than C (the survivor took over the lost worker's users, and the returning one still runs its own).
Before the cap, a C=4 level ran 6 in flight and the client check said nothing."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from specload.analysis.clientcheck import ClientFigures, peak_in_flight
from specload.core.records import read_records
from tests.conftest import Procs, locust_cmd, wait_until
from tests.test_stop_distributed import cluster


def test_a_worker_back_from_the_dead_does_not_raise_the_level_above_c(
    sim, procs: Procs, tmp_path: Path
) -> None:
    sweep = (
        "--levels",
        "4",
        "--requests-per-level",
        "120",
        "--input-tokens",
        "16",
        "--output-tokens",
        "60",  # ~0.3 s requests
        "--read-timeout",
        "30",
        "--metrics-interval",
        "0",
    )
    # Locust workers themselves (not `specload worker`, whose Locust is a child): the frozen pid is the one with the users.
    worker = locust_cmd("--worker", "--master-host", "127.0.0.1", "--master-port", "{port}")
    master, (frozen, _other), out = cluster(sim, procs, tmp_path, sweep, worker, "r" * 40)

    def records() -> list:  # type: ignore[type-arg]
        return [r for p in out.glob("*/records.jsonl") for r in read_records(str(p))]

    os.kill(frozen.pid, signal.SIGSTOP)  # missing heartbeats: written off after ~3 s
    try:
        wait_until(lambda: "was lost with" in procs.log(master), 30, "the frozen worker written off")
        wait_until(lambda: len(records()) >= 40, 60, "the survivor's records")
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    assert master.wait(timeout=120) == 0, procs.log(master)[-3000:]
    log = procs.log(master)
    assert "answers again after its requests were written off" in log, log[-3000:]
    (run_dir,) = out.iterdir()
    meta = json.loads((run_dir / "run.json").read_text())
    lv = meta["levels"][0]
    recs = [r for r in records() if r.level == 0]
    assert lv["granted"] == lv["received"] == len(recs) + lv["lost"], lv
    assert lv["lost"] > 0  # the frozen worker's requests in flight, written off
    peak = peak_in_flight([(r.t_send, r.t_end) for r in recs])
    assert peak is not None and peak <= 4, peak
    assert lv["client"]["peak_in_flight"] <= 4, lv["client"]
    fig = ClientFigures.from_json(4, lv["client"])
    assert fig is not None and "more than C=4" not in (fig.flag() or "")
