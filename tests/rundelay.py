"""How long the kernel kept a test's processes waiting for a CPU: the share of a wall-clock lateness
that the machine's load added, measured in the same test.

A timing test checks that the simulator sends a token when it is due, within a few ms. On a loaded
machine (both cores busy, other suites running) a process that is ready to run may wait tens of ms
for a core, and no bound a few ms wide holds. Linux counts that wait per thread
(``/proc/PID/task/TID/schedstat``, second field: ns runnable but not running), so a test bounds
lateness by its quiet-machine tolerance *plus the wait measured over the same interval*, in the
processes that produce and read the timings (and, on a virtual machine, the time its hypervisor
ran something else: /proc/stat's steal). A fault in the code (drift, a wrong origin, a delay
added on every token) still shows on a quiet machine as it did, and on a loaded one whenever the
fault is larger than the wait; the load alone can no longer fail the test, and no retry is needed.

Where the kernel keeps no schedstat (another OS, a kernel built without it) the wait reads 0: the
bounds are the quiet-machine ones.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def _read_ns(path: Path) -> int:
    try:
        return int(path.read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def waited_ns(pid: int, tid: int | None = None) -> int:
    """Nanoseconds thread ``tid`` of ``pid`` (every thread when None) has been runnable but not
    running, since it started."""
    if tid is not None:
        return _read_ns(Path(f"/proc/{pid}/task/{tid}/schedstat"))
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0
    return sum(_read_ns(t / "schedstat") for t in tasks)


def steal_ns() -> int:
    """Nanoseconds the hypervisor gave this machine's CPUs to someone else while they had work
    (/proc/stat ``steal``, every CPU, counted in clock ticks): a virtual machine's process is
    late by that too, and no schedstat of its own shows it."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0


class RunDelay:
    """The run-queue wait accrued since construction by this process (``this_thread``: the one
    that reads the timings; every thread of it, since one that holds the GIL and waits for a CPU
    delays the reader too), every thread of the processes ``pids`` (the servers that produce
    them), and the machine's steal time (steal_ns).

    Threads that end in between drop out of the sum; the result is clamped at 0."""

    def __init__(self, pids: Iterable[int] = (), *, this_thread: bool = True) -> None:
        self._pids = tuple(pids)
        self._own = this_thread
        self._start = self._now()

    def _now(self) -> int:
        own = waited_ns(os.getpid()) if self._own else 0
        return own + sum(waited_ns(p) for p in self._pids) + steal_ns()

    @property
    def s(self) -> float:
        """Seconds waited so far."""
        return max(0, self._now() - self._start) / 1e9


def client_lateness_s(run: Any, index: int, worst: bool = False) -> float:
    """How late the client itself could have been during run.json level ``index``: the highest
    event-loop lag p99 its Locust processes measured of themselves (run.json ``levels[i].client``,
    specload.locust.clientload), in seconds; 0 where none was recorded. ``worst``: the most one
    moment of the level could have been late, the highest lag maximum or, when higher, the longest
    a process waited for a CPU in all (``cpu_wait`` x ``wall_s``, from schedstat: the lag is a
    sample, a preemption between two samples shows only there).

    An end-to-end sweep's latencies are the simulator's exact timing plus the moments the client
    read them late. On a quiet machine the loop lags well under a millisecond and the bounds stay
    the quiet-machine ones; on a loaded one they widen by what the client measured in that level,
    not by a retry."""
    from specload.analysis.clientcheck import figures

    for lv in run.info.levels:
        if lv.index == index:
            fig = figures(lv)
            procs = fig.processes.values() if fig is not None else ()
            lags = [p.lag_max_ms if worst else p.lag_p99_ms for p in procs]
            if worst:
                lags += [p.cpu_wait * p.wall_s * 1e3 for p in procs if p.cpu_wait is not None]
            return max((x for x in lags if x is not None), default=0.0) / 1e3
    return 0.0
