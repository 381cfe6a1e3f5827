"""Shared fixtures: real processes (simulator, Locust) on ephemeral ports, always stopped by PID."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from specload.sim.process import SimProcess, start_sim

REPO = Path(__file__).resolve().parent.parent


def _undo_readline_terminal_size() -> None:
    """pytest imports readline (capture's ``_readline_workaround``), and GNU readline exports COLUMNS
    and LINES into the C environment (80x24 off a terminal) without os.environ knowing. Every child
    then inherits a width nobody set: the pytest-xdist workers (so an in-process report fits 80
    columns there and 120 without xdist) and the specload and Locust processes the tests start. Put
    the C environment back to the one pytest was started with (os.environ's snapshot)."""
    for name in ("COLUMNS", "LINES"):
        if name in os.environ:
            os.putenv(name, os.environ[name])
        else:
            os.unsetenv(name)


_undo_readline_terminal_size()

LOCUSTFILE = REPO / "locustfiles" / "specload_sweep.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# How long a simulator may take to say it listens: its imports are about a second of CPU, and the
# faults batch starts thirteen at once; on a loaded machine 20 s was not always enough. No figure
# depends on it: it only waits longer before a failure.
SIM_START_TIMEOUT_S = 90.0


@pytest.fixture
def sim() -> Iterator[Callable[..., SimProcess]]:
    """Factory: sim("--ttft-ms", "100", ...) starts a simulator process; all are stopped at teardown."""
    started: list[SimProcess] = []

    def _start(*args: str) -> SimProcess:
        proc = start_sim(list(args), SIM_START_TIMEOUT_S)
        started.append(proc)
        return proc

    yield _start
    for proc in started:
        proc.stop()


def die_with_parent() -> None:  # in the child, between fork and exec
    """Linux: the child gets SIGTERM when the test process dies without tearing down (SIGKILL, or
    an xdist worker whose controller went away), so that no server or sweep outlives the suite."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM (CI cancelling a job, ``timeout``, a kill) ends the suite as Ctrl-C does: every
    fixture's teardown runs and stops its processes, instead of leaving them running. A suite run
    as a background job of a non-interactive shell starts with SIGINT ignored, which every process
    it starts would inherit: the tests that press Ctrl-C need it as a terminal delivers it."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
        if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)


class Procs:
    """Child processes of one test, stopped (SIGINT, then kill) at teardown whatever happened.

    Output goes to a file, never a pipe: a chatty process must not block on a pipe nobody reads.
    """

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, tempfile._TemporaryFileWrapper[bytes]] = {}

    def popen(self, cmd: list[str], **kw: object) -> subprocess.Popen[bytes]:
        log = tempfile.NamedTemporaryFile(prefix="specload-test-", suffix=".log")  # noqa: SIM115
        kw.setdefault("cwd", str(REPO))
        kw.setdefault("stdout", log)
        kw.setdefault("stderr", subprocess.STDOUT)
        if threading.current_thread() is threading.main_thread():  # (the kernel's signal follows the thread)
            kw.setdefault("preexec_fn", die_with_parent)
        proc = subprocess.Popen(cmd, **kw)  # type: ignore[call-overload]
        self.procs.append(proc)
        self.logs[proc.pid] = log
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        with open(self.logs[proc.pid].name, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for log in self.logs.values():
            log.close()


@pytest.fixture
def procs() -> Iterator[Procs]:
    p = Procs()
    yield p
    p.stop_all()


def wait_until(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``pred`` until it returns something true (returned), or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def wait_for_web_ui(procs: Procs, proc: subprocess.Popen[bytes], base: str, timeout: float = 30) -> None:
    """Until the web UI at ``base`` answers its login page; fails with the process's log if it died."""

    def up() -> bool:
        try:
            urllib.request.urlopen(base + "/login", timeout=2).close()
            return True
        except OSError:
            assert proc.poll() is None, procs.log(proc)
            return False

    wait_until(up, timeout, "the web UI")


def launch_ui(
    procs: Procs,
    host: str,
    port: int,
    results: Path,
    *args: str,
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], Any] | None = None,
    login: bool = True,
) -> tuple[subprocess.Popen[bytes], str]:
    """``specload ui --host HOST ARGS`` on 127.0.0.1:PORT, writing into RESULTS (``env``: more
    environment): the process and, once the UI answers, its login URL (``login=False``, as with
    --no-web-auth: its base URL)."""
    proc = procs.popen(
        specload_cmd(
            "ui",
            "--host",
            host,
            *args,
            "--web-host",
            "127.0.0.1",
            "--web-port",
            str(port),
            "--out",
            str(results),
        ),
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        **({} if preexec_fn is None else {"preexec_fn": preexec_fn}),
    )
    base = f"http://127.0.0.1:{port}"
    found = (
        wait_until(
            lambda: re.search(r"open (\S+/specload/login\?token=\S+)", procs.log(proc)), 30, "the login URL"
        )
        if login
        else None
    )
    wait_for_web_ui(procs, proc, base)
    return proc, found.group(1) if found else base


