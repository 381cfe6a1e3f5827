"""Sleeps that end on time, to within tens of microseconds, for gevent on Linux.

gevent's own timers (libev) wake late: libev hands epoll a timeout rounded up to a whole millisecond
(and never under 1 ms), and the kernel adds 0.1 % of the timeout as slack to poll timeouts. Measured
on a 2-core VM: a 200 ms ``gevent.sleep`` ends 0.4-1.4 ms late, a 0.3 ms one 0.85 ms late. For a
simulator whose TTFT and inter-token times are the reference other measurements are checked
against, and for a load generator sending a trace's requests at their due times, that is a visible
bias.

A timerfd is an hrtimer with no such rounding: it turns readable at its expiry, and epoll reports
that at once. One timerfd per gevent hub is armed for the earliest pending deadline; when it fires,
every sleeper whose deadline has passed is woken in deadline order, and it is re-armed for the next.
(What remains is the host's wake-up latency when the process was idle, ~0.2 ms on a VM.)

Public: :data:`clock`, the clock deadlines are on, :func:`sleep_until`, and the ``sleeper()``
lookup. It returns None where timerfd is unavailable (not Linux, or ``time.perf_counter`` is not
CLOCK_MONOTONIC, which the timerfd is set against); ``sleep_until`` then uses ``gevent.sleep``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import heapq
import itertools
import os
import sys
import time
from typing import Any

import gevent
from gevent.hub import Hub, Waiter, get_hub

#: The one clock of the deadlines (the simulator's, re-exported as ``specload.sim.timing.clock``): monotonic,
#: sub-microsecond, and on Linux CLOCK_MONOTONIC, which the timerfd is set against.
clock = time.perf_counter

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = 0o2000000  # O_CLOEXEC on Linux
_TFD_TIMER_ABSTIME = 1
_READ = 1  # libev EV_READ


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _load() -> tuple[Any, Any] | None:
    if sys.platform != "linux":
        return None
    if time.get_clock_info("perf_counter").implementation != "clock_gettime(CLOCK_MONOTONIC)":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        create, settime = libc.timerfd_create, libc.timerfd_settime
    except (OSError, AttributeError):
        return None
    create.argtypes = [ctypes.c_int, ctypes.c_int]
    create.restype = ctypes.c_int
    settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
    settime.restype = ctypes.c_int
    return create, settime


_LIBC = _load()


class PreciseSleeper:
    """One timerfd serving every sleeping greenlet of one hub."""

    def __init__(self, hub: Any) -> None:
        assert _LIBC is not None
        create, self._settime = _LIBC
        fd = create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_create: {os.strerror(err)}")
        self.hub = hub
        self._fd = fd
        self._heap: list[tuple[float, int, Waiter]] = []
        self._seq = itertools.count()  # ties keep arrival order (and waiters are never compared)
        self._armed = float("inf")
        self._spec = _Itimerspec()
        self._spec_ref = ctypes.byref(self._spec)
        self._watcher = hub.loop.io(fd, _READ)
        self._watching = False

    def sleep_until(self, deadline: float) -> None:
        """Block this greenlet until ``clock() >= deadline``."""
        waiter = Waiter(self.hub)
        heapq.heappush(self._heap, (deadline, next(self._seq), waiter))
        if deadline < self._armed:
            self._arm(deadline)
        if not self._watching:
            self._watcher.start(self._fire)
            self._watching = True
        waiter.get()  # if this greenlet is killed meanwhile, its entry later wakes no one

    def _arm(self, deadline: float) -> None:
        self._armed = deadline
        sec = int(deadline)
        value = self._spec.it_value
        value.tv_sec = sec
        value.tv_nsec = min(999_999_999, int((deadline - sec) * 1e9) + 1)  # never before the deadline
        if self._settime(self._fd, _TFD_TIMER_ABSTIME, self._spec_ref, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")

    def _fire(self) -> None:
        """In the hub: wake every sleeper that is due, then re-arm for the next one."""
        try:  # noqa: SIM105 - cheaper than contextlib.suppress on this per-wake path
            os.read(self._fd, 8)
        except BlockingIOError:
            pass
        self._armed = float("inf")
        heap = self._heap
        while heap and heap[0][0] <= clock():
            heapq.heappop(heap)[2].switch(None)  # runs the sleeper until it blocks again
        if not heap:
            self._watcher.stop()
            self._watching = False
        elif heap[0][0] < self._armed:
            self._arm(heap[0][0])


# Each hub's sleeper (None: timerfd_create failed for it), keyed by the hub itself (no id() that a
# new hub could reuse; the sleeper refers to its hub anyway).
_sleepers: dict[Hub, PreciseSleeper | None] = {}


def sleeper() -> PreciseSleeper | None:
    """The current hub's precise sleeper, created on first use; None where timerfd is unavailable."""
    if _LIBC is None:
        return None
    hub = get_hub()
    try:
        return _sleepers[hub]
    except KeyError:
        pass
    try:
        s: PreciseSleeper | None = PreciseSleeper(hub)
    except OSError:
        s = None
    _sleepers[hub] = s
    return s


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_sleepers.clear)  # a child must not share its parent's timerfd


def sleep_until(deadline: float) -> None:
    """Sleep until ``clock() >= deadline``, never returning early, and as little late as possible.

    On Linux a timerfd wakes the sleeper within tens of microseconds of the deadline (see
    PreciseSleeper); gevent's own timers may wake up to ~1 ms late. Elsewhere, gevent's timers:
    they are armed against the loop's cached time, which can be stale by however long the current
    loop iteration has been running, so one sleep may wake slightly early; loop until due.
    """
    if deadline <= clock():
        return
    precise = sleeper()
    if precise is not None:
        precise.sleep_until(deadline)
        return
    while True:
        left = deadline - clock()
        if left <= 0:
            return
        gevent.sleep(left)
