"""The arm's server as a child process: started in its own process group, waited for, always stopped.

The server gets the same child setup as specload's Locust child (``specload.launch``): its own process
group, so a terminal's Ctrl-C reaches specload alone and the stop reaches the server and everything it
started; and, on Linux, a SIGTERM from the kernel when specload dies, even by SIGKILL. Its output goes
to a log file, never a pipe nobody reads.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from specload.client.probe import ServerUnreachable, get_json
from specload.experiment.plan import Arm
from specload.launch import child_setup

HEALTH_POLL_S = 0.1
LOG_TAIL_LINES = 15


class ServerError(RuntimeError):
    """The arm's server did not come up, or went away; the message names the arm and its log."""


@dataclass
class Server:
    """One start of an arm's server (``proc`` None: a url arm, which specload neither starts nor stops)."""

    label: str
    url: str
    argv: list[str] | None = None
    log_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def exit_code(self) -> int | None:
        """None while it runs (and always for a url arm)."""
        return None if self.proc is None else self.proc.poll()

    def log_tail(self) -> str:
        if self.log_path is None:
            return ""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-LOG_TAIL_LINES:])

    def move_log(self, run_dir: str | Path) -> None:
        """Into the run directory, as server.log (the server keeps writing to the same file)."""
        if self.log_path is None or not self.log_path.exists():
            return
        target = Path(run_dir) / "server.log"
        os.replace(self.log_path, target)
        self.log_path = target

    def stop(self, grace_s: float) -> None:
        """SIGTERM to the server's process group, SIGKILL to whatever of it is left after ``grace_s``.
        Idempotent; a url arm's server is left alone."""
        proc = self.proc
        if proc is None:
            return
        try:
            if proc.poll() is None or _group_alive(proc.pid):
                _signal_group(proc.pid, signal.SIGTERM)
                deadline = time.monotonic() + grace_s
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=grace_s)
                while _group_alive(proc.pid) and time.monotonic() < deadline:
                    time.sleep(0.05)  # children the server started, still winding down
                if proc.poll() is None or _group_alive(proc.pid):
                    _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def start_server(arm: Arm, port: int, log_path: Path) -> Server:
    """Start the arm's command on ``port``; raises ServerError when it cannot be run at all."""
    argv = arm.argv(port)
    log = open(log_path, "ab")  # noqa: SIM115 - closed by Server.stop
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **arm.environment(port)},
            preexec_fn=child_setup(os.getpid()),
        )
    except OSError as e:
        log.close()
        raise ServerError(f"cannot start the server of {arm.label} ({argv[0]}): {e.strerror or e}") from None
    return Server(arm.label, arm.base_url(port), argv, log_path, proc, log)


def wait_healthy(server: Server, arm: Arm, insecure: bool = False) -> float:
    """Poll the arm's health path until it answers HTTP 200; the seconds it took. ServerError when the
    server exits first or the time limit passes."""
    t0 = time.monotonic()
    deadline = t0 + arm.ready_timeout_s
    last = f"{server.url}{arm.health}: no answer yet"
    while True:
        code = server.exit_code()
        if code is not None:
            raise ServerError(
                f"the server of {arm.label} exited (code {code}) before it became healthy{_log_note(server)}"
            )
        remaining = deadline - time.monotonic()
        try:
            status, body = get_json(server.url, arm.health, max(0.2, min(5.0, remaining)), insecure)
            if status == 200 and server.exit_code() is None:  # (not another process on a reused port)
                return time.monotonic() - t0
            last = f"{server.url}{arm.health}: HTTP {status}: {body}"
        except ServerUnreachable as e:
            last = str(e)
        if time.monotonic() >= deadline:
            raise ServerError(
                f"the server of {arm.label} did not become healthy within {arm.ready_timeout_s:g} s "
                f"(last: {last}){_log_note(server)}"
            )
        time.sleep(HEALTH_POLL_S)


def _log_note(server: Server) -> str:
    if server.log_path is None:
        return ""
    tail = server.log_tail()
    return f"; its log: {server.log_path}" + (f", ending:\n{tail}" if tail else "")
