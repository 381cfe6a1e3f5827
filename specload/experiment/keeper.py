"""The keeper: a small process between specload and an arm's server that stops everything the server started.

``python -m specload.experiment.keeper GRACE_S -- COMMAND...`` runs COMMAND as its child and becomes, on
Linux, a child subreaper (``PR_SET_CHILD_SUBREAPER``): whatever the server starts stays below the keeper
even when its parent exits, a wrapper script's server, a helper started with ``setsid`` or a daemon that
double-forks included. A process group alone misses all three (review 3a7af2e, M21).

It stops the tree on SIGTERM, which comes from specload's stop, or from the kernel when specload dies, even
by SIGKILL (``launch.child_setup``'s PR_SET_PDEATHSIG): SIGTERM to every process below it, then, after
GRACE_S, SIGKILL to every one left, until none is. When the server exits by itself, what it left behind is
stopped the same way. The keeper then exits as the server did (its code, or its signal), so specload reads
the server's exit from the keeper's.

Standard library only, and nothing of specload imported: it starts in tens of milliseconds.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
_POLL_S = 0.05
_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _Stop(Exception):
    """SIGTERM (or SIGINT, SIGHUP) arrived: stop the tree."""


def _unblock() -> None:  # in the server, before exec
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)


def _raise_stop(_signum: int, _frame: object) -> None:
    raise _Stop


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (by /proc's parent ids), nearest first; [] where /proc is absent."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(0), [])
        out += kids
        todo += kids
    return out


def _reap(server: subprocess.Popen[bytes]) -> None:
    """Collect every exited child (orphans come to the keeper to be reaped), noting the server's exit."""
    with contextlib.suppress(ChildProcessError):
        while True:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid <= 0:
                return
            if pid == server.pid:
                server.returncode = os.waitstatus_to_exitcode(status)


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_tree(server: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to the server's group and every process below the keeper; SIGKILL to what is left after
    ``grace_s``, repeated until nothing is (a process may fork while it is being killed)."""
    me = os.getpid()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(server.pid, signal.SIGTERM)
    _signal_all(descendants(me), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap(server)
        if not descendants(me):
            return
        time.sleep(_POLL_S)
    while True:
        left = descendants(me)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(server.pid, signal.SIGKILL)
        if not left:
            return
        _signal_all(left, signal.SIGKILL)
        time.sleep(_POLL_S)
        _reap(server)


def _exit_as(code: int | None) -> None:
    """Exit the way the server did: its exit code, or death by its signal."""
    if code is None:
        os._exit(1)
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        os._exit(128 - code)  # a signal that does not end a process
    os._exit(code)


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m specload.experiment.keeper GRACE_S -- COMMAND...", file=sys.stderr)
        os._exit(2)
    grace_s = float(argv[0])
    for sig in _STOPS:
        signal.signal(sig, _raise_stop)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    server: subprocess.Popen[bytes] | None = None
    try:
        # A stop arriving while the server is being started waits until the keeper knows its pid.
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
        try:
            # its own session (and process group): a signal to the keeper's group does not reach it
            server = subprocess.Popen(argv[2:], start_new_session=True, preexec_fn=_unblock)
        except OSError as e:
            print(f"cannot start {argv[2]}: {e.strerror or e}", file=sys.stderr, flush=True)
            os._exit(127)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
        while server.returncode is None:
            pid, status = os.waitpid(-1, 0)  # the server, or an orphan to reap
            if pid == server.pid:
                server.returncode = os.waitstatus_to_exitcode(status)
    except _Stop:
        pass
    for sig in _STOPS:
        signal.signal(sig, signal.SIG_IGN)  # stopping already
    if server is not None:
        stop_tree(server, grace_s)
        _reap(server)
    _exit_as(None if server is None else server.returncode)


if __name__ == "__main__":
    main(sys.argv[1:])
