"""`specload ui` stopped by a signal mid-run (review ab9c161, M4, M5): run.json and report.md count
every record, the requests in flight included (they were written before the grace period's
records came), and a second Ctrl-C cuts the requests without a traceback. Started with SIGINT
ignored (a script's `&`), it still stops on Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from specload.core.records import read_records
from specload.sim.process import start_sim
from tests.conftest import Procs, wait_until
from tests.test_webui_security import Browser, start_ui

FAST = ("--ttft-ms", "20", "--itl-ms", "5", "--model", "m")


@pytest.mark.parametrize("how", ["term", "term-term", "int-int", "int-ignored"])
def test_a_signal_to_the_ui_keeps_every_record_in_run_json_and_the_report(tmp_path: Path, how: str) -> None:
    procs = Procs()
    home = start_sim(list(FAST))
    out = tmp_path / "results"
    try:
        ignore = signal.SIG_IGN if how == "int-ignored" else signal.SIG_DFL
        proc, base = start_ui(procs, home, out, "sk-x", "--no-web-auth", sigint=ignore)
        form = {
            "host": home.url,
            "levels": "2",
            "requests_per_level": "400",
            "input_tokens": "16",
            "output_tokens": "400",  # 2 s requests: the signal lands with both in flight
            "user_count": "1",
            "spawn_rate": "1",
        }
        assert Browser(base).post("/swarm", form).status == 200

        def records() -> int:
            return sum(len(read_records(str(p))) for p in out.glob("*/records.jsonl"))

        wait_until(lambda: records() >= 2, 60, "records")
        time.sleep(0.5)  # both users in the middle of a request
        if how.startswith("term"):
            os.kill(proc.pid, signal.SIGTERM)
            if how == "term-term":
                time.sleep(0.5)
                os.kill(proc.pid, signal.SIGTERM)
        else:
            os.kill(proc.pid, signal.SIGINT)
            if how == "int-int":
                time.sleep(0.5)
                os.kill(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=60)
        log = procs.log(proc)
        assert "Traceback" not in log, log[-3000:]
        assert code in (0, 1), (code, log[-2000:])
        dirs = [p for p in out.iterdir() if (p / "run.json").exists()]
        assert len(dirs) == 1, list(out.iterdir())
        run_dir = dirs[0]
        wait_until(lambda: (run_dir / "report.md").exists(), 30, "report.md")
        recs = [r for r in read_records(str(run_dir / "records.jsonl")) if r.level == 0]
        lv = json.loads((run_dir / "run.json").read_text())["levels"][0]
        assert lv["granted"] == lv["received"] == len(recs), (lv, len(recs))
        ok = sum(r.status == "ok" for r in recs)
        if how in ("int-int", "term-term"):
            assert any((r.reason or "").startswith("interrupted") for r in recs)
        else:
            assert ok == len(recs)  # the requests in flight finished within the grace period
        report = (run_dir / "report.md").read_text()
        lines = report.splitlines()
        at = next(i for i, line in enumerate(lines) if re.search(r"\|\s+Ok\s+\|", line))
        head = [c.strip() for c in lines[at].split("|")]
        row = [c.strip() for c in lines[at + 2].split("|")]
        assert row[head.index("Ok")] == str(ok), (head, row)
    finally:
        procs.stop_all()
        home.stop()
