"""The sweep owner accepts a record only for a ticket it granted to that process, shown with the
ticket's secret, and only once: a forged worker's records (or a duplicate, or a spoofed worker id)
never reach records.jsonl or the counts.

The owner imports Locust, which monkey-patches the whole process: the check runs in a child
Python (this file as a script), never in the test runner itself.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from specload.core.records import OK, make_record, read_records
from specload.core.rundir import RecordWriter
from specload.sweep.levels import SweepController, plan_levels
from specload.workload.config import Scenario

REPO = Path(__file__).resolve().parent.parent


class Runner:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, Any]] = []

    def send_message(self, kind: str, data: Any = None, client_id: Any = None) -> None:
        self.sent.append((kind, data, client_id))


def msg(data: Any, node: str) -> Any:
    return SimpleNamespace(data=data, node_id=node)


def record(seq: int) -> dict[str, Any]:
    rec = make_record(
        t_send=1.0,
        t_first=1.1,
        t_last=1.5,
        t_end=1.6,
        output_tokens=4,
        level=0,
        concurrency=1,
        phase="measure",
        seq=seq,
        backend="openai",
        status=OK,
        reason=None,
        http_status=200,
        output_tokens_source="usage",
        prompt_tokens=8,
        requested_output_tokens=4,
        requested_prompt_tokens=8,
        chunks=4,
        itl_max_s=None,
        spec_verify_ct=None,
        worker="w",
        repeat=0,
    )
    return asdict(rec)


def running_owner(tmp_path: Path) -> tuple[Any, Any]:
    """An owner whose one-level sweep (3 requests) is under way, writing into tmp_path."""
    from specload.locust.owner import SweepOwner

    env = SimpleNamespace(parsed_options=None, runner=Runner(), host="http://127.0.0.1:1")
    owner = SweepOwner(env)
    owner.levels.ctrl = SweepController(plan_levels(Scenario(levels=[1], requests=3)))
    owner.recorder.writer = RecordWriter(str(tmp_path))
    owner.active = True
    owner.ctrl.tick(1)
    return env, owner


def test_records_only_for_granted_tickets_and_once(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, __file__, str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr


def check(tmp_path: Path) -> None:
    from specload.locust.protocol import MSG_TICKET, WIRE_VERSION, RecordMsg, TicketReply

    env, owner = running_owner(tmp_path)

    def grant(node: str) -> str:
        owner.on_ticket_req(env, msg({"v": WIRE_VERSION, "uid": "u"}, node))
        kind, data, to = env.runner.sent[-1]
        assert (kind, to) == (MSG_TICKET, node)
        reply = TicketReply.from_wire(data)
        assert reply.grant is not None and len(reply.ticket) == 16
        return reply.ticket

    def send(seq: int, node: str, ticket: str) -> None:
        owner.on_record(env, msg(RecordMsg(record(seq), ticket).to_wire(), node))

    t0, t1 = grant("worker-a"), grant("worker-a")
    assert t0 != t1
    send(0, "worker-a", t0)  # granted to worker-a, with its secret: kept
    send(0, "worker-a", t0)  # the same again: ignored
    send(1, "forger", t1)  # never granted to that process: ignored
    send(1, "worker-a", "0" * 16)  # the right process and seq, the wrong secret (spoofed id): ignored
    owner.on_ticket_return(
        env, msg({"v": WIRE_VERSION, "level": 0, "phase": "measure", "seq": 1, "ticket": "x"}, "worker-a")
    )
    owner.on_record(env, msg({"v": WIRE_VERSION, "level": 0}, "forger"))  # not even a record message: ignored
    assert owner.ctrl.levels[0].granted == 2  # a forged return does not reopen a ticket
    send(1, "worker-a", t1)  # the genuine record still counts
    owner.recorder.writer.close()
    assert [r.seq for r in read_records(str(tmp_path / "records.jsonl"))] == [0, 1]
    lv = owner.ctrl.levels[0]
    assert (lv.granted, lv.received, lv.ok) == (2, 2, 2)
    assert owner.rejected == 5


def test_a_local_run_hands_tickets_and_records_over_as_objects(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, __file__, str(tmp_path), "local"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr


def check_local(tmp_path: Path) -> None:
    """The owner and the users of one process (a local run) skip the messages: the same grants,
    the same checks of each record's ticket, the same bytes in records.jsonl as a shipped dict."""
    from specload.core.records import RequestRecord
    from specload.locust.protocol import LOCAL_NODE, RecordMsg
    from specload.locust.user import UserSide

    env, owner = running_owner(tmp_path)
    side = UserSide(env.runner)
    side.local_owner, owner.local_side = owner, side
    env.specload_users = side  # the process's UserSide (user.user_side)
    side.open.set()
    side.config = object()  # type: ignore[assignment]  # any config: the ticket only needs one
    replies = [side.ticket(u) for u in ("u1", "u2")]
    assert env.runner.sent == []  # no message either way
    assert [r.grant.seq for r in replies if r is not None and r.grant is not None] == [0, 1]
    r0, r1 = replies
    assert r0 is not None and r1 is not None
    rec0 = RequestRecord.from_dict(record(0))
    side.ship(rec0, r0.ticket)  # the record itself, as the user made it
    side.ship(rec0, r0.ticket)  # the same again: ignored, as a repeated message is
    owner.on_record(env, SimpleNamespace(data=RecordMsg(record(1), r1.ticket).to_wire(), node_id=LOCAL_NODE))
    owner.recorder.writer.close()
    lines = (tmp_path / "records.jsonl").read_bytes().splitlines()
    assert len(lines) == 2 and lines[0] == lines[1].replace(b'"seq":1', b'"seq":0')  # identical bytes
    assert (owner.ctrl.levels[0].received, owner.rejected) == (2, 1)
    assert env.runner.sent == []
    env.specload_users = UserSide(env.runner)  # the process's users were made anew since the link
    owner.ticket_request(LOCAL_NODE, "u3")
    assert [(k, to) for k, _, to in env.runner.sent][-1] == ("specload_ticket", LOCAL_NODE)  # by message


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    where = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp())
    (check_local if sys.argv[2:] == ["local"] else check)(where)
    print("ok")
