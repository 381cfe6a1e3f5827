"""Real sweeps: real Locust processes against the simulator started as a separate process.

The simulator's timing is exact (TTFT, inter-token interval, no queueing below its cap), so every
figure has a known expected value. Tolerances are stated where they are used.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from pathlib import Path

import orjson
import pytest

from specload.core.records import read_records
from specload.present.report import Run, load_run
from tests.conftest import Procs, free_port, locust_cmd, specload_cmd, wait_until
from tests.rundelay import RunDelay, client_lateness_s

TTFT_S = 0.200
ITL_S = 0.010
OUT = 50
INP = 64
LEVELS = [1, 4, 16, 32]
# The sweeps through several Locust processes check what the processes change (both send, tickets
# and levels stay exact, the figures hold): two levels show it at a third of the client CPU that C=32
# streaming costs; the local sweep keeps all four.
LEVELS_PROCESSES = [4, 16]
BUDGET = {1: 4, 4: 8, 16: 32, 32: 64}  # the reference rule max(4, 2*C)
SIM_ARGS = ("--ttft-ms", "200", "--itl-ms", "10", "--max-running", "64", "--model", "m")

E2E_S = TTFT_S + (OUT - 1) * ITL_S  # 0.69 s
PER_REQ = OUT / E2E_S  # 72.46 tok/s
TOL = 0.02  # 2 %: the client and the simulator share two cores
# All C requests of a level start together, and the simulator and the client serve that burst one
# request at a time: on this project's 2-vCPU machines the median first token comes up to ~0.22 ms
# later per simultaneous request (C=32: 207 ms for 200; measured at d1d32bb and after), and with
# three Locust processes and the simulator on two cores, up to ~0.8 ms. That burst cost is allowed on
# top of the 2 % for TTFT, per-request and aggregate tok/s; TPOT, which no burst touches, keeps 2 %.
# (Making the client cheaper is its own work: issue 'Numbers you can trust', client cost.)
BURST_LOCAL_S = 0.0005
BURST_PROCESSES_S = 0.0015


def _sweep_flags(out_dir: Path, levels: list[int]) -> list[str]:
    return [
        "--levels",
        ",".join(map(str, levels)),
        "--input-tokens",
        str(INP),
        "--output-tokens",
        str(OUT),
        "--read-timeout",
        "30",
        "--out",
        str(out_dir),
    ]


def _run_dir(out_dir: Path) -> Path:
    dirs = [d for d in out_dir.iterdir() if d.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def _within(value: float | None, lo: float, hi: float) -> bool:
    return value is not None and lo * (1 - TOL) <= value <= hi * (1 + TOL)


def _emitted_tpot_p50(log: Path, run: Run) -> dict[int, float]:
    """Per level, the median TPOT of the streams as the simulator sent them (its --emission-log):
    (last token event - first) / (tokens after the first event), on the simulator's clock. A stream
    belongs to the level whose measured requests' wall-clock span holds its first event (the
    simulator's clock is CLOCK_MONOTONIC, as this process's perf_counter)."""
    to_wall = time.time() - time.perf_counter()
    spans = {}
    for r in run.records:
        if r.phase == "measure" and r.t_end is not None:
            lo, hi = spans.get(r.level, (r.t_send, r.t_end))
            spans[r.level] = (min(lo, r.t_send), max(hi, r.t_end))
    tpots: dict[int, list[float]] = {}
    for line in log.read_text().splitlines():
        e = orjson.loads(line)
        if not e["complete"] or e["tokens"] != OUT:
            continue
        t = e["t_first"] + to_wall
        for level, (lo, hi) in spans.items():
            if lo - 0.05 <= t <= hi + 0.05:
                tpots.setdefault(level, []).append(
                    (e["t_last"] - e["t_first"]) / (e["tokens"] - e["first_tokens"])
                )
    return {level: statistics.median(v) for level, v in tpots.items()}


def _check_levels(
    run: Run,
    burst_s: float = BURST_LOCAL_S,
    planned: list[int] = LEVELS,
    server_wait_s: float = 0.0,
    emitted_tpot: dict[int, float] | None = None,
) -> None:
    """Every level's figures against the simulator's exact ones. ``server_wait_s``: how long the
    simulator waited for a CPU during the sweep (tests/rundelay.py); with what the client measured of
    its own lag in each level, what a loaded machine may add to a latency (0 on a quiet one).
    ``emitted_tpot``: per level, the TPOT p50 of the streams as the simulator sent them; TPOT is
    held to it, since a first token sent late (its deadline missed under load) is followed by the
    next ones on time, which shortens the request's TPOT below the configured ITL."""
    levels = run.levels
    assert [lv.concurrency for lv in levels] == planned
    for lv in levels:
        c = lv.concurrency
        assert (lv.sent, lv.ok, lv.failed, lv.short) == (BUDGET[c], BUDGET[c], 0, 0), lv
        assert lv.output_tokens == BUDGET[c] * OUT
        late = server_wait_s + client_lateness_s(run, lv.index or 0)
        burst = burst_s * c + late
        assert _within(lv.figure("ttft_p50"), TTFT_S * 1000, (TTFT_S + burst) * 1000), (
            c,
            lv.figure("ttft_p50"),
            burst,
        )
        assert _within(lv.per_req_tok_s, OUT / (E2E_S + burst), PER_REQ), (c, lv.per_req_tok_s, burst)
        if emitted_tpot is None:
            assert _within(lv.figure("tpot_p50"), ITL_S * 1000, (ITL_S + late / (OUT - 1)) * 1000), (
                c,
                lv.figure("tpot_p50"),
            )
        else:
            # The client's TPOT is the simulator's as sent, give or take how late the client read
            # the first and the last event (its lag, and the simulator's wait between noting an
            # event's time and writing it), spread over the tokens after the first.
            sent = emitted_tpot[lv.index or 0]
            slack = ITL_S * TOL + late / (OUT - 1)
            assert lv.figure("tpot_p50") is not None, c
            assert abs(lv.figure("tpot_p50") / 1000 - sent) <= slack, (
                c,
                lv.figure("tpot_p50"),
                sent * 1000,
                slack * 1000,
            )
            # and the simulator kept its ITL to within how late a burst and the machine's load made it
            assert abs(sent - ITL_S) <= ITL_S * TOL + burst / (OUT - 1), (c, sent, burst)
        # Closed loop, all C users start together and nothing queues: budget/C back-to-back waves.
        waves = max(1, BUDGET[c] // c)
        expected_agg = BUDGET[c] * OUT / (waves * E2E_S)
        # The wall is the waves' requests plus the time the users spent between them (their share of
        # the wall not in flight, measured: 1 - mean in flight / C). The requests are the simulator's
        # exact timing; the time between them is the client's on a machine that may be loaded (a
        # tight bound on it belongs in make bench), so it is measured here, and only bounded loosely.
        idle = (lv.wall_s or 0.0) * (1 - (lv.mean_concurrency or 0.0) / c)
        slowest = BUDGET[c] * OUT / (waves * (E2E_S + burst) + idle)
        assert _within(lv.agg_tok_s, slowest, expected_agg), (c, lv.agg_tok_s, expected_agg, idle)
        assert _within(lv.mean_concurrency, 0.85 * c, c), (c, lv.mean_concurrency)


def _check_run_files(run_dir: Path, planned: list[int] = LEVELS) -> None:
    meta = orjson.loads((run_dir / "run.json").read_bytes())
    assert meta["status"] == "completed"
    assert [lv["status"] for lv in meta["levels"]] == ["completed"] * len(planned)
    recs = read_records(str(run_dir / "records.jsonl"))
    assert all(r.output_tokens_source == "usage" for r in recs)
    assert all(r.prompt_tokens == INP for r in recs)
    # No request straddles two levels: each level's sends start after the previous level's last end.
    by_level: dict[int, list] = {}
    for r in recs:
        by_level.setdefault(r.level, []).append(r)
    for i in range(1, len(planned)):
        assert min(r.t_send for r in by_level[i]) >= max(r.t_end for r in by_level[i - 1])
    # Every prompt distinct per request is checked in unit tests; here each (level, seq) is unique.
    assert len({(r.level, r.phase, r.seq) for r in recs}) == len(recs)
    assert (run_dir / "report.md").exists()
    # Locust's own statistics count the real requests and nothing else (no pseudo-request rows).
    entries = orjson.loads((run_dir / "locust.json").read_bytes())
    assert {e["method"] for e in entries} == {"POST"}
    assert sum(e["num_requests"] for e in entries) == len(recs)


def _sweep_and_check(
    sim, tmp_path: Path, *extra: str, burst_s: float = BURST_LOCAL_S, planned: list[int] = LEVELS
) -> tuple[subprocess.CompletedProcess[str], Run]:  # type: ignore[no-untyped-def]
    """`specload sweep` against the exact simulator, then every figure and file checked."""
    emissions = tmp_path / "emitted.jsonl"
    server = sim(*SIM_ARGS, "--emission-log", str(emissions))
    waited = RunDelay([server.proc.pid], this_thread=False)
    out = subprocess.run(
        specload_cmd("sweep", "--host", server.url, *extra, *_sweep_flags(tmp_path, planned)),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run_dir = _run_dir(tmp_path)
    run = load_run(run_dir)
    _check_levels(run, burst_s, planned, waited.s, _emitted_tpot_p50(emissions, run))
    _check_run_files(run_dir, planned)
    return out, run


def test_headless_sweep_local(sim, tmp_path: Path) -> None:
    out, run = _sweep_and_check(sim, tmp_path)
    assert run.crosscheck == [], run.crosscheck  # Locust's own counts agree with the records
    # Progress lines: one as each level starts and one as it ends.
    log = out.stdout + out.stderr
    assert log.count("started: C=") == len(LEVELS) and log.count(" done: ") == len(LEVELS)
    assert "| Agg tok/s" in out.stdout or "Agg tok/s" in out.stdout


def test_headless_sweep_two_processes(sim, tmp_path: Path) -> None:
    _out, run = _sweep_and_check(
        sim, tmp_path, "--processes", "2", burst_s=BURST_PROCESSES_S, planned=LEVELS_PROCESSES
    )
    workers = {r.worker for r in run.records}
    assert len(workers) == 2 and "local" not in workers  # both worker processes sent load


@pytest.mark.slow  # the same master and two workers as --processes 2 above, started by hand: make test-slow
def test_master_and_two_workers(sim, procs: Procs, tmp_path: Path) -> None:
    emissions = tmp_path / "emitted.jsonl"
    server = sim(*SIM_ARGS, "--emission-log", str(emissions))
    waited = RunDelay([server.proc.pid], this_thread=False)
    port = free_port()
    run_dir = tmp_path / "run"
    prefix = str(run_dir / "locust")
    token = {**os.environ, "SPECLOAD_MASTER_TOKEN": "t" * 40}  # the master channel's shared token
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
            ",".join(map(str, LEVELS_PROCESSES)),
            "--input-tokens",
            str(INP),
            "--output-tokens",
            str(OUT),
            "--read-timeout",
            "30",
        ),
        env=token,
    )
    for _ in range(2):
        procs.popen(
            locust_cmd("--worker", "--master-host", "127.0.0.1", "--master-port", str(port)), env=token
        )
    code = master.wait(timeout=180)
    assert code == 0, procs.log(master)[-4000:]
    run = load_run(run_dir)
    _check_levels(run, BURST_PROCESSES_S, LEVELS_PROCESSES, waited.s, _emitted_tpot_p50(emissions, run))
    _check_run_files(run_dir, LEVELS_PROCESSES)
    assert len({r.worker for r in run.records}) == 2
    assert run.meta["mode"] == "master"


