"""The arm's server as a child process: started under a keeper, waited for, always stopped, its log scrubbed.

The server runs below a keeper (``specload.experiment.keeper``), specload's child with the same child
setup as its Locust child (``specload.launch.child_setup``): its own process group, and on Linux a
SIGTERM from the kernel when specload dies, even by SIGKILL. The keeper is a child subreaper: a wrapper
script's server, a helper started with ``setsid`` and a double-forked daemon all stay below it, and its
stop (specload's SIGTERM, or the kernel's) stops every one of them.

The server gets only the environment its arm names, plus ``PASSED_ENV`` of specload's own: specload's
API key, master token and any other secret of the shell stay out of it. Its output goes to a log file,
never a pipe nobody reads; the known secrets (``record.known_secrets``) are taken out of that log when
the server has stopped, and out of every tail of it quoted in a message.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from specload.client.http import api_key
from specload.client.probe import (
    LOADING_STATUS,
    ServerUnreachable,
    StillLoading,
    get_json,
    wait_while_loading,
)
from specload.experiment import keeper
from specload.experiment.plan import Arm
from specload.experiment.record import hide
from specload.launch import child_setup

HEALTH_POLL_S = 0.1
LOG_TAIL_LINES = 15
KEEPER_MARGIN_S = 5.0  # beyond the arm's grace: the keeper's own SIGKILL round and exit

# What a server gets of specload's environment besides its arm's ``env``: what a process needs to run
# (PATH, HOME, user, shell, locale, time zone, temporary directory, terminal), to find its libraries and
# devices (LD_LIBRARY_PATH, the Python environment, the GPUs it may use) and its model cache (HF_HOME,
# XDG_*). Nothing else: a key, a token or a proxy with a password goes to a server only when its arm
# names it in ``env``.
PASSED_ENV = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "TERM",
    "LD_LIBRARY_PATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HF_HOME",
)
PASSED_PREFIXES = ("LC_", "XDG_")


class ServerError(RuntimeError):
    """The arm's server did not come up, or went away; the message names the arm and its log."""


def server_environment(arm_env: Mapping[str, str], ours: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's whole environment: ``PASSED_ENV`` (and ``PASSED_PREFIXES``) of ``ours`` (default:
    specload's), then the arm's own variables."""
    ours = os.environ if ours is None else ours
    kept = {k: v for k, v in ours.items() if k in PASSED_ENV or k.startswith(PASSED_PREFIXES)}
    return {**kept, **arm_env}


@dataclass
class Server:
    """One start of an arm's server (``proc`` None: a url arm, which specload neither starts nor stops;
    else ``proc`` is the server's keeper, whose exit is the server's)."""

    label: str
    url: str
    argv: list[str] | None = None
    log_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    secrets: Sequence[str] = ()  # taken out of the log and its tails
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def exit_code(self) -> int | None:
        """None while it runs (and always for a url arm)."""
        return None if self.proc is None else self.proc.poll()

    def log_tail(self) -> str:
        """The log's last lines, secrets taken out."""
        if self.log_path is None:
            return ""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return hide("\n".join(lines[-LOG_TAIL_LINES:]), self.secrets)

    def move_log(self, run_dir: str | Path) -> None:
        """Into the run directory, as server.log (after ``stop``: scrubbed, and nobody writes to it)."""
        if self.log_path is None or not self.log_path.exists():
            return
        target = Path(run_dir) / "server.log"
        os.replace(self.log_path, target)
        self.log_path = target

    def stop(self, grace_s: float) -> None:
        """SIGTERM to the keeper, which stops every process below it (SIGTERM, then SIGKILL after
        ``grace_s``); SIGKILL to the keeper's group should it not be done in time. Then the log is
        scrubbed. Idempotent; a url arm's server is left alone."""
        proc = self.proc
        if proc is None:
            return
        try:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=grace_s + KEEPER_MARGIN_S)
                except subprocess.TimeoutExpired:
                    _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
            if self.log_path is not None:
                scrub_file(self.log_path, self.secrets)


