"""Faults and bad input, end to end (issue 4): every failure named, nothing lost, a run always reportable.

Each test is one row of the fault matrix in docs/faults.md: real ``specload sweep`` (or Locust) processes
against the simulator with that fault switched on, or a broken input. Where a run directory exists, the
test also checks that it is reportable afterwards (``specload report DIR`` exits 0, ``load_run`` reads it).

Speed: a sweep costs ~2 s per level whatever it sends (Locust's shape ticks once a second), so the rows
that are "one simulator fault, one sweep, then look at the results" are launched together, once per
module, by the ``batch`` fixture (one simulator per sweep, all on loopback), and each test waits only for
its own sweep. The rows that need signals, workers or several commands run on their own.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from specload.core.records import read_records
from specload.present.report import load_run
from specload.sim.process import SimProcess, start_sim
from tests.conftest import (
    SIM_START_TIMEOUT_S,
    Procs,
    free_port,
    locust_cmd,
    run_together,
    specload_cmd,
    wait_until,
)

MODEL = "m"
FAST = ("--ttft-ms", "20", "--itl-ms", "5", "--model", MODEL)
TINY = ("--input-tokens", "16", "--output-tokens", "16")
SWEEP_TIMEOUT = 90


# ------------------------------------------------------------------------------------------------ helpers


def _only_run_dir(out: Path) -> Path:
    dirs = [d for d in out.iterdir() if d.is_dir()] if out.exists() else []
    assert len(dirs) == 1, dirs
    return dirs[0]


def _meta(run_dir: Path) -> dict[str, Any]:
    return orjson.loads((run_dir / "run.json").read_bytes())


def _records(run_dir: Path) -> list[Any]:
    return read_records(str(run_dir / "records.jsonl"))


def _table(text: str) -> list[dict[str, str]]:
    """The rows of the first markdown table in ``text``, as dicts keyed by the header cells."""
    lines: list[str] = []
    for ln in text.splitlines():
        if ln.startswith("|"):
            lines.append(ln)
        elif lines:
            break  # the first table ends here (the report has more below)
    assert lines, text
    cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines]
    header, body = cells[0], cells[2:]
    return [dict(zip(header, row, strict=True)) for row in body]


def _report(run_dir: Path) -> str:
    """``specload report DIR`` must work on whatever a run left behind; returns what it printed."""
    out = subprocess.run(specload_cmd("report", str(run_dir)), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    run = load_run(run_dir)
    assert run.meta and run.levels, run_dir
    return out.stdout


def _get(url: str, context: ssl.SSLContext | None = None) -> bytes:
    with urllib.request.urlopen(url, timeout=10, context=context) as resp:
        return resp.read()


def _post(url: str, form: dict[str, str]) -> bytes:
    data = urllib.parse.urlencode(form).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as resp:
        return resp.read()


def _prompt_tokens_total(server: SimProcess, context: ssl.SSLContext | None = None) -> int:
    """The simulator's admitted-prompt-token counter: 0 means no generation request was ever served."""
    text = _get(server.url + "/metrics", context).decode()
    m = re.search(r"^sglang:prompt_tokens_total\{[^}]*\} (\d+)", text, re.M)
    assert m, text
    return int(m.group(1))


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without any API key (the developer's must never reach a test), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPECLOAD_API_KEY", "OPENAI_API_KEY")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def _sigint_default() -> None:
    """Child processes take Ctrl-C as a terminal's foreground job does, even when this test run was
    started in the background of a non-interactive shell, where SIGINT is ignored and stays ignored
    across fork and exec (Python then never raises KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _sweep(
    host: str, out: Path, *flags: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        specload_cmd("sweep", "--host", host, "--out", str(out), *flags),
        capture_output=True,
        text=True,
        timeout=SWEEP_TIMEOUT,
        env=env,
    )


def _sweep_here(
    capsys: pytest.CaptureFixture[str], host: str, out: Path, *flags: str
) -> subprocess.CompletedProcess[str]:
    """``_sweep`` for input refused before any process starts: ``specload.cli.main`` in this process
    (what ``python -m specload`` calls: its return is the exit code), its output as a process's.
    Twenty refusals, each a Python start-up of its own: a third of a second of CPU apiece saved."""
    from specload.cli import main

    capsys.readouterr()
    try:
        code = main(["sweep", "--host", host, "--out", str(out), *flags])
    except SystemExit as e:  # argparse's refusals
        code = e.code if isinstance(e.code, int) else 1
    said = capsys.readouterr()
    return subprocess.CompletedProcess([], code, said.out, said.err)


# ------------------------------------------------------------------------------------------------ the batch


@dataclass(frozen=True)
class Case:
    sim: tuple[str, ...]  # fault switches of the case's own simulator
    sweep: tuple[str, ...]  # flags of its `specload sweep`
    scenario: str | None = None  # TOML text passed as --scenario


READ_TIMEOUT = ("--read-timeout", "30")
STALL = ("--fault-stall-after", "3", "--fault-stall-s", "3", "--fault-stall-every", "2")

CASES: dict[str, Case] = {
    "http500": Case(
        ("--fault-http-status", "500", "--fault-http-every", "3"),
        ("--levels", "1,2", "--requests-per-level", "6", *READ_TIMEOUT),
    ),
    "http503": Case(
        ("--fault-http-status", "503", "--fault-http-every", "3"),
        ("--levels", "1,2", "--requests-per-level", "6", *READ_TIMEOUT),
    ),
    "http429": Case(
        ("--fault-http-status", "429", "--fault-http-every", "2"),
        ("--levels", "2", "--requests-per-level", "6", *READ_TIMEOUT),
    ),
    # From the 2nd request on: the 1st is specload's probe, which would stop the run before any load.
    "http400": Case(
        ("--fault-http-status", "400", "--fault-from", "2"),
        ("--levels", "2,4", "--requests-per-level", "200", *READ_TIMEOUT),
    ),
    "http400_probe": Case(
        ("--fault-http-status", "400"), ("--levels", "2,4", "--requests-per-level", "200", *READ_TIMEOUT)
    ),
    "cut": Case(
        ("--fault-cut-after", "5", "--fault-cut-every", "2"),
        ("--levels", "2", "--requests-per-level", "6", *READ_TIMEOUT),
    ),
    # The read timeout from the flag, and from the scenario file's field (no flag given).
    "stall_flag": Case(STALL, ("--levels", "2", "--requests-per-level", "4", "--read-timeout", "1")),
    "stall_scenario": Case(STALL, ("--levels", "2", "--requests-per-level", "4"), "read_timeout_s = 1.0\n"),
    "malformed": Case(
        ("--fault-malformed-every", "2"), ("--levels", "2", "--requests-per-level", "6", *READ_TIMEOUT)
    ),
    "omit_done": Case(
        ("--fault-omit-done", "--fault-omit-done-every", "2"),
        ("--levels", "1,2", "--requests-per-level", "4", *READ_TIMEOUT),
    ),
    "short_by": Case(
        ("--fault-short-by", "4", "--fault-short-every", "2"),
        ("--levels", "1,2", "--requests-per-level", "4", *READ_TIMEOUT),
    ),
    # C=2: 20 requests; C=4: 4 ok, then the 28th admission kills the server mid-level.
    "server_dies": Case(
        ("--fault-die-after", "28"),
        ("--levels", "2,4", "--requests-per-level", "20", "--outage-timeout", "1", *READ_TIMEOUT),
    ),
}


@dataclass
class Sweep:
    code: int
    stdout: str
    stderr: str
    out: Path
    sim: SimProcess

    @property
    def log(self) -> str:
        return self.stdout + self.stderr

    @property
    def run_dir(self) -> Path:
        return _only_run_dir(self.out)


class Batch:
    """Every CASES sweep started at once, each against its own simulator; results on demand."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sims: dict[str, SimProcess] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.done: dict[str, Sweep] = {}

    def start(self) -> None:
        with ThreadPoolExecutor(max_workers=4) as pool:
            futures = {
                key: pool.submit(start_sim, [*FAST, *case.sim], SIM_START_TIMEOUT_S)
                for key, case in CASES.items()
            }
        for key, future in futures.items():  # every one that started is kept, to be stopped by close()
            if future.exception() is None:
                self.sims[key] = future.result()
        for future in futures.values():
            future.result()  # raises the first failure to start
        for key, case in CASES.items():
            d = self.root / key
            d.mkdir()
            flags = [*TINY, *case.sweep]
            if case.scenario is not None:
                (d / "scenario.toml").write_text(case.scenario)
                flags += ["--scenario", str(d / "scenario.toml")]
            with open(d / "stdout", "wb") as so, open(d / "stderr", "wb") as se:
                cmd = specload_cmd("sweep", "--host", self.sims[key].url, "--out", str(d / "out"), *flags)
                self.procs[key] = subprocess.Popen(
                    cmd, stdout=so, stderr=se, start_new_session=True, env=_clean_env()
                )

    def result(self, key: str) -> Sweep:
        if key not in self.done:
            proc = self.procs[key]
            try:
                code = proc.wait(timeout=SWEEP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise AssertionError(f"{key}: sweep still running after {SWEEP_TIMEOUT} s") from None
            d = self.root / key
            self.done[key] = Sweep(
                code, (d / "stdout").read_text(), (d / "stderr").read_text(), d / "out", self.sims[key]
            )
        return self.done[key]

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: the CLI and its Locust child
                proc.wait()
        for server in self.sims.values():
            server.stop()


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Batch]:
    b = Batch(tmp_path_factory.mktemp("faults-batch"))
    try:
        b.start()
        yield b
    finally:
        b.close()


def _by_level(recs: list[Any]) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for r in recs:
        out.setdefault(r.level, []).append(r)
    return out


# ------------------------------------------------------------------------------------------------ HTTP errors


@pytest.mark.parametrize("status", [500, 503])
def test_http_5xx_is_a_named_failure_and_the_sweep_goes_on(batch: Batch, status: int) -> None:
    s = batch.result(f"http{status}")
    assert s.code == 0, s.log[-3000:]
    run_dir = s.run_dir
    meta = _meta(run_dir)
    assert meta["status"] == "completed"
    assert [lv["status"] for lv in meta["levels"]] == ["completed", "completed"]
    recs = _records(run_dir)
    assert len(recs) == 12  # every request of both levels: nothing lost, nothing stopped
    failed = [r for r in recs if r.status == "failed"]
    assert len(failed) == 4  # every 3rd of 12
    for r in failed:
        assert r.http_status == status
        assert re.fullmatch(rf"HTTP {status}: simulated fault: HTTP {status} on request \d+", r.reason), (
            r.reason
        )
    assert {r.level for r in failed} == {0, 1}  # the failures of level 1 did not stop level 2
    rows = _table(_report(run_dir))
    assert [(row["C"], row["Ok"], row["Fail"], row["Short"]) for row in rows] == [
        ("1", "4", "2", "0"),
        ("2", "4", "2", "0"),
    ]
    assert "429" not in rows[0]  # only rate limiting gets that column
    run = load_run(run_dir)
    assert [(lv.failed, lv.rate_limited) for lv in run.levels] == [(2, 0), (2, 0)]


def test_http_429_is_failed_and_counted_in_its_own_column(batch: Batch) -> None:
    s = batch.result("http429")
    assert s.code == 0, s.log[-3000:]
    run_dir = s.run_dir
    recs = _records(run_dir)
    failed = [r for r in recs if r.status == "failed"]
    assert len(recs) == 6 and len(failed) == 3
    assert all(
        r.http_status == 429 and r.reason.startswith("HTTP 429: simulated fault: HTTP 429") for r in failed
    )
    report = _report(run_dir)
    (row,) = _table(report)
    assert (row["Ok"], row["Fail"], row["429"]) == ("3", "3", "3")
    assert "failed: HTTP 429: simulated fault" in report  # in the failure summary too
    (lv,) = load_run(run_dir).levels
    assert lv.rate_limited == 3


def test_http_400_on_every_request_stops_early_with_one_clear_message(batch: Batch) -> None:
    s = batch.result("http400")
    assert s.code == 1, s.log[-3000:]  # ran, did not complete
    run_dir = s.run_dir
    recs = _records(run_dir)
    # The circuit breaker: 5 in a row, plus what the other user had in flight -- not 400 requests.
    assert 5 <= len(recs) <= 5 + 2, len(recs)
    assert all(r.http_status == 400 for r in recs)
    stops = [ln for ln in s.log.splitlines() if "stopping the sweep:" in ln]
    assert len(stops) == 1, stops
    # ... quoting the server's own error message.
    assert re.search(
        r"requests in a row failed with HTTP 400; last: HTTP 400: simulated fault: HTTP 400 on request \d+",
        stops[0],
    ), stops[0]
    meta = _meta(run_dir)
    assert meta["status"] == "failed" and "HTTP 400: simulated fault" in meta["reason"]
    assert [lv["status"] for lv in meta["levels"]] == ["incomplete", "pending"]  # level 2 never started
    assert all(r.level == 0 for r in recs)
    assert "c004: level marked pending" in _report(run_dir)


def test_http_400_on_the_probe_stops_before_any_load(batch: Batch) -> None:
    s = batch.result("http400_probe")
    assert s.code == 2, s.log[-3000:]  # the server refuses what specload would send: bad input
    assert not s.out.exists() or not any(s.out.iterdir())  # no run directory for a sweep that never started
    assert "the server rejected a probe prompt" in s.log and "HTTP 400: simulated fault: HTTP 400" in s.log


# ------------------------------------------------------------------------------------------------ connection


def test_connection_refused_before_the_sweep(procs: Procs, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    # Plain Locust, started alongside (specload's own retries take ~8 s): no level runs, non-zero
    # exit, the same reason in the log.
    run_dir = tmp_path / "locust-run"
    proc = procs.popen(
        locust_cmd("--headless", "--host", url, "--run-dir", str(run_dir), "--levels", "1", *TINY)
    )
    out = _sweep(url, tmp_path / "out", "--levels", "1", *TINY)
    assert out.returncode == 3, out.stdout + out.stderr
    assert f"{url}/v1/models" in out.stderr and "connection refused" in out.stderr
    assert not (tmp_path / "out").exists()  # no run directory
    assert proc.wait(timeout=60) != 0
    log = procs.log(proc)
    assert "cannot reach the server before the sweep" in log and "connection refused" in log, log[-3000:]
    assert "started: C=" not in log
    assert not (run_dir / "run.json").exists()


def test_connection_reset_mid_stream_keeps_the_tokens_received(batch: Batch) -> None:
    s = batch.result("cut")
    assert s.code == 0, s.log[-3000:]
    recs = _records(s.run_dir)
    cut = [r for r in recs if r.status == "failed"]
    assert len(recs) == 6 and len(cut) == 3
    for r in cut:
        assert r.reason.startswith("stream cut after 5 tokens"), r.reason
        # what arrived is kept, counted by the running usage of each event (continuous_usage_stats)
        assert (r.output_tokens, r.chunks, r.output_tokens_source) == (5, 5, "usage")
        assert r.ttft_s is not None and r.t_last is not None
    report = _report(s.run_dir)
    assert "3 x failed: stream cut after 5 tokens" in report


@pytest.mark.parametrize("source", ["flag", "scenario"])
def test_stall_longer_than_the_read_timeout(batch: Batch, source: str) -> None:
    s = batch.result(f"stall_{source}")
    assert s.code == 0, s.log[-3000:]
    run_dir = s.run_dir
    assert _meta(run_dir)["scenario"]["read_timeout_s"] == 1.0
    recs = _records(run_dir)
    stalled = [r for r in recs if r.status == "failed"]
    assert len(recs) == 4 and len(stalled) == 2
    for r in stalled:
        assert r.reason == "no data for 1 s (read timeout) after 3 tokens", r.reason
        assert r.output_tokens == 3
        assert 0.9 < r.e2e_s - r.ttft_s < 2.5  # gave up after ~1 s of silence, not at the 3 s stall's end
    assert "2 x failed: no data for 1 s (read timeout) after 3 tokens" in _report(run_dir)


def test_malformed_event_is_named_and_the_worker_keeps_running(batch: Batch) -> None:
    s = batch.result("malformed")
    assert s.code == 0, s.log[-3000:]
    run_dir = s.run_dir
    recs = sorted(_records(run_dir), key=lambda r: r.t_send)
    bad = [r for r in recs if r.status == "failed"]
    assert len(recs) == 6 and len(bad) == 3
    for r in bad:
        assert r.reason.startswith("malformed event after 8 tokens: "), r.reason
        assert r.reason.endswith("in line 'data: {not json'"), r.reason  # the offending line, quoted
        assert len(r.reason) < 250
    # Users carried on: requests sent after the first malformed one completed.
    first_bad = min(r.t_end for r in bad)
    assert any(r.status == "ok" and r.t_send > first_bad for r in recs)
    assert _meta(run_dir)["status"] == "completed"
    assert "3 x failed: malformed event after 8 tokens" in _report(run_dir)


@pytest.mark.parametrize(
    ("key", "reason", "tokens"),
    [
        ("omit_done", "stream ended without its terminator after 16 tokens", 16),
        ("short_by", "server counted 12 of 16 tokens asked for", 12),
    ],
)
def test_short_streams_are_not_ok_and_counted_per_level(
    batch: Batch, key: str, reason: str, tokens: int
) -> None:
    s = batch.result(key)
    assert s.code == 0, s.log[-3000:]
    run_dir = s.run_dir
    recs = _records(run_dir)
    short = [r for r in recs if r.status == "short"]
    assert len(recs) == 8 and len(short) == 4
    assert all(r.reason == reason and r.output_tokens == tokens for r in short)
    report = _report(run_dir)
    rows = _table(report)
    assert [(row["C"], row["Ok"], row["Fail"], row["Short"]) for row in rows] == [
        ("1", "2", "0", "2"),
        ("2", "2", "0", "2"),
    ]
    assert f"4 x short: {reason} (first at c001)" in report
    assert [(lv.ok, lv.short) for lv in load_run(run_dir).levels] == [(2, 2), (2, 2)]


def test_server_dies_mid_level(batch: Batch) -> None:
    s = batch.result("server_dies")
    assert s.code == 1, s.log[-3000:]
    assert s.sim.proc.wait(timeout=10) == 3  # the simulator really died (its die fault's exit status)
    run_dir = s.run_dir
    meta = _meta(run_dir)
    assert meta["status"] == "failed" and "connection refused" in meta["reason"]
    lv0, lv1 = meta["levels"]
    assert lv0["status"] == "completed" and lv1["status"] == "incomplete"
    assert "connection refused" in lv1["note"]
    recs = _by_level(_records(run_dir))
    assert len(recs[0]) == 20 and all(r.status == "ok" for r in recs[0])
    # Everything measured so far is on disk: the requests that ended before the death, the streams cut
    # by it, the refused connections that began the outage (no new request started after the first
    # refusal, so at most one per user); one record per request granted. The server counts the
    # preflight's probe and level 0's 20 requests, so the 28th admission is this level's 7th: 3 or 4
    # end ok (a user slow to start its first request can still be streaming then), the rest in flight
    # are cut (a request written as the process exits gets a connection reset instead).
    ok1 = [r for r in recs[1] if r.status == "ok"]
    refused = [r for r in recs[1] if r.reason == "connection refused"]
    died = [r for r in recs[1] if r.status != "ok" and r.reason != "connection refused"]
    shown = [(r.seq, r.status, r.reason) for r in recs[1]]
    assert 3 <= len(ok1) <= 4 and len(ok1) + len(died) in (7, 8), shown
    assert all(
        r.status == "failed"
        and (
            "stream cut after" in (r.reason or "")
            or "reset" in (r.reason or "")
            or "closed" in (r.reason or "")
        )
        for r in died
    ), shown
    assert 1 <= len(refused) <= 4 and lv1["refused"] == len(refused)
    assert any((r.reason or "").startswith("stream cut after") for r in recs[1])
    assert len(recs[1]) == lv1["granted"] == lv1["received"]
    assert "the server refused a connection (connection refused); no new request starts" in s.log
    assert "stopping the sweep: the server refused connections for 1." in s.log
    assert "(--outage-timeout 1); last: connection refused" in meta["reason"]
    report = _report(run_dir)
    assert "c004: level marked incomplete" in report and "run status is failed" in report


# ------------------------------------------------------------------------------------------------ stopping


@pytest.fixture
def groups() -> Iterator[list[int]]:
    """Process groups (sessions) a test started: whatever is left of them is killed at teardown."""
    pgids: list[int] = []
    yield pgids
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


LONG = ("--input-tokens", "16", "--output-tokens", "400", "--read-timeout", "30")  # 2 s per request at 5 ms


def _first_wave(
    path_glob: Callable[[], list[Path]], proc: subprocess.Popen[bytes], log: Callable[[], str]
) -> None:
    """Wait for the first wave's 2 records while the sweep still runs (records are flushed as they end),
    then a little more: the second wave's 2 s requests are then surely in flight."""

    def ready() -> bool:
        assert proc.poll() is None, log()[-3000:]
        return any(p.exists() and len(read_records(str(p))) >= 2 for p in path_glob())

    wait_until(ready, 60, "the first records")
    time.sleep(0.3)


def _check_interrupted(run_dir: Path, t_stop: float) -> list[Any]:
    meta = _meta(run_dir)
    assert meta["status"] == "interrupted" and meta["reason"] == "interrupted"
    assert meta["levels"][0]["status"] == "incomplete"
    recs = _records(run_dir)
    in_flight = [r for r in recs if r.t_send < t_stop < r.t_end]
    assert in_flight, "no request was in flight at the stop"
    for r in in_flight:
        # Finished within the grace period (ok), or cut at its end and recorded as interrupted.
        assert r.status == "ok" or (r.status == "failed" and r.reason.startswith("interrupted")), r
    # Nothing granted went unrecorded.
    lv = meta["levels"][0]
    assert lv["granted"] == lv["received"] == len(recs)
    assert "interrupted" in _report(run_dir)
    return recs


def test_ctrl_c_mid_sweep(sim, procs: Procs, groups: list[int], tmp_path: Path) -> None:
    server = sim(*FAST)
    out = tmp_path / "out"
    proc = procs.popen(
        specload_cmd(
            "sweep",
            "--host",
            server.url,
            "--out",
            str(out),
            "--levels",
            "2",
            "--requests-per-level",
            "8",
            *LONG,
        ),
        start_new_session=True,
        preexec_fn=_sigint_default,
    )
    groups.append(proc.pid)
    _first_wave(lambda: list(out.glob("*/records.jsonl")), proc, lambda: procs.log(proc))
    t_stop = time.time()
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
    code = proc.wait(timeout=60)
    log = procs.log(proc)
    assert code == 1, log[-3000:]
    run_dir = _only_run_dir(out)
    recs = _check_interrupted(run_dir, t_stop)
    # The default grace period (10 s) outlasts the 2 s requests in flight: they finished, nothing new started.
    assert [r.status for r in recs] == ["ok"] * 4
    assert "sweep interrupted; partial results in" in log  # the CLI says where the partial results are


def test_sigterm_mid_sweep_with_a_short_grace_period(sim, procs: Procs, tmp_path: Path) -> None:
    """SIGTERM to Locust itself; with --stop-timeout 1 the 2 s requests in flight outlive the grace period."""
    server = sim(*FAST)
    run_dir = tmp_path / "run"
    prefix = str(run_dir / "locust")
    proc = procs.popen(
        locust_cmd(
            "--headless",
            "--host",
            server.url,
            "--run-dir",
            str(run_dir),
            "--csv",
            prefix,
            "--json-file",
            prefix,
            "--levels",
            "2",
            "--requests-per-level",
            "8",
            "--stop-timeout",
            "1",
            *LONG,
        )
    )
    _first_wave(lambda: [run_dir / "records.jsonl"], proc, lambda: procs.log(proc))
    t_stop = time.time()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=60)
    log = procs.log(proc)
    assert code == 1, log[-3000:]
    assert "SIGTERM: stopping; in-flight requests get up to 1 s" in log
    recs = _check_interrupted(run_dir, t_stop)
    cut = [r for r in recs if r.status == "failed"]
    assert len(cut) == 2 and len(recs) == 4, recs
    for r in cut:
        m = re.fullmatch(r"interrupted \(test stopped\) after (\d+) tokens", r.reason)
        assert m, r.reason
        assert 0 < int(m.group(1)) == r.output_tokens < 400  # what was measured is kept
        assert 0.8 < r.t_end - t_stop < 3.0  # cut at the end of the 1 s grace period


@dataclass
class LostWorker:
    code: int
    log: str
    run_dir: Path


@pytest.fixture(scope="module")
def lost_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LostWorker]:
    """A master and two workers; one worker is killed (SIGKILL) while it has a request in flight."""
    server = start_sim(list(FAST), SIM_START_TIMEOUT_S)
    procs = Procs()
    try:
        port = free_port()
        run_dir = tmp_path_factory.mktemp("lost-worker") / "run"
        prefix = str(run_dir / "locust")
        master = procs.popen(
            locust_cmd(
                "--master",
                "--headless",
                "--expect-workers",
                "2",
                "--master-bind-host",
                "127.0.0.1",
                "--master-bind-port",
                str(port),
                "--host",
                server.url,
                "--run-dir",
                str(run_dir),
                "--csv",
                prefix,
                "--json-file",
                prefix,
                "--levels",
                "2",
                "--requests-per-level",
                "6",
                "--input-tokens",
                "16",
                "--output-tokens",
                "200",
                "--read-timeout",
                "30",
            ),
            env=_clean_env(SPECLOAD_MASTER_TOKEN="t" * 40),  # the master channel's shared token
        )
        workers = [
            procs.popen(
                locust_cmd("--worker", "--master-host", "127.0.0.1", "--master-port", str(port)),
                env=_clean_env(SPECLOAD_MASTER_TOKEN="t" * 40),  # the master channel's shared token
            )
            for _ in range(2)
        ]

        def both_sent() -> bool:
            assert master.poll() is None, procs.log(master)[-3000:]
            path = run_dir / "records.jsonl"
            return path.exists() and len({r.worker for r in read_records(str(path))}) == 2

        wait_until(both_sent, 60, "records from both workers")
        # 1 s requests, back to back: 0.3 s after its first one ended, the worker has its next in flight.
        time.sleep(0.3)
        workers[0].kill()
        code = master.wait(timeout=60)  # Locust notices the silence after ~3 missed 1 s heartbeats
        yield LostWorker(code, procs.log(master), run_dir)
    finally:
        procs.stop_all()
        server.stop()


