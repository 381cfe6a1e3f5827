"""Clock offsets of the workers, measured by the master over Locust's own messages.

The master pings a worker a few times when it joins and when a run starts; the worker answers
each ping with its wall clock at once (in its message loop, not behind the users). The math is in
``specload.core.clocks``; the results go to run.json ``clients`` through the owner.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import gevent

from specload.core.clocks import ClockSample, estimate
from specload.core.rundir import ClientClock
from specload.locust.protocol import MSG_CLOCK_PING, MSG_CLOCK_PONG, ClockPing, ClockPong, WireError, decode

logger = logging.getLogger("specload")

PINGS = 5
PING_GAP_S = 0.1  # spread out: one quiet moment among them is enough
ANSWER_WAIT_S = 1.0  # after the last ping: answers later than this are not waited for
KEEP = 64  # samples kept per worker: each measurement refines the estimate (the tightest ping wins)


class ClockProbe:
    """The master's side; ``on_clock`` gets each worker's ClientClock after each measurement.

    A busy worker (starting up, spawning users) answers late, and a late answer says little; so
    samples accumulate over the run (at connect, at the run's start, at each level's start) and the
    estimate is always the tightest round trip seen so far."""

    def __init__(self, runner: Any, on_clock: Callable[[ClientClock], None]) -> None:
        self.runner = runner
        self.on_clock = on_clock
        self._samples: dict[str, deque[ClockSample]] = {}
        self._measuring: set[str] = set()

    def register(self) -> None:
        self.runner.register_message(MSG_CLOCK_PONG, self.on_pong)

    def measure(self, worker: str, delay_s: float = 0.0) -> None:
        if worker not in self._measuring:
            self._measuring.add(worker)
            self._samples.setdefault(worker, deque(maxlen=KEEP))
            gevent.spawn(self._measure, worker, delay_s)

    def _measure(self, worker: str, delay_s: float) -> None:
        try:
            gevent.sleep(delay_s)
            for _ in range(PINGS):
                self.runner.send_message(MSG_CLOCK_PING, ClockPing(time.time()).to_wire(), client_id=worker)
                gevent.sleep(PING_GAP_S)
            gevent.sleep(ANSWER_WAIT_S)
        finally:
            self._measuring.discard(worker)
        clock = estimate(worker, self._samples.get(worker, ()), time.time())
        if clock is None:
            logger.warning("worker %s did not answer the clock pings: its clock offset is unknown", worker)
        else:
            self.on_clock(clock)

    def on_pong(self, environment: Any, msg: Any, **_: Any) -> None:
        received = time.time()
        samples = self._samples.get(msg.node_id)
        if samples is not None:
            try:
                pong = decode(ClockPong.from_wire, msg.data)
            except WireError as e:
                logger.debug("a clock answer from %s was refused: %s", msg.node_id, e)
                return
            samples.append(ClockSample(pong.sent, pong.remote, received))


def register_clock_answer(runner: Any) -> None:
    """The worker's side: answer every ping with this machine's clock."""

    def on_ping(environment: Any, msg: Any, **_: Any) -> None:
        try:
            ping = decode(ClockPing.from_wire, msg.data)
        except WireError as e:
            logger.debug("a clock ping was refused: %s", e)
            return
        runner.send_message(MSG_CLOCK_PONG, ClockPong(ping.sent, time.time()).to_wire())

    runner.register_message(MSG_CLOCK_PING, on_ping)
