"""Stop means stop: however `specload sweep` is stopped (SIGTERM, SIGINT to it alone, SIGKILL), its
Locust child stops too, the run is marked interrupted, and the server sees no more load."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from specload.core.records import read_records
from tests.conftest import Procs, specload_cmd, wait_until

SIM = ("--ttft-ms", "20", "--itl-ms", "5", "--model", "m")
LONG = (
    "--levels",
    "2,4",
    "--requests-per-level",
    "200",
    "--input-tokens",
    "16",
    "--output-tokens",
    "100",
    "--read-timeout",
    "30",
    "--metrics-interval",
    "0",
)


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out += [int(x) for x in text]
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between the open and the read
        return False


def sent_so_far(url: str) -> float:
    import urllib.request

    page = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    return sum(
        float(line.split()[-1]) for line in page.splitlines() if line.startswith("sglang:prompt_tokens_total")
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["term", "int", "kill"])
def test_stopping_specload_stops_its_load(sim, procs: Procs, tmp_path: Path, sig: signal.Signals) -> None:
    server = sim(*SIM)
    out = tmp_path / "out"
    parent = procs.popen(
        specload_cmd("sweep", "--host", server.url, "--out", str(out), *LONG),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_until(
        lambda: any(len(read_records(str(p))) >= 4 for p in out.glob("*/records.jsonl")), 60, "records"
    )
    (child,) = children(parent.pid)
    os.kill(parent.pid, sig)  # the parent alone, as `kill PID`, systemd or docker do
    wait_until(lambda: not alive(child), 30, "the Locust child to stop")
    parent.wait(timeout=30)
    # No more load: the server's prompt-token counter stands still.
    before = sent_so_far(server.url)
    time.sleep(1.0)
    assert sent_so_far(server.url) == before
    (run_dir,) = out.iterdir()
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "interrupted", meta["status"]
    recs = read_records(str(run_dir / "records.jsonl"))
    lv = meta["levels"][0]
    assert lv["granted"] == lv["received"] == sum(1 for r in recs if r.level == 0)
    if sig != signal.SIGKILL:
        assert parent.returncode == 1  # interrupted, with the partial report printed
        assert "sweep interrupted; partial results in" in procs.log(parent)


def test_a_second_ctrl_c_cuts_the_grace_period_but_not_the_final_write(
    sim, procs: Procs, tmp_path: Path
) -> None:
    server = sim(*SIM)
    out = tmp_path / "out"
    slow = (
        "--levels",
        "2",
        "--requests-per-level",
        "50",
        "--input-tokens",
        "16",
        "--output-tokens",
        "8000",
        "--read-timeout",
        "30",
        "--metrics-interval",
        "0",
        "--",
        "--stop-timeout",
        "60",
    )  # 40 s requests inside a 60 s grace: only the second Ctrl-C ends them early
    parent = procs.popen(
        specload_cmd("sweep", "--host", server.url, "--out", str(out), *slow),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_until(lambda: any(p.exists() for p in out.glob("*/run.json")), 60, "the run to start")
    time.sleep(1.0)  # the two requests are in flight
    (child,) = children(parent.pid)
    t0 = time.monotonic()
    os.kill(parent.pid, signal.SIGINT)
    time.sleep(0.5)
    os.kill(parent.pid, signal.SIGINT)
    # well before the requests would end (~38 s) or the grace would (60 s), on a loaded machine too
    wait_until(lambda: not alive(child), 25, "the Locust child to stop well before its requests end")
    assert time.monotonic() - t0 < 25
    parent.wait(timeout=30)
    (run_dir,) = out.iterdir()
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "interrupted"
    recs = read_records(str(run_dir / "records.jsonl"))
    assert len(recs) == 2 and all(
        r.status == "failed" and r.reason.startswith("interrupted") for r in recs
    ), recs
    lv = meta["levels"][0]
    assert lv["granted"] == lv["received"] == 2


def _limit(soft: int, hard: int):  # type: ignore[no-untyped-def]
    import resource

    def setup() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return setup


def test_a_level_beyond_the_open_file_limit_is_refused_naming_ulimit(sim, tmp_path: Path) -> None:
    server = sim(*SIM)
    out = subprocess.run(
        specload_cmd(
            "sweep",
            "--host",
            server.url,
            "--out",
            str(tmp_path / "out"),
            "--levels",
            "200",
            "--input-tokens",
            "16",
            "--output-tokens",
            "4",
        ),
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limit(100, 100),
    )
    assert out.returncode == 2 and "ulimit -n" in out.stderr and "C=200" in out.stderr, out.stderr
    assert not (tmp_path / "out").exists()


def test_the_soft_open_file_limit_is_raised_for_a_level_that_fits_the_hard_one(sim, tmp_path: Path) -> None:
    server = sim(*SIM, "--max-running", "256")
    out = subprocess.run(
        specload_cmd(
            "sweep",
            "--host",
            server.url,
            "--out",
            str(tmp_path / "out"),
            "--levels",
            "150",
            "--requests-per-level",
            "150",
            "--input-tokens",
            "16",
            "--output-tokens",
            "4",
            "--metrics-interval",
            "0",
        ),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit(100, 4096),
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (run_dir,) = (tmp_path / "out").iterdir()
    recs = read_records(str(run_dir / "records.jsonl"))
    assert len(recs) == 150 and all(r.status == "ok" for r in recs), {r.reason for r in recs}


def test_a_server_that_comes_back_within_seconds_is_waited_for(procs: Procs, tmp_path: Path) -> None:
    from tests.conftest import free_port

    port = free_port()
    sweep = procs.popen(
        specload_cmd(
            "sweep",
            "--host",
            f"http://127.0.0.1:{port}",
            "--out",
            str(tmp_path / "out"),
            "--levels",
            "1",
            "--input-tokens",
            "16",
            "--output-tokens",
            "4",
        )
    )
    # The server is restarting: connections are refused. It comes back once the sweep has been refused
    # (waiting a fixed second instead raced a slow start-up on a loaded machine: the sweep's first
    # probe then found the server already up). The retries leave it 7.75 s to come back.
    deadline = time.monotonic() + 60
    while "connection refused; retrying in 0.25 s (1/5)" not in procs.log(sweep):
        assert sweep.poll() is None and time.monotonic() < deadline, procs.log(sweep)[-3000:]
        time.sleep(0.05)
    from specload.sim.process import start_sim

    server = start_sim([*SIM, "--port", str(port)])
    try:
        assert sweep.wait(timeout=60) == 0, procs.log(sweep)[-3000:]
    finally:
        server.stop()
    log = procs.log(sweep)
    assert "connection refused; retrying in 0.25 s (1/5)" in log, log[-3000:]


def test_a_server_restarted_mid_level_is_waited_for_and_the_outage_reported(
    procs: Procs, tmp_path: Path
) -> None:
    """kill -9 of the server mid-level, back on the same port 0.3 s later: the sweep holds new
    requests instead of burning its budget on refusals, resumes, completes, and says what happened."""
    from specload.sim.process import start_sim
    from tests.conftest import free_port

    port = free_port()
    server = start_sim([*SIM, "--port", str(port)])
    out = tmp_path / "out"
    sweep = procs.popen(
        specload_cmd(
            "sweep",
            "--host",
            f"http://127.0.0.1:{port}",
            "--out",
            str(out),
            "--levels",
            "2,4",
            "--requests-per-level",
            "30",
            "--input-tokens",
            "16",
            "--output-tokens",
            "40",
            "--metrics-interval",
            "0",
        )
    )
    try:
        wait_until(
            lambda: (
                any(out.glob("*/records.jsonl"))
                and len(read_records(str(next(out.glob("*/records.jsonl"))))) >= 3
            ),
            60,
            "the first records",
        )
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=10)
        time.sleep(0.3)
        # Back, but loading its model for 0.5 s (503 on every endpoint, as llama.cpp): not yet "back".
        server = start_sim([*SIM, "--port", str(port), "--loading-s", "0.5"])
        assert sweep.wait(timeout=90) == 0, procs.log(sweep)[-3000:]
    finally:
        server.stop()
    run_dir = next(out.iterdir())
    meta = json.loads((run_dir / "run.json").read_text())
    log = procs.log(sweep)
    assert meta["status"] == "completed", meta
    hit = [lv for lv in meta["levels"] if lv["refused"] or lv["outage_s"]]
    assert len(hit) == 1, meta["levels"]
    lv = hit[0]
    assert 1 <= lv["refused"] <= lv["concurrency"], lv  # at most one refusal per user: new requests were held
    assert 0.7 <= lv["outage_s"] < 5.0, lv  # the restart and the loading
    recs = read_records(str(run_dir / "records.jsonl"))
    measured = [r for r in recs if r.phase == "measure"]
    assert len(measured) == 60  # exact budgets, outage or not
    assert sum(r.reason == "connection refused" for r in measured) == lv["refused"]
    assert not any("Loading model" in (r.reason or "") for r in recs)  # no request was sent while it loaded
    assert "the server refused a connection (connection refused); no new request starts" in log, log[-3000:]
    assert "the server answers again; new requests resume" in log
    report = (run_dir / "report.md").read_text()
    assert "the server was away (connection refused) for" in report, report


def test_a_full_disk_ends_the_sweep_cleanly_keeping_what_was_written(sim, tmp_path: Path) -> None:
    """The run directory on a 96 KiB tmpfs: records fill it mid-sweep."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        server = sim(*SIM)
        out = subprocess.run(
            specload_cmd(
                "sweep",
                "--host",
                server.url,
                "--out",
                str(disk),
                "--levels",
                "4",
                "--requests-per-level",
                "2000",
                "--input-tokens",
                "16",
                "--output-tokens",
                "2",
                "--metrics-interval",
                "0",
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        log = out.stdout + out.stderr
        assert out.returncode == 1, log[-3000:]
        assert "cannot write records.jsonl" in log and "stopping the sweep" in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
        (run_dir,) = disk.iterdir()
        meta = json.loads((run_dir / "run.json").read_text())  # the final write had room: a space reserve
        assert meta["status"] == "failed" and "No space left on device" in meta["reason"]
        recs = read_records(str(run_dir / "records.jsonl"))
        assert 10 < len(recs) < 2000  # every whole record written before the disk filled is there
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_stagger_longer_than_the_grace_leaves_one_record_per_granted_ticket(
    sim, procs: Procs, tmp_path: Path, processes: str
) -> None:
    """The review's M17: with --stagger 20 (the grace is 10 s), SIGTERM left a granted ticket
    without a record (one process: granted 4, received 3; two: 3 'lost with a worker') and the
    stop took 17-25 s. A user still in its stagger holds a ticket it has sent nothing for: it gives
    the ticket back at once, and the stop ends with the requests really in flight."""
    server = sim("--ttft-ms", "10", "--itl-ms", "5", "--model", "m")
    out = tmp_path / "out"
    parent = procs.popen(
        specload_cmd(
            "sweep",
            "--host",
            server.url,
            "--out",
            str(out),
            "--levels",
            "4",
            "--requests-per-level",
            "40",
            "--input-tokens",
            "8",
            "--output-tokens",
            "200",
            "--stagger",
            "20",
            "--read-timeout",
            "30",
            "--metrics-interval",
            "0",
            "--processes",
            processes,
        ),  # fmt: skip
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_until(lambda: any(p.exists() for p in out.glob("*/records.jsonl")), 60, "the level to start")
    wait_until(
        lambda: any(len(read_records(str(p))) >= 1 for p in out.glob("*/records.jsonl")), 60, "a record"
    )
    t0 = time.monotonic()
    os.kill(parent.pid, signal.SIGTERM)
    parent.wait(timeout=60)
    took = time.monotonic() - t0
    log = procs.log(parent)
    (run_dir,) = out.iterdir()
    meta = json.loads((run_dir / "run.json").read_text())
    lv = meta["levels"][0]
    recs = [r for r in read_records(str(run_dir / "records.jsonl")) if r.level == 0]
    assert lv["granted"] == lv["received"] == len(recs), (lv, log[-3000:])
    assert not lv.get("lost"), lv
    assert "sent no record after the grace period" not in log and "was lost" not in log, log[-3000:]
    assert took < 15, took  # the 10 s grace at most (the requests in flight take 1 s), not 17-25 s


def test_a_master_stopped_while_it_waits_for_workers_says_so_without_a_traceback(
    sim, procs: Procs, tmp_path: Path
) -> None:
    """The review's L3: SIGTERM to a `--workers` master waiting for its workers gave Locust's
    KeyboardInterrupt traceback from start_automatic_run."""
    from tests.conftest import free_port

    server = sim(*SIM)
    parent = procs.popen(
        specload_cmd(
            "sweep",
            "--host",
            server.url,
            "--workers",
            "2",
            "--master-bind-host",
            "127.0.0.1",
            "--master-bind-port",
            str(free_port()),
            "--out",
            str(tmp_path / "out"),
            "--levels",
            "1",
            "--requests-per-level",
            "2",
        ),  # fmt: skip
        env={**os.environ, "SPECLOAD_MASTER_TOKEN": "w" * 32, "PYTHONUNBUFFERED": "1"},
    )
    wait_until(lambda: "Waiting for workers to be ready" in procs.log(parent), 60, "the master to wait")
    os.kill(parent.pid, signal.SIGTERM)
    parent.wait(timeout=30)
    log = procs.log(parent)
    assert parent.returncode != 0
    assert "stopped while waiting for workers; no request was sent" in log, log[-3000:]
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-3000:]
