"""Start and stop the built-in simulated server as a child process (for the demo and the tests).

The simulator prints one line with its URL once it listens; waiting for that line (not for a
fixed sleep) is what makes callers start load only when the server is up.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_PR_SET_PDEATHSIG = 1


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> int | None:
    """Terminate by PID, kill if it does not exit in time, close its stdout; the exit code. Idempotent."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)
    if proc.stdout is not None:
        proc.stdout.close()
    return proc.returncode


@dataclass
class SimProcess:
    proc: subprocess.Popen[str]
    url: str

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stop(self, timeout: float = 10.0) -> None:
        stop_process(self.proc, timeout)


def _own_group() -> None:  # in the child, between fork and exec
    """Its own process group, so that a terminal's Ctrl-C reaches the one who started it (who
    stops it last: a demo's interrupted level must not read like a server crash)."""
    os.setpgid(0, 0)


def _own_group_dying_with_parent() -> None:  # in the child, between fork and exec
    """``_own_group``, and a SIGTERM from the kernel when the starter dies, even by SIGKILL, so
    that no simulator is left behind. Only from the main thread: the kernel sends it when the
    *thread* that forked exits, and a pool's thread exits long before its process."""
    _own_group()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def start_sim(
    args: list[str], timeout: float = 20.0, prefix: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> SimProcess:
    """Run ``python -m specload.sim --port 0 ARGS`` and return once it listens. ``prefix`` runs it
    under a launcher (``taskset -c 0`` pins it to a core for a benchmark); ``env``: its environment."""
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-m", "specload.sim", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=None if env is None else dict(env),
        preexec_fn=(
            _own_group_dying_with_parent
            if threading.current_thread() is threading.main_thread()
            else _own_group
        ),
    )
    found: list[str] = []
    seen: list[str] = []

    def _read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if "listening on " in line:
                found.append(line.strip().rsplit("listening on ", 1)[1])
                return

    reader = threading.Thread(target=_read, daemon=True)
    reader.start()
    reader.join(timeout)
    if not found:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"simulator did not start: {''.join(seen)[-2000:]}")
    # Keep draining its output so a chatty simulator never blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in proc.stdout or []], daemon=True).start()
    return SimProcess(proc, found[0])
