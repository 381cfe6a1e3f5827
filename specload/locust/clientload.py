"""The load generator's own load, measured in every Locust process: CPU and event-loop lag per level.

One greenlet per process sleeps a fixed short interval and notes how late it woke: that lag is
what every user of the process waits for its turn, so it is also how late tokens are read and
requests sent. With the process's CPU seconds per wall second over the same time, it tells a
client that kept up from one that measured itself (the verdict: ``specload.analysis.clientcheck``).

Measured only while a level hands out tickets or drains (not during ramps and pauses, which would
dilute a busy level with idle time). The summary so far goes to the sweep's owner a few times a
second and once more when the level ends; the owner keeps the latest per process. The same
messages carry the output tokens the process's streams have read in the level so far (the web UI's
live tok/s, before any request of a long level has ended). Cost: 20 wake-ups and 4 small messages a
second, a fixed-size histogram per level.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import gevent

from specload.analysis.clientcheck import ACTIVE_PHASES, LagHistogram, ProcessLoad
from specload.client.stream import streamed_tokens
from specload.locust.protocol import ClientLoadMsg

logger = logging.getLogger("specload")

INTERVAL_S = 0.05
REPORT_EVERY_S = 0.25

# (run id, level index) while a level is active in this process's view, else None.
Where = Callable[[], tuple[str | None, int] | None]


class LoadProbe:
    """The probe of one process; ``sink`` delivers each summary to the owner."""

    def __init__(
        self, where: Where, sink: Callable[[ClientLoadMsg], None], interval_s: float = INTERVAL_S
    ) -> None:
        self.where = where
        self.sink = sink
        self.interval_s = interval_s
        self._key: tuple[str | None, int] | None = None
        self._lags = LagHistogram()
        self._t0 = self._cpu0 = self._last_report = 0.0
        self._wait0: float | None = None
        self._tokens0 = 0  # the process's streamed-token count when the level began
        self._greenlet: gevent.Greenlet | None = None

    def start(self) -> None:
        if self._greenlet is None:
            self._greenlet = gevent.spawn(self._run)

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill(block=False)
            self._greenlet = None

    def _run(self) -> None:
        while True:
            asked = time.perf_counter()
            gevent.sleep(self.interval_s)
            now = time.perf_counter()
            try:
                self.tick(now, now - asked - self.interval_s)
            except Exception as e:  # noqa: BLE001 - a probe must never take a process down
                logger.debug("client load probe: %s", e)

    def tick(self, now: float, lag_s: float) -> None:
        """One wake-up, ``lag_s`` late: counted for the active level, reported now and then."""
        key = self.where()
        if key != self._key:
            self._report(now)  # the last word on the level that ended (if any)
            self._key, self._lags = key, LagHistogram()
            self._t0, self._cpu0, self._wait0, self._last_report = now, time.process_time(), cpu_wait_s(), now
            self._tokens0 = streamed_tokens[0]
            return  # this wake-up straddled the change: it belongs to neither level
        if key is None:
            return
        self._lags.add(lag_s * 1000.0)
        if now - self._last_report >= REPORT_EVERY_S:
            self._last_report = now
            self._report(now)

    def _report(self, now: float) -> None:
        if self._key is None or self._lags.n == 0:
            return
        wall = now - self._t0
        wait = cpu_wait_s()
        waited = None if wait is None or self._wait0 is None else wait - self._wait0
        load = ProcessLoad.measured(time.process_time() - self._cpu0, wall, self._lags, waited)
        self.sink(ClientLoadMsg(self._key[0], self._key[1], load, streamed_tokens[0] - self._tokens0))


def cpu_wait_s() -> float | None:
    """Seconds this thread (gevent's: every greenlet of the process) spent ready to run but waiting
    for a CPU, from Linux's schedstat; None where the kernel does not say."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def user_side_where(side: Any) -> Callable[[], tuple[str | None, int] | None]:
    """A user process's view of the active level: the owner's last state broadcast."""

    def where() -> tuple[str | None, int] | None:
        st = side.state
        return (side.config_id, st.level) if st.level is not None and st.phase in ACTIVE_PHASES else None

    return where
