"""The start form refuses what the command line refuses (review 3a7af2e webui N5): C=100000 with an
open-files limit it cannot fit is refused in both, with the same words, before any user starts."""

from __future__ import annotations

import resource
import signal
import subprocess
from pathlib import Path

from specload.core.openfiles import FD_HEADROOM, files_needed
from specload.sim.process import start_sim
from tests.conftest import Procs, free_port, launch_ui, specload_cmd
from tests.test_webui_security import Browser

LIMIT = 1024


def _limited() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def test_files_needed_by_hand() -> None:
    assert files_needed(100000, 1) == 100000 + FD_HEADROOM
    assert files_needed(1000, 3) == 334 + FD_HEADROOM  # the busiest process's share, rounded up


def test_c_100000_is_refused_by_the_form_as_by_the_command_line(tmp_path: Path) -> None:
    procs = Procs()
    sim = start_sim(["--model", "m", "--ttft-ms", "5", "--itl-ms", "1"])
    try:
        cli = subprocess.run(
            specload_cmd(
                "sweep",
                "--host",
                sim.url,
                "--levels",
                "100000",
                "--output-tokens",
                "8",
                "--input-tokens",
                "16",
                "--out",
                str(tmp_path / "cli"),
            ),
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=_limited,
        )
        assert cli.returncode == 2, cli.stderr
        words = f"C=100000 needs about {100000 + FD_HEADROOM} open files per Locust process, and this shell allows {LIMIT}"
        assert words in cli.stderr

        proc, base = launch_ui(
            procs,
            sim.url,
            free_port(),
            tmp_path / "ui",
            "--scenario",
            "smoke",
            "--no-web-auth",
            preexec_fn=_limited,
            login=False,
        )
        form = {"host": sim.url, "levels": "1,100000", "output_tokens": "8", "input_tokens": "16"}
        reply = Browser(base).post("/swarm", form)
        body = reply.json()
        assert body["success"] is False, body
        assert body["message"].startswith("start form: field 'Levels': ") and words in body["message"], body
        assert not (tmp_path / "ui").exists() or not any((tmp_path / "ui").iterdir())  # nothing started
        assert proc.poll() is None
    finally:
        procs.stop_all()
        sim.stop()