def _get(url: str) -> bytes:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read()


def _post(url: str, form: dict[str, str]) -> bytes:
    import urllib.parse
    import urllib.request

    data = urllib.parse.urlencode(form).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as resp:
        return resp.read()


def _check_ui_run_dir(run_dir: Path) -> None:
    """A web UI run's directory is complete when the run has ended: its final run.json, Locust's
    counts (the requests sent, nothing else) and report.md, written by a child of the UI's process."""
    assert orjson.loads((run_dir / "run.json").read_bytes())["status"] in ("completed", "interrupted")
    wait_until(lambda: (run_dir / "report.md").exists(), 30, f"report.md in {sorted(os.listdir(run_dir))}")
    entries = orjson.loads((run_dir / "locust.json").read_bytes())
    assert {e["method"] for e in entries} == {"POST"}
    assert sum(e["num_requests"] for e in entries) == len(read_records(str(run_dir / "records.jsonl")))
    assert load_run(run_dir).crosscheck == []


def test_web_ui_start_stop_and_report(sim, procs: Procs, tmp_path: Path) -> None:
    server = sim(*SIM_ARGS)
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
            str(tmp_path),
            "--label",
            "ui",
            "--read-timeout",
            "30",
        )
    )
    base = f"http://127.0.0.1:{web_port}"

    def _up() -> bool:
        try:
            return b"specload" in _get(base + "/")
        except OSError:
            return False

    wait_until(_up, 30, "the web UI")  # the start form carries specload's options
    home = _get(base + "/").decode()
    assert "output_tokens" in home and "levels" in home and "run_dir" not in home  # paths hidden

    # 0) A bad value is refused before anything starts, naming the form's field.
    form = {
        "host": server.url,
        "levels": "1,x",
        "output_tokens": str(OUT),
        "input_tokens": str(INP),
        "requests_per_level": "4",
        "user_count": "1",
        "spawn_rate": "1",
    }
    reply = orjson.loads(_post(base + "/swarm", form))
    assert reply["success"] is False and reply["message"].startswith("start form: field 'Levels': expected")
    assert orjson.loads(_get(base + "/stats/requests"))["state"] == "ready" and os.listdir(tmp_path) == []

    # 1) A whole sweep started from the form, with options edited there.
    form["levels"] = "1,2"
    assert orjson.loads(_post(base + "/swarm", form))["success"]
    run = wait_until(
        lambda: (r := orjson.loads(_get(base + "/specload/run")))["status"] == "completed" and r,
        60,
        "the UI sweep to complete",
    )
    first_dir = Path(run["run_dir"])
    stats = orjson.loads(_get(base + "/stats/requests"))
    levels_tab = next(t for t in stats["extended_stats"] if t["key"] == "specload-levels")["data"]
    assert [row["requests"] for row in levels_tab] == ["4/4", "4/4"]
    wait_until(
        lambda: orjson.loads(_get(base + "/stats/requests"))["state"] == "stopped", 30, "Locust to stop"
    )
    _check_ui_run_dir(first_dir)  # complete as soon as the run ended, not only when Locust quits
    report = subprocess.run(
        specload_cmd("report", str(first_dir)), capture_output=True, text=True, timeout=60
    )
    assert report.returncode == 0, report.stderr
    lv = load_run(first_dir).levels
    assert [(x.concurrency, x.ok) for x in lv] == [(1, 4), (2, 4)]
    assert lv[0].per_req_tok_s == pytest.approx(PER_REQ, rel=TOL)

    # 2) A second sweep stopped through the HTTP API mid-level: a new run directory, marked interrupted.
    form.update({"levels": "2", "requests_per_level": "400"})
    assert orjson.loads(_post(base + "/swarm", form))["success"]

    def _second() -> dict | None:
        r = orjson.loads(_get(base + "/specload/run"))
        return r if r["run_dir"] != str(first_dir) and r["levels"] and r["levels"][0]["ok"] >= 2 else None

    run2 = wait_until(_second, 60, "the second sweep to make progress")
    reply = orjson.loads(_post(base + "/swarm", form))  # one sweep at a time
    assert reply["success"] is False and "a sweep is running" in reply["message"]
    _post(base + "/stop", {})
    second_dir = Path(run2["run_dir"])
    meta = wait_until(
        lambda: (m := orjson.loads((second_dir / "run.json").read_bytes()))["status"] != "running" and m,
        30,
        "run.json to be closed",
    )
    assert meta["status"] == "interrupted"
    assert meta["levels"][0]["status"] == "incomplete"
    wait_until(
        lambda: orjson.loads(_get(base + "/stats/requests"))["state"] == "stopped", 30, "Locust to stop"
    )
    _check_ui_run_dir(second_dir)
    report = subprocess.run(
        specload_cmd("report", str(second_dir)), capture_output=True, text=True, timeout=60
    )
    assert report.returncode == 0, report.stderr
    assert "interrupted" in report.stdout
    assert ui.poll() is None  # the UI survives a stop and is ready for another run
    assert sorted(os.listdir(tmp_path)) == sorted([first_dir.name, second_dir.name])