def test_local_worker_processes_talk_over_loopback_only(procs: Procs, tmp_path: Path) -> None:
    """`--processes N`: the master port (unauthenticated) listens on 127.0.0.1 alone, on a port of
    its own, so nothing off this machine can join the run (and no stray worker of another run)."""
    import psutil

    server = start_sim(["--ttft-ms", "20", "--itl-ms", "10", "--model", "m"], SIM_START_TIMEOUT_S)
    try:
        sweep = procs.popen(
            specload_cmd(
                "sweep",
                "--host",
                server.url,
                "--processes",
                "2",
                "--levels",
                "2",
                "--requests-per-level",
                "12",
                "--input-tokens",
                "16",
                "--output-tokens",
                "40",
                "--metrics-interval",
                "0",
                "--out",
                str(tmp_path),
            )
        )
        wait_until(
            lambda: any(len(read_records(str(p))) >= 2 for p in tmp_path.glob("*/records.jsonl")),
            60,
            "the first records",
        )
        tree = [sweep.pid, *(c.pid for c in psutil.Process(sweep.pid).children(recursive=True))]
        listening = [c.laddr for c in psutil.net_connections("tcp") if c.status == "LISTEN" and c.pid in tree]
        assert listening, "the Locust master listens on no port?"
        assert all(addr.ip == "127.0.0.1" for addr in listening), listening
        assert 5557 not in {addr.port for addr in listening}  # not Locust's default port
        assert sweep.wait(timeout=60) == 0, procs.log(sweep)[-3000:]
    finally:
        server.stop()