def run_together(*calls: Callable[[], Any]) -> list[Any]:
    """Each call at once, in a thread of its own (each one waits on a process: a sweep of simulated
    timings); their results in order, or the first failure raised once all have ended."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(c) for c in calls]
    return [f.result() for f in futures]


def locust_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), *args]


def specload_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "specload", *args]


@pytest.fixture(autouse=True)
def _no_api_key_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests run without the developer's real keys in the environment."""
    for name in ("SPECLOAD_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``pytest -n N --dist loadgroup`` (make test), the tests that share a module-scoped
    fixture (a batch of sweeps, a cluster, a big run) run on one worker: spread over several, each
    worker would build the fixture again. Tests that share none go wherever a worker is free."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    shared: dict[pytest.Item, list[str]] = {}
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        keys = [
            f"{defs[-1].baseid}::{name}"
            for name, defs in info.name2fixturedefs.items()
            if defs and defs[-1].scope != "function" and defs[-1].baseid.startswith("tests")
        ]
        if keys:
            shared[item] = keys
            for k in keys[1:]:
                parent[find(k)] = find(keys[0])
    for item, keys in shared.items():
        item.add_marker(pytest.mark.xdist_group(find(keys[0])))
    _processes_first(items)


# What a test module that starts processes (a simulator, a sweep, Locust, the web UI) says somewhere.
_STARTS_PROCESSES = re.compile(
    r"\bsubprocess\b|\bspecload_cmd\(|\blocust_cmd\(|\bsim\b|\bprocs\b|\blaunch_ui\("
)


def _processes_first(items: list[pytest.Item]) -> None:
    """The modules that start processes first, the in-process ones after (each keeps its order).

    xdist hands tests out in this order (after the shared-fixture groups, largest first): a sweep of
    15 s handed out last keeps one worker busy while the others have nothing left, and the suite
    waits for it. In-process tests take milliseconds each: run last, they fill the workers that
    finish early."""
    texts: dict[Path, bool] = {}

    def starts(item: pytest.Item) -> bool:
        path = Path(str(item.path))
        if path not in texts:
            try:
                texts[path] = bool(_STARTS_PROCESSES.search(path.read_text()))
            except OSError:
                texts[path] = True
        return texts[path]

    items.sort(key=lambda item: not starts(item))


@dataclass(frozen=True)
class ExperimentRun:
    """The example experiment (scenarios/experiment-sim.toml) run once: its directory and its log."""

    out: Path  # --out: the experiment directory is the one experiment-* inside
    code: int
    log: str


EXPERIMENT_EXAMPLE = REPO / "scenarios" / "experiment-sim.toml"
EXPERIMENT_TINY = [
    "--levels",
    "1,4",
    "--requests-per-level",
    "4",
    "--output-tokens",
    "16",
    "--input-tokens",
    "64",
]


@pytest.fixture(scope="session")
def example_experiment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExperimentRun]:
    """``specload experiment`` of the example plan, two arms interleaved twice (--repeat 2), its
    comparison written as HTML too: made once for the tests that read it (test_experiment,
    test_experiment_html), each a run of four sweeps and four servers. Read-only: a test that
    moves or changes the directory works on a copy."""
    out = tmp_path_factory.mktemp("experiment") / "out"
    p = Procs()
    try:
        proc = p.popen(
            specload_cmd(
                "experiment",
                str(EXPERIMENT_EXAMPLE),
                "--out",
                str(out),
                "--no-plot",
                "--repeat",
                "2",
                "--format",
                "html",
                *EXPERIMENT_TINY,
            )  # fmt: skip
        )
        code = proc.wait(timeout=180)
        yield ExperimentRun(out, code, p.log(proc))
    finally:
        p.stop_all()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """SPECLOAD_TEST_CPU=FILE: each test's CPU seconds (this process and the children it reaped: the
    simulators, sweeps and Locust processes it started), wall seconds, node id, start (Unix time)
    and xdist worker appended to FILE, one tab-separated line a test: what to shorten first when
    make test is CPU-bound, and which test made the tail."""
    path = os.environ.get("SPECLOAD_TEST_CPU")
    if not path:
        yield
        return
    import resource

    def cpu() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    c0, t0, start = cpu(), time.monotonic(), time.time()
    yield
    worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
    with open(path, "a") as f:
        f.write(f"{cpu() - c0:.2f}\t{time.monotonic() - t0:.2f}\t{item.nodeid}\t{start:.2f}\t{worker}\n")