def scrub_file(path: Path, secrets: Sequence[str]) -> None:
    """``path`` rewritten with every one of ``secrets`` and the API key in use replaced (a line at a time:
    a server's log may be large); left as it is when it holds none or cannot be rewritten."""
    values = [s.encode() for s in [*secrets, *_key()] if s]
    if not values:
        return
    try:
        with open(path, "rb") as f:
            if not any(v in line for line in f for v in values):
                return
        fd, tmp = tempfile.mkstemp(prefix=".server-log-", dir=path.parent)
        with open(path, "rb") as src, os.fdopen(fd, "wb") as dst:
            for line in src:
                dst.write(
                    hide(line.decode("utf-8", "surrogateescape"), secrets).encode("utf-8", "surrogateescape")
                )
        os.replace(tmp, path)
    except OSError as e:
        print(f"specload: cannot scrub {path} of its secrets: {e.strerror or e}", file=sys.stderr)


def _key() -> list[str]:
    key = api_key()
    return [key] if key else []


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def start_server(arm: Arm, port: int, log_path: Path, secrets: Sequence[str] = ()) -> Server:
    """Start the arm's command on ``port`` under a keeper; raises ServerError when it cannot be run at
    all. ``secrets``: what to take out of its log."""
    argv = arm.argv(port)
    env = server_environment(arm.environment(port))
    if shutil.which(argv[0], path=env.get("PATH", os.defpath)) is None:  # (the keeper would only log it)
        raise ServerError(f"cannot start the server of {arm.label} ({argv[0]}): not found, or not executable")
    log = open(log_path, "ab")  # noqa: SIM115 - closed by Server.stop
    try:
        proc = subprocess.Popen(
            [sys.executable, keeper.__file__, str(arm.stop_grace_s), "--", *argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=child_setup(os.getpid()),
        )
    except OSError as e:
        log.close()
        raise ServerError(f"cannot start the server of {arm.label} ({argv[0]}): {e.strerror or e}") from None
    return Server(arm.label, arm.base_url(port), argv, log_path, proc, list(secrets), log)


def wait_healthy(
    server: Server, arm: Arm, insecure: bool = False, loading_timeout_s: float | None = None
) -> float:
    """Poll the arm's health path until it answers HTTP 200; the seconds it took. ServerError when the
    server exits first or the time limit passes.

    A 503 is a server loading its model (llama.cpp, SGLang, vLLM): with ``loading_timeout_s`` (the
    sweep's ``--loading-timeout``) it is waited for as ``specload sweep`` waits, with a line saying so,
    and the arm's ``ready_timeout_s`` counts again from the end of the loading."""
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
            if status == LOADING_STATUS and loading_timeout_s is not None and server.exit_code() is None:
                _wait_loading(server, arm, insecure, loading_timeout_s)
                loading_timeout_s, deadline = None, time.monotonic() + arm.ready_timeout_s
                continue
        except ServerUnreachable as e:
            last = str(e)
        if time.monotonic() >= deadline:
            raise ServerError(
                f"the server of {arm.label} did not become healthy within {arm.ready_timeout_s:g} s "
                f"(last: {last}){_log_note(server)}"
            )
        time.sleep(HEALTH_POLL_S)


def _wait_loading(server: Server, arm: Arm, insecure: bool, timeout_s: float) -> None:
    """specload sweep's wait for a loading server (client.probe), its lines prefixed with the arm."""
    try:
        wait_while_loading(
            server.url,
            timeout_s,
            lambda line: print(f"specload: {arm.label}: {line}", flush=True),
            insecure=insecure,
        )
    except StillLoading as e:
        raise ServerError(f"{arm.label}: {e}{_log_note(server)}") from None
    except ServerUnreachable:
        pass  # it stopped answering (exited?): the health loop says what became of it


def _log_note(server: Server) -> str:
    if server.log_path is None:
        return ""
    tail = server.log_tail()
    return f"; its log: {server.log_path}" + (f", ending:\n{tail}" if tail else "")
