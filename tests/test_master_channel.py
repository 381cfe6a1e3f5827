"""The master port grants tickets only to the run's own workers (review ab9c161, H2).

Any local user can reach a ``--processes`` master's loopback port, and anyone on the network a
``--workers`` master's. A ZeroMQ client that asks for tickets (joined as a worker or not) must get
none: no forged record in records.jsonl or the counts, and no ticket hoarded out of a level's budget.
The same attack across machines is in tests/test_multihost.py. And the host URL's user:password
is neither in the Locust child's argv nor on the master channel (H5).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from specload.core.records import read_records
from tests.conftest import Procs, specload_cmd, wait_until

FORGER = Path(__file__).parent / "fixtures" / "ticket_forger.py"
BUDGET = 40


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(x) for x in (task / "children").read_text().split()]
    return out


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def _master_port(parent: int) -> int:
    """The private master port of a ``--processes`` sweep, read from its Locust child's argv."""
    (child,) = _children(parent)
    argv = _cmdline(child)
    return int(argv[argv.index("--master-bind-port") + 1])


@pytest.mark.parametrize(("mode", "join"), [("forge", "nojoin"), ("hoard", "join")])
def test_a_process_without_the_token_gets_no_ticket_from_a_processes_master(
    sim, procs: Procs, tmp_path: Path, mode: str, join: str
) -> None:
    """Joined or not, it gets no users, no tickets and no word of the run (the run config is in
    every state message: tests/test_master_channel.py's credential test shows it has no password)."""
    server = sim("--ttft-ms", "20", "--itl-ms", "10", "--model", "m")
    out = tmp_path / "out"
    host = server.url.replace("http://", "http://alice:hunter2pw@")
    parent = procs.popen(
        specload_cmd(
            "sweep",
            "--host",
            host,
            "--processes",
            "2",
            "--levels",
            "4",
            "--requests-per-level",
            str(BUDGET),
            "--input-tokens",
            "8",
            "--output-tokens",
            "40",
            "--metrics-interval",
            "0",
            "--out",
            str(out),
        )
    )

    def locust_child() -> int | None:
        kids = _children(parent.pid)
        return kids[0] if kids and "locust" in _cmdline(kids[0]) else None  # (exec'd, not just forked)

    wait_until(lambda: locust_child() is not None, 30, "the Locust child")
    child = locust_child()
    assert child is not None
    # H5: the password is not in the Locust child's argv (the CLI's own is what the user typed).
    assert "hunter2pw" not in " ".join(_cmdline(child))
    port = _master_port(parent.pid)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent), "FORGER_WATCH": "hunter2pw"}
    forger = procs.popen([sys.executable, str(FORGER), "127.0.0.1", str(port), mode, join, "8"], env=env)
    assert forger.wait(timeout=60) == 0, procs.log(forger)
    assert parent.wait(timeout=120) == 0, procs.log(parent)[-3000:]
    assert "granted 0" in procs.log(forger), procs.log(forger)
    heard = re.search(r"heard (\d+) state messages, secret (\w+)", procs.log(forger))
    assert heard and heard.group(2) == "no", procs.log(forger)
    log = procs.log(parent)
    # Not taken in: no users, and not a word of the run (before, a joined attacker took users).
    assert int(heard.group(1)) == 0 and "spawned 0 users" in procs.log(forger), procs.log(forger)
    if join == "join":
        assert "gets no users and no tickets until it proves the master token" in log, log[-3000:]
    assert re.search(
        r"ignored a ticket request (from a process that is not a worker|without a valid proof)", log
    )
    (run_dir,) = out.iterdir()
    lv = json.loads((run_dir / "run.json").read_text())["levels"][0]
    assert lv["status"] == "completed" and lv["granted"] == lv["received"] == BUDGET and lv["lost"] == 0, lv
    recs = [r for r in read_records(str(run_dir / "records.jsonl")) if r.phase == "measure"]
    assert len(recs) == BUDGET and not any(r.worker.startswith("FORGED") for r in recs)
    assert all(r.status == "ok" for r in recs)


def test_the_credentials_in_the_host_url_are_not_on_the_master_channel() -> None:
    """Every process that joins hears the run config: its host has no user:password."""
    from specload.locust.protocol import RunConfig
    from specload.workload.config import Scenario
    from specload.workload.prompts import PromptSource

    cfg = RunConfig(
        Scenario(), "m", "http://alice:hunter2pw@10.0.0.1:8000/v1", PromptSource("text", "common words")
    )
    wire = cfg.to_wire()
    assert "hunter2pw" not in json.dumps(wire) and "alice" not in json.dumps(wire)
    assert wire["host"] == "http://10.0.0.1:8000/v1"


def test_a_worker_refuses_to_start_without_a_master_token(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from specload.launch import run_worker
    from specload.locust.channel import MASTER_TOKEN_ENV

    monkeypatch.delenv(MASTER_TOKEN_ENV, raising=False)
    assert run_worker("127.0.0.1", 1, None) == 2
    assert MASTER_TOKEN_ENV in capsys.readouterr().err
    monkeypatch.setenv(MASTER_TOKEN_ENV, "short")
    assert run_worker("127.0.0.1", 1, None) == 2
    assert "too short" in capsys.readouterr().err


def test_proofs_are_bound_to_the_worker_and_the_ticket() -> None:
    from specload.locust.channel import proof, proven

    t = "k" * 32
    p = proof(t, "w1", "abc")
    assert proven(t, "w1", "abc", p)
    assert not proven(t, "w2", "abc", p)  # another worker's id
    assert not proven(t, "w1", "abd", p)  # another ticket
    assert not proven("j" * 32, "w1", "abc", p)  # another token
    assert not proven(None, "w1", "abc", p)  # no token: nothing is proven
