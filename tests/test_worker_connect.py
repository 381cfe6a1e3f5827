"""A worker whose master does not answer names it within 10 s (Locust alone: 30 s of silence)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from specload.locust.masterwait import GIVE_UP_S, unanswered_message
from tests.conftest import Procs, free_port, specload_cmd, wait_until

TOKEN = {"SPECLOAD_MASTER_TOKEN": "t" * 40}


def test_a_worker_whose_master_is_not_there_says_so_within_10_s(procs: Procs) -> None:
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    worker = procs.popen(
        specload_cmd("worker", "--master-host", "127.0.0.1", "--master-port", str(port)),
        env={**os.environ, **TOKEN},
    )
    said = f"the master at 127.0.0.1:{port} has not answered in 5 s"
    wait_until(lambda: said in procs.log(worker), 20, "the worker's line about its master")
    # 5 s after the runner starts connecting; the rest is the interpreter's and Locust's start-up
    assert time.monotonic() - t0 < 15, procs.log(worker)
    log = procs.log(worker)
    assert "SPECLOAD_MASTER_TOKEN" in log and f"--master-bind-port {port}" in log
    assert worker.poll() is None  # it keeps trying: the master may be starting


def test_an_unresolvable_master_name_is_called_so() -> None:
    text = unanswered_message("no-such-host.invalid", 5557, 5.0)
    assert text.startswith(
        "no master at no-such-host.invalid:5557: the name 'no-such-host.invalid' does not resolve"
    )
    assert "check --master-host" in text
    text = unanswered_message("127.0.0.1", 5557, 35.0)
    assert text.startswith("the master at 127.0.0.1:5557 has not answered in 35 s")


def test_the_give_up_time_is_locusts() -> None:
    # (in a child: importing Locust monkey-patches this process)
    code = "from locust.runners import CONNECT_RETRY_COUNT as n, CONNECT_TIMEOUT as t; print(n * t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert float(out.stdout) == GIVE_UP_S
