"""Stopping a run spread over processes or machines keeps every record (review ab9c161, H3): on
the first stop signal the master grants no more tickets and waits until every ticket out is back
(the workers' requests finish within the grace period) or written off, then quits. A worker told
to stop by its own signal finishes its requests and ships their records before it goes.

Each case checks what the one-process sweep already guarantees (tests/test_stop.py): granted ==
received, one record per granted request, none of them lost, and the run marked interrupted.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from specload.core.records import read_records
from tests.conftest import Procs, free_port, specload_cmd, wait_until
from tests.test_stop import children

SIM = ("--ttft-ms", "20", "--itl-ms", "5", "--model", "m")
LONG = (
    "--levels",
    "4",
    "--requests-per-level",
    "400",
    "--input-tokens",
    "16",
    "--output-tokens",
    "300",  # ~1.5 s requests: a signal lands with every user in the middle of one
    "--read-timeout",
    "30",
    "--metrics-interval",
    "0",
)
TOKEN = {"SPECLOAD_MASTER_TOKEN": "s" * 40}


def _started(out: Path, n: int = 4) -> bool:
    return any(len(read_records(str(p))) >= n for p in out.glob("*/records.jsonl"))


def _check_every_record_kept(out: Path, log: str) -> None:
    (run_dir,) = out.iterdir()
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "interrupted", meta["status"]
    lv = meta["levels"][0]
    recs = [r for r in read_records(str(run_dir / "records.jsonl")) if r.level == 0]
    assert lv["lost"] == 0, lv
    assert lv["granted"] == lv["received"] == len(recs), (lv, len(recs))
    assert len({r.seq for r in recs}) == len(recs)  # one record per request
    # The requests in flight at the signal finished within the grace period.
    assert all(r.status == "ok" for r in recs), (
        [r.reason for r in recs if r.status != "ok"][:5],
        log[-4000:],
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["term", "int", "kill"])
def test_stopping_a_processes_sweep_keeps_every_record(
    sim, procs: Procs, tmp_path: Path, sig: signal.Signals
) -> None:
    server = sim(*SIM)
    out = tmp_path / "out"
    parent = procs.popen(
        specload_cmd("sweep", "--host", server.url, "--out", str(out), "--processes", "2", *LONG),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_until(lambda: _started(out), 90, "records")
    (locust_pid,) = children(parent.pid)
    os.kill(parent.pid, sig)
    parent.wait(timeout=60)
    if sig == signal.SIGKILL:
        # A dead parent's death signal comes once per thread of it: a SIGTERM after the first is
        # that repeat, never a second stop that cuts the requests in flight.
        wait_until(lambda: "SIGTERM: stopping" in procs.log(parent), 30, "the first SIGTERM")
        os.kill(locust_pid, signal.SIGTERM)
    wait_until(lambda: any(p.exists() for p in out.glob("*/report.md")), 30, "report.md")
    _check_every_record_kept(out, procs.log(parent))


def cluster(  # type: ignore[no-untyped-def]
    sim,
    procs: Procs,
    tmp_path: Path,
    sweep: tuple[str, ...] = LONG,
    worker: list[str] | None = None,
    token: str = TOKEN["SPECLOAD_MASTER_TOKEN"],
):
    """A ``--workers 2`` master and two workers (``worker``: their command, given the master port;
    default ``specload worker``), on free ports, started once both have sent records."""
    server = sim(*SIM)
    out = tmp_path / "out"
    port = str(free_port())
    env = {**os.environ, "SPECLOAD_MASTER_TOKEN": token}
    master = procs.popen(
        specload_cmd(
            "sweep",
            "--host",
            server.url,
            "--out",
            str(out),
            "--workers",
            "2",
            "--master-bind-host",
            "127.0.0.1",
            "--master-bind-port",
            port,
            *sweep,
        ),
        env=env,
    )
    cmd = worker or specload_cmd("worker", "--master-host", "127.0.0.1", "--master-port", port)
    workers = [procs.popen([c.replace("{port}", port) for c in cmd], env=env) for _ in range(2)]
    wait_until(lambda: _started(out, 8), 90, "records from both workers")
    return master, workers, out


def test_stopping_the_master_of_two_workers_keeps_every_record(sim, procs: Procs, tmp_path: Path) -> None:
    master, _workers, out = cluster(sim, procs, tmp_path)
    os.kill(master.pid, signal.SIGTERM)  # as Kubernetes and CI stop a master Job
    master.wait(timeout=60)
    wait_until(lambda: any(p.exists() for p in out.glob("*/report.md")), 30, "report.md")
    _check_every_record_kept(out, procs.log(master))
    assert "in flight sent no record" not in procs.log(master)


def test_a_worker_stopped_by_sigterm_ships_its_records_first(sim, procs: Procs, tmp_path: Path) -> None:
    master, workers, out = cluster(sim, procs, tmp_path)
    os.kill(workers[0].pid, signal.SIGTERM)
    workers[0].wait(timeout=30)
    log = procs.log(master)
    assert "was lost with" not in log, log[-3000:]  # nothing written off: its records all came
    os.kill(master.pid, signal.SIGTERM)
    master.wait(timeout=60)
    _check_every_record_kept(out, procs.log(master))
    assert "was lost with" not in procs.log(master)
