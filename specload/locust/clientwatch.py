"""The client's own health during a run, watched by the owner: the workers' clocks, each process's
load (CPU, event-loop lag) and the requests really in flight per level, and the server's outages.

A figure measured by a client that was itself overloaded, or whose clock is off, or that kept
sending while the server was away, says something else than it seems to: what is watched here
goes into run.json beside the figures (specload.analysis.clientcheck judges it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import gevent
from locust.runners import STATE_MISSING, MasterRunner

from specload.analysis.clientcheck import (
    ClientFigures,
    LevelTraffic,
    ProcessLoad,
    in_flight_due,
    judge_in_flight,
    peak_in_flight,
)
from specload.client.probe import server_back
from specload.core.clocks import describe, is_off
from specload.core.records import FAILED, PHASE_MEASURE, RequestRecord
from specload.core.rundir import ClientClock
from specload.locust.clockprobe import ClockProbe
from specload.locust.protocol import ClientLoadMsg, RunConfig
from specload.sweep.levels import Change, LevelStatus, SweepController

logger = logging.getLogger("specload")

# Worker clocks are measured at each level's start and at least this often (a few tiny messages):
# the estimate keeps the tightest round trip, so a worker busy whenever a level starts (spawning
# users) still gets a quiet moment to be measured in.
CLOCK_REFRESH_S = 2.0
# Pauses between the checks of a server that refused a connection: a restart of a fraction of a
# second costs about that much, a longer one is checked once a second until --outage-timeout.
_OUTAGE_CHECKS_S = (0.05, 0.1, 0.25, 0.5, 1.0)

InFlight = tuple[float | None, str | None, int | None]  # judge_in_flight's answer, and the peak


class ClientWatch:
    """Clocks, client load and outages of one Locust process's runs.

    ``on_clock``: a worker's clock was measured (again); ``current``: the controller of the run
    under way (an outage watch ends with its run); ``on_changes``: the controller's changes when
    the server is back.
    """

    def __init__(
        self,
        environment: Any,
        on_clock: Callable[[ClientClock], None],
        current: Callable[[], SweepController | None],
        on_changes: Callable[[list[Change]], None],
    ) -> None:
        self.env = environment
        self.on_clock = on_clock
        self.current = current
        self.on_changes = on_changes
        self.clocks: dict[str, ClientClock] = {}  # each worker's clock against ours (master only)
        self.clock_probe: ClockProbe | None = None
        self._clock_round = 0.0  # when the workers' clocks were last measured
        # The client's own load per level: each process's latest report, and the requests in flight.
        self.client_load: dict[int, dict[str, ProcessLoad]] = {}
        self.traffic: dict[int, LevelTraffic] = {}
        # Per level, by record count.
        self._in_flight: dict[int, tuple[int, InFlight]] = {}
        self._outage_watch: Any = None  # the greenlet checking whether the server is back

    def register(self, runner: Any) -> None:
        """A master measures its workers' clocks (when they connect, then as the runs go)."""
        if isinstance(runner, MasterRunner):
            self.clock_probe = ClockProbe(runner, self._clock)
            self.clock_probe.register()
            # A worker's init may still be running when it connects: give it a second.
            self.env.events.worker_connect.add_listener(
                lambda client_id, **_: self._measure_clock(client_id, 1.0)
            )

    def new_run(self) -> None:
        self.client_load, self.traffic, self._in_flight = {}, {}, {}

    # worker clocks ----------------------------------------------------------------------------
    def clocks_for_run(self) -> list[ClientClock] | None:
        """The workers' clocks for the new run.json (None: no workers), and a new measurement of
        each (refining it)."""
        runner = self.env.runner
        if not isinstance(runner, MasterRunner):
            return None
        alive = sorted(c.id for c in runner.clients.all if c.state != STATE_MISSING)
        for worker in alive:
            self._measure_clock(worker)
        return [self.clocks[w] for w in alive if w in self.clocks]

    def clocks_for_level(self) -> None:
        self._clock_round = time.time()
        runner = self.env.runner
        if isinstance(runner, MasterRunner):
            for c in runner.clients.all:
                if c.state != STATE_MISSING:
                    self._measure_clock(c.id)

    def refresh_clocks(self) -> None:
        """A worker busy at every level start still gets quiet pings."""
        if time.time() - self._clock_round >= CLOCK_REFRESH_S:
            self.clocks_for_level()

    def _measure_clock(self, worker: str, delay_s: float = 0.0) -> None:
        if self.clock_probe is not None:
            self.clock_probe.measure(worker, delay_s)

    def _clock(self, clock: ClientClock) -> None:
        known = self.clocks.get(clock.worker)
        self.clocks[clock.worker] = clock
        if is_off(clock) and (known is None or not is_off(known)):  # said once per worker
            logger.warning(
                "%s: records carry wall-clock times, so its requests sit that far off in every level "
                "window; sync the clocks (chrony/NTP)",
                describe(clock),
            )
        else:
            logger.debug("%s", describe(clock))
        self.on_clock(clock)

    # the client's own load ---------------------------------------------------------------------
    def add_record(self, rec: RequestRecord) -> None:
        """The record's span, for the requests in flight in its level (until that figure is final)."""
        if rec.level not in self._in_flight or rec.level in self.traffic:
            self.traffic.setdefault(rec.level, LevelTraffic()).add(
                rec.t_send, rec.t_end, rec.phase == PHASE_MEASURE, rec.status == FAILED
            )

    def take_load(self, process: str, m: ClientLoadMsg, levels: int) -> bool:
        """A process's load in a level so far (its latest report replaces the one before); False
        when it is not about one of this run's ``levels``."""
        if not 0 <= m.level < levels:
            return False
        self.client_load.setdefault(m.level, {})[process] = m.load
        return True

    def figures(self, index: int, ctrl: SweepController, stagger_s: float) -> ClientFigures | None:
        """The client's own load in level ``index`` so far; None before anything was measured."""
        if not 0 <= index < len(ctrl.levels):
            return None
        procs, traffic = self.client_load.get(index, {}), self.traffic.get(index)
        cached = self._in_flight.get(index)
        if not procs and traffic is None and cached is None:
            return None
        lv = ctrl.levels[index]
        if traffic is not None:
            final = lv.status == LevelStatus.COMPLETED
            if in_flight_due(
                cached[0] if cached is not None else None, len(traffic.spans), final
            ):  # O(records)
                away = lv.refused > 0 or lv.outage_s > 0
                judged = judge_in_flight(
                    traffic, lv.plan.concurrency, lv.plan.budget, away, stagger_s, lv.plan.rate
                )
                cached = self._in_flight[index] = (
                    len(traffic.spans),
                    (*judged, peak_in_flight(traffic.spans)),
                )
            if final:
                del self.traffic[index]  # every record is in: the figure is final, the spans can go
        mif, why, peak = cached[1] if cached is not None else (None, "no measured request", None)
        return ClientFigures(lv.plan.concurrency, dict(procs), mif, why, peak).as_stored()

    # outages ----------------------------------------------------------------------------------
    def watch_outage(self, ctrl: SweepController, config: RunConfig) -> None:
        """A refused connection: hold new requests and check the server with growing pauses; the
        controller stops the sweep if it stays away longer than --outage-timeout."""
        logger.warning(
            "the server refused a connection (%s); no new request starts until it answers again "
            "(at most %g s, --outage-timeout)",
            ctrl.outage_reason(),
            ctrl.outage_timeout_s,
        )
        if self._outage_watch is not None and not self._outage_watch.dead:
            return
        self._outage_watch = gevent.spawn(self._check_until_back, ctrl, config)

    def _check_until_back(self, ctrl: SweepController, config: RunConfig) -> None:
        timeout = min(config.scenario.connect_timeout_s, 2.0)
        checks = 0
        while self.current() is ctrl and not ctrl.finished and ctrl.outage_since is not None:
            gevent.sleep(_OUTAGE_CHECKS_S[min(checks, len(_OUTAGE_CHECKS_S) - 1)])
            checks += 1
            why = server_back(config.host, timeout, config.insecure, config.send_key)
            if why is None:
                self.on_changes(ctrl.resume())
                return
            logger.debug("server not back yet: %s", why)