def test_worker_killed_mid_run(lost_worker: LostWorker) -> None:
    assert lost_worker.code == 0, lost_worker.log[-3000:]
    assert "was lost with 1 request(s) in flight; they are written off" in lost_worker.log
    run_dir = lost_worker.run_dir
    meta = _meta(run_dir)
    assert meta["status"] == "completed"  # the surviving worker finished the level
    (lv,) = meta["levels"]
    assert lv["lost"] == 1 and "lost a worker" in lv["note"], lv
    assert lv["received"] == lv["granted"] == 6
    recs = _records(run_dir)
    assert len(recs) == 5 and all(r.status == "ok" for r in recs)
    _report(run_dir)


def test_report_names_the_lost_worker(lost_worker: LostWorker) -> None:
    report = _report(lost_worker.run_dir)
    assert "lost a worker" in report, report


# ------------------------------------------------------------------------------------------------ bad input


@pytest.fixture(scope="module")
def idle_sim() -> Iterator[SimProcess]:
    """A healthy simulator that bad input must never reach with a generation request."""
    server = start_sim(list(FAST), SIM_START_TIMEOUT_S)
    yield server
    server.stop()


BAD_SCENARIOS = {
    "unknown field": ("levles = [1, 2]\n", "unknown field 'levles'", "known fields:"),
    "wrong type": (
        'output_tokens = "many"\n',
        "field 'output_tokens'",
        "expected an integer >= 1, got 'many'",
    ),
    "bad level list": (
        "levels = [1, 0, 4]\n",
        "field 'levels'",
        "expected a non-empty list of positive integers",
    ),
    "bad level string": (
        'levels = "1,x"\n',
        "field 'levels'",
        "expected a comma-separated list of positive integers",
    ),
    "empty level list": ("levels = []\n", "field 'levels'", "expected a non-empty list of positive integers"),
    "not TOML": ("levels = [1,\n", "not valid TOML", ""),
    "missing file": (None, "scenario file not found", ""),
}


