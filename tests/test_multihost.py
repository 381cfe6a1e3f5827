"""Several client machines, for real: a master, two workers and the server on four hosts of their
own (network namespaces joined by veth links, tests/netns.py), with the commands the README gives.

One worker's clock runs 250 ms ahead (libfaketime); the other worker's machine dies mid-level (every
process of it killed at once); a fifth host forges records and ticket returns on the master port. The sweep must still keep exact budgets, ship every record of both
workers, write off what died in flight, keep the level's concurrency with the surviving worker,
record both clock offsets and say all of it in the log, run.json and the report.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from specload.core.records import RequestRecord, read_records
from tests import netns
from tests.conftest import Procs, specload_cmd, wait_until

why_not = netns.unavailable()
pytestmark = [
    pytest.mark.slow,  # make test-slow: a minute of hosts, heartbeats and a lost worker
    pytest.mark.skipif(why_not is not None, reason=f"separate hosts: {why_not}"),
]

SERVER_PORT, MASTER_PORT = 8000, 5557
FORGER = Path(__file__).parent / "fixtures" / "forger.py"
TICKET_FORGER = Path(__file__).parent / "fixtures" / "ticket_forger.py"
TOKEN = "t" * 40  # SPECLOAD_MASTER_TOKEN, the same on the master and both workers (docs/deploy.md)
BUDGET = 40
SKEW_S = 0.25


def faketime_env(offset_s: float) -> dict[str, str] | None:
    """The environment that runs a process with its wall clock ``offset_s`` off (monotonic untouched)."""
    try:
        import libfaketime
    except ImportError:
        return None
    _, env = libfaketime.get_reload_information()
    return {**env, "FAKETIME": f"{offset_s:+g}"}


@dataclass
class Cluster:
    code: int
    log: str
    run_dir: Path
    hosts: dict[str, str]
    killed_at: float
    skewed: bool
    server_log: str
    ticket_forger_log: str


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    net = netns.Network()
    procs = Procs()
    try:
        server, master_addr = net.host("server"), net.host("master")
        net.host("worker1"), net.host("worker2"), net.host("intruder")
        sim = procs.popen(
            net.run_in(
                "server",
                [
                    sys.executable,
                    "-m",
                    "specload.sim",
                    "--host",
                    server,
                    "--port",
                    str(SERVER_PORT),
                    "--ttft-ms",
                    "20",
                    "--itl-ms",
                    "10",
                    "--model",
                    "m",
                    "--access-log",
                ],
            )
        )
        wait_until(lambda: "listening on" in procs.log(sim), 20, "the server")
        out = tmp_path_factory.mktemp("multihost") / "results"
        # The README's commands, each on its own host.
        master = procs.popen(
            net.run_in(
                "master",
                specload_cmd(
                    "sweep",
                    "--host",
                    f"http://{server}:{SERVER_PORT}",
                    "--workers",
                    "2",
                    "--master-bind-host",
                    master_addr,
                    "--master-bind-port",
                    str(MASTER_PORT),
                    "--levels",
                    "2,4",
                    "--requests-per-level",
                    str(BUDGET),
                    "--input-tokens",
                    "16",
                    "--output-tokens",
                    "40",
                    "--metrics-interval",
                    "0.5",
                    "--out",
                    str(out),
                ),
            ),
            env={**os.environ, "SPECLOAD_MASTER_TOKEN": TOKEN},
        )
        worker = specload_cmd("worker", "--master-host", master_addr, "--master-port", str(MASTER_PORT))
        skew = faketime_env(SKEW_S)
        token = {"SPECLOAD_MASTER_TOKEN": TOKEN}
        procs.popen(net.run_in("worker1", worker), env={**os.environ, **(skew or {}), **token})
        procs.popen(net.run_in("worker2", worker), env={**os.environ, **token})

        def worker2_mid_request() -> bool:
            """0.41 s requests back to back: 0.1-0.3 s after one ended, the next is in flight."""
            assert master.poll() is None, procs.log(master)[-3000:]
            recs = [r for p in out.glob("*/records.jsonl") for r in read_records(str(p))]
            mine = [r.t_end for r in recs if r.level == 0 and r.worker.startswith("worker2_")]
            return len(mine) >= 3 and 0.1 < time.time() - max(mine) < 0.3

        def worker1_id() -> str | None:
            recs = [r for p in out.glob("*/records.jsonl") for r in read_records(str(p))]
            return next((r.worker for r in recs if r.worker.startswith("worker1_")), None)

        wait_until(lambda: worker1_id() is not None, 60, "worker1's first record")
        intruder = procs.popen(
            net.run_in(
                "intruder",
                [
                    sys.executable,
                    str(FORGER),
                    master_addr,
                    str(MASTER_PORT),
                    str(worker1_id()),
                ],
            )
        )
        assert intruder.wait(timeout=30) == 0, procs.log(intruder)
        # Meanwhile a process asks for real tickets (review ab9c161, H2), with a made-up token proof.
        asker = procs.popen(
            net.run_in(
                "intruder",
                [sys.executable, str(TICKET_FORGER), master_addr, str(MASTER_PORT), "forge", "nojoin", "4"],
            )
        )

        def worker2_clock_known() -> bool:
            """The master has had a quiet round trip with worker2 (it re-measures every few seconds:
            on a loaded machine a worker busy spawning users answers its first pings late)."""
            metas = [orjson.loads(p.read_bytes()) for p in out.glob("*/run.json")]
            return any(
                x["worker"].startswith("worker2_") and x["rtt_ms"] < 20
                for m in metas
                for x in m.get("clients", ())
            )

        wait_until(worker2_clock_known, 60, "a measurement of worker2's clock")
        wait_until(worker2_mid_request, 60, "worker2 in the middle of a request")
        killed_at = time.time()
        assert net.kill_host("worker2"), "worker2 had no process to kill"
        code = master.wait(timeout=120)  # Locust notices the silence after ~3 missed 1 s heartbeats
        assert asker.wait(timeout=30) == 0, procs.log(asker)
        (run_dir,) = list(out.iterdir())
        yield Cluster(
            code,
            procs.log(master),
            run_dir,
            dict(net.hosts),
            killed_at,
            skew is not None,
            procs.log(sim),
            procs.log(asker),
        )
    finally:
        procs.stop_all()
        net.close()


def _records(c: Cluster) -> list[RequestRecord]:
    return read_records(str(c.run_dir / "records.jsonl"))


def _meta(c: Cluster) -> dict:  # type: ignore[type-arg]
    return json.loads((c.run_dir / "run.json").read_text())


def _lost_worker(c: Cluster) -> str:
    line = next(x for x in c.log.splitlines() if "was lost with" in x)
    return line.split("worker ", 1)[1].split(" was lost", 1)[0]


def test_the_sweep_completes_with_exact_budgets_and_every_record_shipped(cluster: Cluster) -> None:
    c = cluster
    assert c.code == 0, c.log[-4000:]
    meta = _meta(c)
    assert meta["status"] == "completed" and meta["mode"] == "master"
    lv0, lv1 = meta["levels"]
    assert lv0["lost"] == 1 and lv1["lost"] == 0, meta["levels"]
    for lv in (lv0, lv1):
        assert lv["status"] == "completed" and lv["granted"] == lv["received"] == BUDGET, lv
    recs = [r for r in _records(c) if r.phase == "measure"]
    by_level = {0: [r for r in recs if r.level == 0], 1: [r for r in recs if r.level == 1]}
    assert len(by_level[0]) == BUDGET - 1 and len(by_level[1]) == BUDGET  # one lost in flight, nothing else
    assert all(r.status == "ok" for r in recs), [r.reason for r in recs if r.status != "ok"]
    lost = _lost_worker(c)
    assert lost.startswith("worker2_")
    assert {r.worker for r in by_level[0]} == {lost, *({r.worker for r in by_level[1]})}
    assert lost not in {r.worker for r in by_level[1]}  # the next level ran on the survivor alone
    # Every record the lost worker finished reached the master before it died.
    assert all(r.t_end < c.killed_at + 0.05 for r in by_level[0] if r.worker == lost)


def test_a_process_asking_for_tickets_without_the_token_gets_none(cluster: Cluster) -> None:
    c = cluster
    assert "granted 0" in c.ticket_forger_log, c.ticket_forger_log
    assert (
        "ignored a ticket request from a process that is not a worker of this master from FORGED_forge"
        in c.log
    )
    assert not any(r.worker.startswith("FORGED") for r in _records(c))


def test_a_forger_on_the_master_port_cannot_add_or_return_requests(cluster: Cluster) -> None:
    """480 forged records and ticket returns, under the forger's own id and a real worker's, with
    guessed sequence numbers: none counted, none written, the budgets exact (checked above too)."""
    c = cluster
    assert not [r for r in _records(c) if r.worker == "forged"]
    # Not a worker of this master (it never joined): refused before its ticket is even looked at.
    assert "ignored a record from a process that is not a worker of this master from forger_0" in c.log
    assert "ignored a ticket return from a process that is not a worker of this master from forger_0" in c.log
    assert "from forger_0; more from it are counted, not logged" in c.log  # three lines, not 240
    assert sum("ignored a " in line and "from forger_0" in line for line in c.log.splitlines()) == 3
    # The spoofed id: a real worker's name, without the master token's proof.
    assert "ignored a record without a valid proof of the master token from worker1_" in c.log
    assert re.search(r"ignored \d+ message\(s\) in all from FORGED_forge, forger_0, worker1_", c.log)
    assert [lv["granted"] for lv in _meta(c)["levels"]] == [BUDGET, BUDGET]


def test_the_lost_workers_requests_are_written_off_and_its_users_taken_over(cluster: Cluster) -> None:
    c = cluster
    lost = _lost_worker(c)
    assert f"worker {lost} was lost with 1 request(s) in flight; they are written off" in c.log
    assert "the remaining 1 worker(s) take over its users: 2 in all" in c.log, c.log[-4000:]
    lv0 = _meta(c)["levels"][0]
    assert lv0["note"] == f"lost a worker ({lost}): 1 request(s) in flight never reported"
    # After the take-over the survivor runs both of the level's users: its requests overlap.
    survivor = [r for r in _records(c) if r.level == 0 and r.worker != lost and r.t_send > c.killed_at + 4]
    overlaps = sum(1 for a in survivor for b in survivor if a is not b and a.t_send < b.t_send < a.t_end)
    assert survivor and overlaps > 0, [(r.t_send, r.t_end) for r in survivor]


def test_each_workers_clock_offset_is_recorded_and_a_skewed_one_warned_about(cluster: Cluster) -> None:
    c = cluster
    if not c.skewed:
        pytest.skip("libfaketime is not installed (pip install 'specload[dev]')")
    clients = {x["worker"]: x for x in _meta(c)["clients"]}
    assert len(clients) == 2, clients
    lost = _lost_worker(c)
    (skewed,) = [w for w in clients if w != lost]
    # Within the estimate's own bound (half the tightest round trip), which must itself be small.
    for worker, true_offset_ms in ((skewed, SKEW_S * 1e3), (lost, 0.0)):
        clock = clients[worker]
        assert clock["rtt_ms"] < 20.0 and clock["samples"] >= 5, clients
        assert abs(clock["offset_ms"] - true_offset_ms) <= 1.0 + clock["rtt_ms"] / 2, clients
    # The warning prints an estimate and its bound: 249.8 is as right as 250.3 (not a "25" prefix).
    said = re.compile(
        re.escape(f"worker {skewed}'s clock is ") + r"([0-9.]+) ms ahead of the master's \(±([0-9.]+) ms\)"
    )
    report = (c.run_dir / "report.md").read_text()
    for text in (c.log, report):
        m = said.search(text)
        assert m, text[-4000:]
        assert abs(float(m.group(1)) - SKEW_S * 1e3) <= 1.0 + float(m.group(2)) + 0.05, m.group(0)
    assert "sync the clocks" in report
    assert "lost a worker" in report


def test_the_load_came_from_the_worker_hosts_not_the_master(cluster: Cluster) -> None:
    """The server's own view: the measured requests came from both workers' addresses; the master
    asked only its questions before the sweep (models, server info, tokenize, metrics, and the
    one probe request that measures the prompt overhead)."""
    c = cluster
    lines = c.server_log.splitlines()
    gen = [line.split()[0] for line in lines if '"POST /v1/completions' in line]
    by_host = {addr: gen.count(addr) for addr in set(gen)}
    assert by_host.pop(c.hosts["master"], 0) == 1, by_host  # the probe
    assert set(by_host) == {c.hosts["worker1"], c.hosts["worker2"]}, by_host
    assert sum(by_host.values()) == 2 * BUDGET, by_host  # the lost request reached the server too
    assert {r.worker.split("_")[0] for r in _records(c)} == {"worker1", "worker2"}