def test_web_ui_with_processes_shows_the_whole_sweep(sim, procs: Procs, tmp_path: Path) -> None:
    """`specload ui --processes 2`: the master's page has every worker's records and streamed tokens."""
    server = sim(*SIM_ARGS)
    web_port = free_port()
    procs.popen(
        specload_cmd(
            "ui",
            "--host",
            server.url,
            "--no-web-auth",
            "--web-host",
            "127.0.0.1",
            "--web-port",
            str(web_port),
            "--out",
            str(tmp_path),
            "--processes",
            "2",
            "--read-timeout",
            "30",
        )
    )
    base = f"http://127.0.0.1:{web_port}"

    def _workers() -> bool:
        try:
            return orjson.loads(_get(base + "/specload/live"))["workers"] == 2
        except OSError:
            return False

    wait_until(_workers, 60, "two workers ready")
    form = {
        "host": server.url,
        "levels": "4,8",
        "output_tokens": str(OUT),
        "input_tokens": str(INP),
        "requests_per_level": "8",  # two waves at C=4, one at C=8: every user of both workers sends
    }
    assert orjson.loads(_post(base + "/swarm", form))["success"]
    streamed: list[float] = []

    def _done() -> dict | None:
        live = orjson.loads(_get(base + "/specload/live"))
        streamed.extend(lv["live_tok_s"] for lv in live["levels"] if lv["live_tok_s"])
        return live if live["state"] == "stopped" and live["run"] and live["run"]["report"] else None

    live = wait_until(_done, 90, "the sweep and its run directory", interval=0.3)
    assert live["mode"] == "master" and live["run"]["status"] == "completed"
    assert streamed and max(streamed) > 0  # tokens streamed in the workers reached the master's page
    run_dir = Path(live["run"]["run_dir"])
    run = load_run(run_dir)
    assert len({r.worker for r in run.records}) == 2 and run.meta["mode"] == "master"
    report = orjson.loads(
        subprocess.run(
            specload_cmd("report", str(run_dir), "--format", "json", "--no-write"),
            capture_output=True,
            timeout=60,
        ).stdout
    )
    for lv, mine in zip(report, live["levels"], strict=True):
        assert (mine["concurrency"], mine["done"], mine["ok"]) == (lv["concurrency"], 8, lv["ok"])
        for key in ("agg_tok_s", "per_req_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms"):
            assert mine[key] == round(lv[key], 1), key
    _check_ui_run_dir(run_dir)
