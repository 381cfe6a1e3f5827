"""A server that answers 503 while it loads its model (llama.cpp on every endpoint, SGLang and vLLM
on /health or /v1/models) is waited for before the sweep, with a line saying so and a deadline."""

from __future__ import annotations

import http.client
import json
import subprocess
import time
from pathlib import Path

import pytest

from specload.client.probe import StillLoading, wait_while_loading
from tests.conftest import Procs, specload_cmd
from tests.rundelay import RunDelay

SIM = ("--ttft-ms", "20", "--itl-ms", "5")
SMOKE = ("--levels", "1,2", "--requests-per-level", "4", "--input-tokens", "16", "--output-tokens", "8")


def _status(url: str, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_the_simulator_answers_503_loading_model_on_every_endpoint_for_the_set_time(sim) -> None:
    """llama.cpp's answer while its weights load: 503 with "Loading model", /health included."""
    server = sim(*SIM, "--loading-s", "2")
    t0 = time.monotonic()
    for path in ("/health", "/v1/models", "/metrics"):
        status, body = _status(server.url, path)
        assert status == 503, (path, status, body)
        assert json.loads(body) == {
            "error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}
        }
    while _status(server.url, "/health")[0] == 503:
        assert time.monotonic() - t0 < 10, "still loading 10 s after a 2 s load"
        time.sleep(0.05)
    assert _status(server.url, "/v1/models")[0] == 200


def test_the_wait_says_when_it_starts_and_ends_and_measures_the_load(sim) -> None:
    server = sim(*SIM, "--loading-s", "1.5")
    lines: list[str] = []
    late = RunDelay([server.proc.pid])  # (a loaded machine's wait for a CPU, here and in the server)
    waited = wait_while_loading(server.url, 30.0, lines.append, poll_s=0.1)
    # The simulator was started (and had said it listens) before the wait began: under 1.5 s left.
    assert 0.0 < waited <= 1.5 + 0.5 + late.s, (waited, late.s)
    assert lines[0].startswith("the server is loading its model (/health: HTTP 503: Loading model)"), lines
    assert lines[0].endswith("waiting up to 30 s (--loading-timeout)"), lines
    assert lines[-1].startswith("the server finished loading after "), lines
    assert len(lines) == 2, lines
    # A server that is up is not waited for, and nothing is said.
    quiet: list[str] = []
    late = RunDelay([server.proc.pid])
    assert wait_while_loading(server.url, 30.0, quiet.append) < 1.0 + late.s
    assert quiet == []


def test_the_wait_gives_up_at_its_deadline(sim) -> None:
    server = sim(*SIM, "--loading-s", "60")
    lines: list[str] = []
    t0, late = time.monotonic(), RunDelay([server.proc.pid])
    with pytest.raises(StillLoading, match=r"still loading its model after 1 s .*raise --loading-timeout"):
        wait_while_loading(server.url, 1.0, lines.append, poll_s=0.2)
    assert 1.0 <= time.monotonic() - t0 < 5.0 + late.s
    assert len(lines) == 1, lines


def test_a_sweep_started_while_the_server_loads_waits_then_runs(sim, procs: Procs, tmp_path: Path) -> None:
    # long enough that the sweep's own start (interpreter, Locust) ends inside it on a loaded machine
    server = sim(*SIM, "--loading-s", "12")
    out = tmp_path / "out"
    sweep = procs.popen(specload_cmd("sweep", "--host", server.url, "--out", str(out), *SMOKE))
    assert sweep.wait(timeout=120) == 0, procs.log(sweep)[-3000:]
    log = procs.log(sweep)
    assert "the server is loading its model (/health: HTTP 503: Loading model); waiting up to 600 s" in log
    assert "the server finished loading after" in log
    assert "pass --model" not in log
    (run,) = out.iterdir()
    assert (run / "report.md").exists()


def test_a_sweep_whose_loading_deadline_passes_stops_with_a_clear_message(
    sim, procs: Procs, tmp_path: Path
) -> None:
    server = sim(*SIM, "--loading-s", "120")
    out = tmp_path / "out"
    sweep = procs.popen(
        specload_cmd("sweep", "--host", server.url, "--out", str(out), "--loading-timeout", "2", *SMOKE)
    )
    try:
        rc = sweep.wait(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the sweep did not give up on a loading server: " + procs.log(sweep)[-3000:])
    log = procs.log(sweep)
    assert rc == 2, log[-3000:]
    assert (
        "the server was still loading its model after 2 s (/health: HTTP 503: Loading model); "
        "wait for it or raise --loading-timeout (now 2 s)" in log
    ), log[-3000:]
    assert not any(out.glob("*/records.jsonl"))  # no request was sent
