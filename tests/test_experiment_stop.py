"""``specload experiment`` stops every process a server started (review 3a7af2e, M21): a helper that left
the server's process group (``setsid``), and a server behind a wrapper script, after a normal stop and
after a SIGKILL of specload.

Each process under test carries a marker of its test in its command line, so that the test finds it in
/proc, and kills it by pid at teardown should specload have failed to.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from specload.experiment.plan import plan_from_dict
from specload.experiment.servers import start_server
from tests.conftest import Procs, specload_cmd, wait_until

# a process that ignores SIGTERM and sleeps; argv[1] is the marker
STUBBORN = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


def _marked(marker: str, keeper: bool = True) -> list[int]:
    """The processes whose command line holds ``marker`` (zombies left out: they are gone; the keeper
    of specload's that the server runs below left out unless ``keeper``)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in cmdline and state != "Z" and (keeper or b"keeper" not in cmdline):
            out.append(int(name))
    return out


def _ignoring_term(marker: str) -> bool:
    """The marked python3 runs and ignores SIGTERM (so only a SIGKILL ends it)."""
    for pid in _marked(marker):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        ignored = next((line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), "0")
        if int(ignored, 16) & (1 << (signal.SIGTERM - 1)):
            return True
    return False


@pytest.fixture
def marker() -> Iterator[str]:
    m = f"specload-test-{uuid.uuid4().hex}"
    yield m
    for pid in _marked(m):  # what specload failed to stop: never left behind by the test
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_helper_that_left_the_servers_process_group_is_stopped_with_it(tmp_path: Path, marker: str) -> None:
    # the server starts a helper in a session of its own, then becomes a process that ignores SIGTERM
    arm = plan_from_dict(
        {
            "arms": [
                {
                    "label": "a",
                    "command": [
                        "bash",
                        "-c",
                        f'setsid python3 -c "import time; time.sleep(600)" "$0" & exec python3 -c "{STUBBORN}" "$0" "$1"',
                        marker,
                        "{port}",
                    ],
                    "stop_grace_s": 1,
                },
                {"label": "b", "url": "http://127.0.0.1:9"},
            ]
        },
        str(tmp_path / "x.toml"),
    ).arms[0]
    server = start_server(arm, 9, tmp_path / "server.log")
    try:
        wait_until(
            lambda: _ignoring_term(marker) and len(_marked(marker, keeper=False)) == 2,
            10,
            "the server and its helper",
        )
    finally:
        server.stop(arm.stop_grace_s)
    assert server.exit_code() is not None
    wait_until(lambda: not _marked(marker), 5, f"every process of the server to be gone: {_marked(marker)}")


def test_a_server_behind_a_wrapper_is_stopped_after_a_sigkill_of_specload(
    tmp_path: Path, procs: Procs, marker: str
) -> None:
    # bash -> a server that ignores SIGTERM: the kernel's SIGTERM at specload's death reaches only bash
    wrapped = ["bash", "-c", f'python3 -c "{STUBBORN}" "$0" "$1"; echo the server exited', marker, "{port}"]
    plan = tmp_path / "exp.toml"
    plan.write_text(
        textwrap.dedent(
            f"""
            [[arms]]
            label = "wrapped"
            command = {json.dumps(wrapped)}
            health = "/never"
            ready_timeout_s = 600
            stop_grace_s = 1
            [[arms]]
            label = "other"
            command = {json.dumps(wrapped)}
            """
        )
    )
    proc = procs.popen(specload_cmd("experiment", str(plan), "--out", str(tmp_path / "out"), "--no-plot"))
    wait_until(lambda: _ignoring_term(marker) or proc.poll() is not None, 30, "the server to start")
    assert proc.poll() is None, procs.log(proc)
    proc.kill()
    proc.wait(timeout=10)
    wait_until(lambda: not _marked(marker), 10, "the wrapped server to be gone after specload's SIGKILL")


def test_what_a_server_that_exits_by_itself_left_behind_is_stopped(tmp_path: Path, marker: str) -> None:
    arm = plan_from_dict(
        {
            "arms": [
                {
                    "label": "a",
                    "command": [
                        "bash",
                        "-c",
                        'setsid python3 -c "import time; time.sleep(600)" "$0" & sleep 0.5; exit 3',
                        marker,
                        "{port}",
                    ],
                },
                {"label": "b", "url": "http://127.0.0.1:9"},
            ]
        },
        str(tmp_path / "x.toml"),
    ).arms[0]
    server = start_server(arm, 9, tmp_path / "server.log")
    try:
        code = wait_until(
            lambda: server.exit_code() is not None and [server.exit_code()], 10, "the server to exit"
        )
        assert code == [3]  # the keeper exits as the server did
        assert not _marked(marker)  # and only once its helper is gone
    finally:
        server.stop(1)
