"""Master-channel proofs are bound to the join: the master gives each join a fresh nonce, and the
join proof and every later proof (tickets, records, returns) are HMACs over it. Proofs captured on
the wire in one run let nobody join, or take tickets, in the next (reliability review 3a7af2e, M18:
a replayed join and ticket proof from an earlier run were taken in, given users and the run config,
and hoarded tickets until the level timed out).

The gate and the owner import Locust, which monkey-patches the whole process: the check runs in a
child Python (this file as a script), never in the test runner itself.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TOKEN = "t" * 32


def test_proofs_captured_in_one_run_fail_in_the_next() -> None:
    out = subprocess.run([sys.executable, __file__], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr


def _master() -> Any:
    from locust.runners import MasterRunner

    class FakeMaster(MasterRunner):
        def __init__(self) -> None:  # (none of Locust's sockets: the gate's calls, recorded)
            self.custom_messages: dict[str, Any] = {}
            self.sent: list[tuple[str, Any, Any]] = []
            self.handled: list[Any] = []
            self.clients: dict[str, Any] = {}
            self.environment = SimpleNamespace(
                events=SimpleNamespace(quitting=SimpleNamespace(add_listener=lambda f: None))
            )

        def handle_message(self, client_id: str, msg: Any) -> None:  # type: ignore[override]
            self.handled.append(msg)

        def register_message(self, kind: str, fn: Any, concurrent: bool = False) -> None:  # type: ignore[override]
            self.custom_messages[kind] = fn

        def send_message(self, kind: str, data: Any = None, client_id: Any = None) -> None:  # type: ignore[override]
            self.sent.append((kind, data, client_id))

        def get_worker_index(self, client_id: str) -> int:
            return 0

    return FakeMaster()


def check() -> None:
    import os

    os.environ["SPECLOAD_MASTER_TOKEN"] = TOKEN
    from locust.rpc import Message

    from specload.locust.channel import FOR_JOIN, FOR_TICKETS, proof
    from specload.locust.joingate import JoinGate
    from specload.locust.owner import SweepOwner
    from specload.locust.protocol import (
        MSG_JOIN,
        MSG_JOIN_ASK,
        MSG_JOIN_REFUSED,
        MSG_NONCE,
        JoinMsg,
        NonceMsg,
    )

    node = "vm_4b6a0000000000000000000000000000"

    def wire(runner: Any) -> list[Any]:
        """What went out on the master port (a logging proxy's capture)."""
        return list(runner.sent)

    def join(gate: JoinGate, runner: Any, auth: str | None) -> None:
        """A process's join as the wire shows it: client_ready, a nonce asked for, the join message."""
        gate.handle(node, Message("client_ready", "2.47.0", node))
        gate.on_ask(None, Message(MSG_JOIN_ASK, {"v": 3}, node))
        (kind, data, to), *_ = [m for m in runner.sent if m[0] == MSG_NONCE][-1:]
        assert (kind, to) == (MSG_NONCE, node)
        nonce = NonceMsg.from_wire(data).nonce
        given = auth if auth is not None else proof(TOKEN, node, FOR_JOIN, nonce)  # the real worker's
        gate.on_join(None, Message(MSG_JOIN, JoinMsg(given).to_wire(), node))

    # Run 1: the real worker joins; a proxy captures its join proof and a ticket proof.
    r1 = _master()
    g1 = JoinGate(r1)
    join(g1, r1, None)
    assert node in g1.proved and [m.type for m in r1.handled] == ["client_ready"]  # taken in
    nonce1 = g1.nonce_of(node)
    assert nonce1 is not None
    captured_join = proof(TOKEN, node, FOR_JOIN, nonce1)
    captured_ticket = proof(TOKEN, node, FOR_TICKETS, nonce1)
    assert wire(r1)  # (the nonce went out in clear: knowing it proves nothing)

    # Run 2, same token: a process without it replays the captured join.
    r2 = _master()
    g2 = JoinGate(r2)
    join(g2, r2, captured_join)
    assert node not in g2.proved and r2.handled == [], "a replayed join was taken in"
    assert r2.sent[-1][0] == MSG_JOIN_REFUSED and r2.sent[-1][2] == node
    assert g2.nonce_of(node) is None
    # ... and a join with no nonce asked for (the old proof form) fails too.
    g2.on_join(None, Message(MSG_JOIN, JoinMsg(proof(TOKEN, node, FOR_JOIN)).to_wire(), node))
    assert node not in g2.proved

    # The captured ticket proof is refused by run 2's owner, even under a worker id that joined.
    owner = SweepOwner(SimpleNamespace(parsed_options=None, runner=r2, host="http://127.0.0.1:1"))
    owner.nonce_of = g2.nonce_of
    r2.clients[node] = SimpleNamespace(state="ready")
    assert not owner._admitted(node, FOR_TICKETS, captured_ticket, "ticket request")
    join(g2, r2, None)  # the real worker of run 2, with the token
    nonce2 = g2.nonce_of(node)
    assert nonce2 is not None and nonce2 != nonce1
    assert not owner._admitted(node, FOR_TICKETS, captured_ticket, "ticket request")
    assert owner._admitted(node, FOR_TICKETS, proof(TOKEN, node, FOR_TICKETS, nonce2), "ticket request")
    print("ok")


if __name__ == "__main__":
    check()