@pytest.mark.parametrize("case", list(BAD_SCENARIOS))
def test_bad_scenario_file(
    idle_sim: SimProcess, tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text, field, expected = BAD_SCENARIOS[case]
    path = tmp_path / "bad.toml"
    if text is not None:
        path.write_text(text)
    out = _sweep_here(capsys, idle_sim.url, tmp_path / "out", "--scenario", str(path), *TINY)
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = out.stderr.strip().splitlines()  # one message, no traceback
    assert line.startswith(f"specload: {path}: "), line  # the file ...
    assert field in line and expected in line, line  # ... the field and the expected form
    assert not (tmp_path / "out").exists()
    assert _prompt_tokens_total(idle_sim) == 0  # no traffic


def test_bad_scenario_file_plain_locust(idle_sim: SimProcess, procs: Procs, tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('output_tokens = "many"\n')
    run_dir = tmp_path / "run"
    proc = procs.popen(
        locust_cmd("--headless", "--host", idle_sim.url, "--scenario", str(path), "--run-dir", str(run_dir))
    )
    code = proc.wait(timeout=60)
    log = procs.log(proc)
    assert code == 2, log[-3000:]
    assert f"{path}: field 'output_tokens': expected an integer >= 1, got 'many'" in log
    assert not (run_dir / "run.json").exists()
    assert _prompt_tokens_total(idle_sim) == 0


BAD_FLAGS = {
    "negative concurrency": (("--levels", "1,-4"), "field 'levels'", "a non-empty list of positive integers"),
    "negative level alone": (("--levels", "-2"), "field 'levels'", "a non-empty list of positive integers"),
    "zero budget": (("--requests-per-level", "0"), "field 'requests'", "an integer >= 1"),
    "zero duration": (("--level-duration", "0"), "field 'duration_s'", "a number > 0"),
    "unknown backend": (("--backend", "tgi"), "field 'backend'", "one of openai, sglang, chat"),
    "negative read timeout": (("--read-timeout", "-1"), "field 'read_timeout_s'", "a number > 0"),
    "not a number": (("--output-tokens", "lots"), "--output-tokens", "invalid int value: 'lots'"),
}


@pytest.mark.parametrize("case", list(BAD_FLAGS))
def test_bad_flags(
    idle_sim: SimProcess, tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flags, field, expected = BAD_FLAGS[case]
    out = _sweep_here(capsys, idle_sim.url, tmp_path / "out", *TINY, *flags)
    assert out.returncode == 2, out.stdout + out.stderr
    assert field in out.stderr and expected in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "out").exists()
    assert _prompt_tokens_total(idle_sim) == 0


@pytest.mark.parametrize(
    ("flags", "named"),
    [(("--requests-per-level", "0"), "--requests-per-level"), (("--read-timeout", "-1"), "--read-timeout")],
)
def test_bad_flag_message_names_the_flag(
    idle_sim: SimProcess,
    tmp_path: Path,
    flags: tuple[str, ...],
    named: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = _sweep_here(capsys, idle_sim.url, tmp_path / "out", *TINY, *flags)
    assert out.returncode == 2
    assert named in out.stderr, out.stderr


@pytest.mark.parametrize("flags", [("--processes", "-3"), ("--workers", "0")])
def test_bad_process_flags(idle_sim: SimProcess, tmp_path: Path, flags: tuple[str, ...]) -> None:
    out = _sweep(idle_sim.url, tmp_path / "out", *TINY, "--levels", "1", *flags)
    try:
        assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
        assert flags[0] in out.stderr, out.stderr
        assert not (tmp_path / "out").exists()
    finally:
        assert _prompt_tokens_total(idle_sim) == 0  # (holds either way: Locust refuses before any traffic)


# ------------------------------------------------------------------------------------------------ API key


def _all_output(*roots: Path) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for root in roots:
        for p in root.rglob("*"):
            if p.is_file():
                found[str(p)] = p.read_bytes()
    return found


def test_api_key_is_used_and_never_written(sim, procs: Procs, tmp_path: Path) -> None:
    key = f"sk-specload-{secrets.token_hex(16)}"
    wrong = f"sk-wrong-{secrets.token_hex(16)}"
    server = sim(*FAST, "--api-key", key)
    texts: dict[str, str] = {}

    web_port = free_port()
    ui = procs.popen(
        locust_cmd(
            "--web-host",
            "127.0.0.1",
            "--web-port",
            str(web_port),
            "--host",
            server.url,
            "--results-dir",
            str(tmp_path / "ui"),
            "--read-timeout",
            "30",
        ),
        env=_clean_env(SPECLOAD_API_KEY=key),
        preexec_fn=_sigint_default,
    )

    # 1) The right key in SPECLOAD_API_KEY wins over a wrong OPENAI_API_KEY.
    # 2) OPENAI_API_KEY alone is used (the server says "incorrect", not "missing"): the probe request
    #    before the sweep is refused, so the run stops there, quoting the server, with no load sent.
    # (Both at once: neither depends on the other.)
    good, bad = run_together(
        lambda: _sweep(
            server.url,
            tmp_path / "good",
            "--levels",
            "2",
            "--requests-per-level",
            "4",
            *TINY,
            env=_clean_env(SPECLOAD_API_KEY=key, OPENAI_API_KEY=wrong),
        ),
        lambda: _sweep(
            server.url,
            tmp_path / "bad",
            "--levels",
            "2",
            "--requests-per-level",
            "20",
            "--model",
            MODEL,
            *TINY,
            env=_clean_env(OPENAI_API_KEY=wrong),
        ),
    )
    texts["good sweep"] = good.stdout + good.stderr
    assert good.returncode == 0, texts["good sweep"][-3000:]
    assert [r.status for r in _records(_only_run_dir(tmp_path / "good"))] == ["ok"] * 4

    texts["bad sweep"] = bad.stdout + bad.stderr
    assert bad.returncode == 2, texts["bad sweep"][-3000:]
    assert "HTTP 401: Incorrect API key provided" in texts["bad sweep"]
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").iterdir())

    # 3) The web UI, with a run started from it (started first: its start-up beside the sweeps).
    base = f"http://127.0.0.1:{web_port}"

    def up() -> bool:
        try:
            return b"specload" in _get(base + "/")
        except OSError:
            return False

    wait_until(up, 30, "the web UI", interval=0.2)
    form = {
        "host": server.url,
        "levels": "1",
        "output_tokens": "16",
        "input_tokens": "16",
        "requests_per_level": "4",
        "user_count": "1",
        "spawn_rate": "1",
    }
    assert orjson.loads(_post(base + "/swarm", form))["success"]
    wait_until(
        lambda: orjson.loads(_get(base + "/specload/run"))["status"] == "completed",
        60,
        "the UI sweep",
        interval=0.2,
    )
    for page in (
        "/",
        "/specload/run",
        "/stats/requests",
        "/stats/requests/csv",
        "/stats/failures/csv",
    ):
        texts[f"web UI {page}"] = _get(base + page).decode("utf-8", "replace")
    ui.send_signal(signal.SIGINT)
    ui.wait(timeout=30)
    texts["web UI log"] = procs.log(ui)
    assert [r.status for r in _records(_only_run_dir(tmp_path / "ui"))] == ["ok"] * 4

    files = _all_output(tmp_path / "good", tmp_path / "bad", tmp_path / "ui")
    assert any(name.endswith("records.jsonl") for name in files) and any(
        name.endswith("run.json") for name in files
    )
    for secret in (key, wrong):
        leaks = [name for name, data in files.items() if secret.encode() in data]
        leaks += [name for name, text in texts.items() if secret in text]
        assert not leaks, leaks


def test_refused_api_key_is_reported_before_the_sweep(sim, tmp_path: Path) -> None:
    server = sim(*FAST, "--api-key", f"sk-specload-{secrets.token_hex(16)}")
    out = _sweep(
        server.url, tmp_path / "out", "--levels", "1", *TINY, env=_clean_env(SPECLOAD_API_KEY="sk-nope")
    )
    log = out.stdout + out.stderr
    assert out.returncode != 0
    assert "HTTP 401: Incorrect API key provided" in log and "started: C=" not in log
    assert "pass --model" not in log  # the model is not the problem
    assert not (tmp_path / "out").exists()  # no run directory for a sweep that never started


# ------------------------------------------------------------------------------------------------ TLS


@pytest.fixture(scope="module")
def tls_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 / localhost, made with the openssl command."""
    if shutil.which("openssl") is None:
        pytest.skip(
            "the openssl command is not installed: cannot make a self-signed certificate for the TLS tests"
        )
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def _tls_sim(sim, tls_cert: tuple[Path, Path]) -> SimProcess:  # type: ignore[no-untyped-def]
    server = sim(*FAST, "--tls-cert", str(tls_cert[0]), "--tls-key", str(tls_cert[1]))
    assert server.url.startswith("https://127.0.0.1:"), server.url
    return server


def test_https_host_works(sim, tls_cert: tuple[Path, Path], tmp_path: Path) -> None:
    server = _tls_sim(sim, tls_cert)
    # A private CA is trusted the usual way (SSL_CERT_FILE); here the self-signed certificate is its own CA.
    out = _sweep(
        server.url,
        tmp_path / "out",
        "--levels",
        "2",
        "--requests-per-level",
        "4",
        *TINY,
        env=_clean_env(SSL_CERT_FILE=str(tls_cert[0])),
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run_dir = _only_run_dir(tmp_path / "out")
    assert _meta(run_dir)["host"] == server.url
    assert [r.status for r in _records(run_dir)] == ["ok"] * 4
    _report(run_dir)


def test_self_signed_certificate_fails_before_the_sweep(
    sim, tls_cert: tuple[Path, Path], tmp_path: Path
) -> None:
    server = _tls_sim(sim, tls_cert)
    out = _sweep(server.url, tmp_path / "out", "--levels", "1", *TINY)
    assert out.returncode == 3, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"{server.url}/v1/models" in out.stderr and "certificate verify failed" in out.stderr, out.stderr
    assert not (tmp_path / "out").exists()
    assert _prompt_tokens_total(server, ssl.create_default_context(cafile=str(tls_cert[0]))) == 0


def test_insecure_skips_verification_with_a_warning(sim, tls_cert: tuple[Path, Path], tmp_path: Path) -> None:
    server = _tls_sim(sim, tls_cert)
    out = _sweep(
        server.url, tmp_path / "out", "--insecure", "--levels", "2", "--requests-per-level", "4", *TINY
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "--insecure: the server's TLS certificate is NOT verified" in out.stderr
    run_dir = _only_run_dir(tmp_path / "out")
    assert [r.status for r in _records(run_dir)] == ["ok"] * 4
    _report(run_dir)


def test_simulator_tls_and_api_key_switches(sim, tls_cert: tuple[Path, Path]) -> None:
    """The simulator's own side of the two rows above: https, and 401 with an OpenAI-style body."""
    key = f"sk-specload-{secrets.token_hex(16)}"
    server = sim(*FAST, "--tls-cert", str(tls_cert[0]), "--tls-key", str(tls_cert[1]), "--api-key", key)
    assert server.url.startswith("https://127.0.0.1:")
    ctx = ssl.create_default_context(cafile=str(tls_cert[0]))

    def call(path: str, auth: str | None) -> tuple[int, Any]:
        req = urllib.request.Request(server.url + path, headers={"Authorization": auth} if auth else {})
        try:
            with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, orjson.loads(e.read())

    status, body = call("/v1/models", None)
    assert status == 401 and body["error"]["code"] == 401 and body["error"]["type"] == "AuthenticationError"
    assert "Missing API key" in body["error"]["message"]
    status, body = call("/v1/models", "Bearer sk-wrong")
    assert (status, body["error"]["message"]) == (
        401,
        "Incorrect API key provided",
    )  # the key is never echoed
    status, raw = call("/v1/models", f"Bearer {key}")
    assert status == 200 and orjson.loads(raw)["data"][0]["id"] == MODEL
    assert call("/health", None)[0] == 200 and call("/metrics", None)[0] == 200  # only /v1/* and /generate
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        _get(server.url + "/health")  # the default trust store does not know the self-signed certificate
    bad = subprocess.run(
        [*specload_cmd("sim"), "--port", "0", "--tls-cert", str(tls_cert[0])],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "--tls-cert and --tls-key go together" in bad.stderr
