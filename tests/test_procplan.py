"""``--processes auto`` (issue 23): the number of Locust processes from the cores and the largest
level's expected token rate, with the reason printed."""

from __future__ import annotations

import os
import subprocess

import pytest

from specload.launch import PROCESSES_AUTO, SweepSettings, auto_processes
from specload.workload.config import Scenario
from specload.workload.procplan import CORE_SHARE, STREAM_TOK_S, US_PER_REQUEST, US_PER_TOKEN, plan_processes
from tests.conftest import specload_cmd


def test_a_small_level_stays_in_one_process() -> None:
    n, why = plan_processes(Scenario(levels=[1, 4, 16], output_tokens=256), cores=8)
    assert n is None  # 1600 tok/s: 0.03 cores
    assert "C=16" in why and "1,600 tok/s" in why and "8 core(s)" in why


def test_the_count_follows_the_token_rate_and_leaves_the_master_a_core() -> None:
    sc = Scenario(levels=[1, 512], output_tokens=1000)
    tok_s = 512 * STREAM_TOK_S
    cpu = (tok_s * US_PER_TOKEN + tok_s / 1000 * US_PER_REQUEST) / 1e6
    expected = -(-cpu // CORE_SHARE)
    n, why = plan_processes(sc, cores=16)
    assert n == expected == 4, (n, cpu)  # 1.81 cores at 51,200 tok/s
    assert f"{cpu:.2f} cores" in why
    assert "1.81 cores at 35 µs a token and 400 µs a request" in why
    n, why = plan_processes(sc, cores=2)  # one core beside the master's: one process, no master
    assert n is None and "at most 1 beside the master" in why
    n, _ = plan_processes(sc, cores=3)
    assert n == 2


def test_a_rate_level_expects_its_rate_times_the_output() -> None:
    n, why = plan_processes(Scenario(rates=[200.0], output_tokens=500), cores=32)
    # 100,000 tok/s and 200 requests/s: 3.5 + 0.08 = 3.58 cores -> 8 processes
    assert n == 8 and "200 requests/s x 500 tokens" in why and "100,000 tok/s" in why


def test_settings_resolve_auto_and_say_why(capsys: pytest.CaptureFixture[str]) -> None:
    sc = Scenario(levels=[512], output_tokens=1000)
    s = auto_processes(SweepSettings(host="http://x", processes=PROCESSES_AUTO), sc, cores=16)
    assert s.processes == 4
    assert "specload: --processes auto: --processes 4: the largest level (C=512" in capsys.readouterr().err
    same = SweepSettings(host="http://x", processes=3)
    assert auto_processes(same, sc, cores=16) is same


def test_the_cli_takes_auto_and_refuses_other_words() -> None:
    out = subprocess.run(
        specload_cmd("sweep", "--host", "http://127.0.0.1:1", "--processes", "many"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "expected a count, -1 or auto, got 'many'" in out.stderr
    worker = subprocess.run(
        specload_cmd("worker", "--master-host", "127.0.0.1", "--processes", "auto"),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SPECLOAD_MASTER_TOKEN": "w" * 32},
    )
    assert worker.returncode == 2 and "--processes auto is for the master's command" in worker.stderr
