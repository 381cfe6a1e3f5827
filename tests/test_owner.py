"""The sweep owner accepts a record only for a ticket it granted to that process, and only once:
a forged worker's records (or a duplicate) never reach records.jsonl or the counts.

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

from specload.config import Scenario
from specload.levels import SweepController, plan_levels
from specload.records import OK, make_record, read_records
from specload.rundir import RecordWriter

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
        t_send=1.0, t_first=1.1, t_last=1.5, t_end=1.6, output_tokens=4, level=0, concurrency=1, phase="measure",
        seq=seq, backend="openai", status=OK, reason=None, http_status=200, output_tokens_source="usage",
        prompt_tokens=8, requested_output_tokens=4, requested_prompt_tokens=8, chunks=4, itl_max_s=None,
        spec_verify_ct=None, worker="w", repeat=0,
    )  # fmt: skip
    return asdict(rec)


def test_records_only_for_granted_tickets_and_once(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, __file__, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr


def check(tmp_path: Path) -> None:
    from specload.locust.owner import SweepOwner

    env = SimpleNamespace(parsed_options=None, runner=Runner(), host="http://127.0.0.1:1")
    owner = SweepOwner(env)
    owner.ctrl = SweepController(plan_levels(Scenario(levels=[1], requests=2)))
    owner.writer = RecordWriter(str(tmp_path))
    owner.active = True
    owner.ctrl.tick(1)
    owner.on_ticket_req(env, msg({"uid": "u1"}, "worker-a"))
    owner.on_record(env, msg(record(0), "worker-a"))  # granted to worker-a: kept
    owner.on_record(env, msg(record(0), "worker-a"))  # the same again: ignored
    owner.on_record(env, msg(record(1), "forger"))  # never granted: ignored
    owner.writer.close()
    assert [r.seq for r in read_records(str(tmp_path / "records.jsonl"))] == [0]
    lv = owner.ctrl.levels[0]
    assert (lv.granted, lv.received, lv.ok) == (1, 1, 1)
    assert owner.rejected == 2


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    check(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp()))
    print("ok")
