"""Level control: drives the sweep's controller (specload.sweep.levels) through a run, steps a
capacity search (specload.sweep.capacity) as each probe level ends, judges each level's measured
records against the run's SLO as they come, and says each level's start and end in one log line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from locust.runners import MasterRunner

from specload.analysis.capacity import verdict_text
from specload.analysis.clientcheck import ClientFigures
from specload.analysis.columns import LevelColumns, itl_qs, slo_tally
from specload.core.records import PHASE_MEASURE, RequestRecord, level_label
from specload.core.slo import Slo, SloTally, parse_slo
from specload.sweep.capacity import CapacityRun
from specload.sweep.levels import LevelProgress, LevelStatus, SweepController, plan_levels
from specload.workload.config import Scenario

logger = logging.getLogger("specload")

Figures = Callable[[int], ClientFigures | None]  # the client's own figures of a level (ClientWatch)


class LevelControl:
    """The levels of one Locust process's runs: the controller, the SLO tallies, the search."""

    def __init__(self) -> None:
        self.ctrl: SweepController | None = None
        self.slo: Slo | None = None  # the run's SLO: each level is judged as its records come in
        self.slo_levels: dict[int, LevelColumns] = {}  # each level's measured records, for its SLO
        self.capacity: CapacityRun | None = None

    def new_run(self, sc: Scenario, capacity: CapacityRun | None) -> SweepController:
        """A new controller for a run of ``sc`` (or for the capacity search's probes)."""
        self.slo, self.slo_levels, self.capacity = parse_slo(sc.slo) if sc.slo else None, {}, capacity
        plans = [capacity.first_plan()] if capacity is not None else plan_levels(sc)
        self.ctrl = SweepController(
            plans,
            sc.pause_s,
            sc.level_timeout_s,
            outage_timeout_s=sc.outage_timeout_s,
            open_ended=capacity is not None,
        )
        return self.ctrl

    def judge(self, rec: RequestRecord) -> None:
        """A measured record into its level's columns, for the SLO."""
        if self.slo is not None and rec.phase == PHASE_MEASURE:
            self.slo_levels.setdefault(rec.level, LevelColumns(itl_qs(self.slo))).add(rec)

    def slo_tally(self, index: int) -> SloTally:
        """Level ``index``'s measured records so far as the run's SLO judges them."""
        assert self.slo is not None
        return slo_tally(self.slo_levels.get(index) or LevelColumns(), self.slo)

    def level_index(self) -> int | None:
        lv = self.ctrl.current if self.ctrl is not None else None
        return None if lv is None else lv.plan.index

    def done_index(self) -> int:
        """run.json's index of the level that ended last."""
        return self._last_done().plan.index

    def _last_done(self) -> LevelProgress:
        assert self.ctrl is not None
        return next(x for x in reversed(self.ctrl.levels) if x.status == LevelStatus.COMPLETED)

    def capacity_step(self, figures: Figures) -> bool:
        """A capacity search: the level just done is judged, and the next one appended (or the
        search ends). False when there was no step to take (no search, or it is over)."""
        ctrl = self.ctrl
        if self.capacity is None or ctrl is None or ctrl.finished or not ctrl.open_ended:
            return False
        lv = self._last_done()
        fig = figures(lv.plan.index)
        try:
            plan, line = self.capacity.level_done(
                lv.plan.index, self.slo_tally(lv.plan.index), fig.flag() if fig is not None else None
            )
        except (ValueError, NotImplementedError) as e:
            plan, line = None, f"capacity: the search stopped: {e}"
        logger.info("%s", line)
        if plan is not None:
            ctrl.append(plan)
        else:
            ctrl.close()
        return True

    @staticmethod
    def spawn_rate() -> float:
        """Any rate works: a level opens only once all C users exist, so they start together."""
        return 100.0

    def respread_users(self, runner: MasterRunner) -> None:
        """The lost worker's users go to the others now: the level keeps its concurrency. (Locust
        itself would wait for the next level, or for --enable-rebalancing, which also moves users
        around when a worker joins mid-level and cuts their requests.)"""
        assert self.ctrl is not None
        users = self.ctrl.desired_users()
        if self.ctrl.finished or users == 0 or not (runner.clients.ready or runner.clients.running):
            return
        logger.warning(
            "the remaining %d worker(s) take over its users: %d in all",
            len(runner.clients.ready) + len(runner.clients.running),
            users,
        )
        runner.start(users, self.spawn_rate())

    # the log ----------------------------------------------------------------------------------
    def log_run_start(self, label: str, host: str, sc: Scenario, model: str | None, run_dir: str) -> None:
        """The run's first log line (and the search's, for a capacity search)."""
        assert self.ctrl is not None
        logger.info(
            "sweep %r against %s (%s, model %s): %d level(s) %s; run directory %s",
            label,
            host,
            sc.backend,
            model,
            len(self.ctrl.levels),
            f"replaying trace {sc.trace}"
            if sc.trace
            else f"at {','.join(f'{r:g}' for r in sc.rates)} requests/s"
            if sc.rates
            else ",".join(map(str, sc.levels)),
            run_dir,
        )
        if self.capacity is not None:
            sp = self.capacity.space
            logger.info(
                "capacity search under the SLO %s: from %g (min %g, max %g, at most %d probes); each probe "
                "is a level of its own",
                self.capacity.slo,
                sp.start,
                sp.minimum,
                sp.maximum,
                sp.max_probes,
            )

    def log_level_start(self) -> None:
        assert self.ctrl is not None
        lv = self.ctrl.current
        assert lv is not None
        p = lv.plan
        what = f"{p.budget} requests" if p.budget is not None else f"{p.duration_s:g} s"
        warm = f" after {p.warmup} warmup" if p.warmup else ""
        load = (
            f"C={p.concurrency}"
            if p.rate is None
            else (
                f"{p.rate:g} requests/s on average (the trace's times), at most {p.concurrency} in flight"
                if p.offsets is not None
                else f"{p.rate:g} requests/s ({p.arrival}), at most {p.concurrency} in flight"
            )
        )
        logger.info(
            "level %d/%d %s started: %s, %s%s",
            p.index + 1,
            len(self.ctrl.levels),
            level_label(p.concurrency, p.repeat, p.rate),
            load,
            what,
            warm,
        )

    def log_level_done(self, figures: Figures) -> None:
        assert self.ctrl is not None
        lv = self._last_done()
        p, agg = lv.plan, lv.agg_tok_s()
        wall = (lv.last_end - lv.first_send) if lv.first_send and lv.last_end else 0.0
        budget = p.budget if p.budget is not None else lv.granted
        fig = figures(p.index)
        flag = fig.flag() if fig is not None else None
        client = f"; {flag}" if flag else "; client ok" if fig is not None else ""
        if self.slo is not None and self.capacity is None:  # (a capacity search says it in its own line)
            client += f"; {verdict_text(self.slo_tally(p.index).result())}"
        logger.log(
            logging.WARNING if flag else logging.INFO,
            "level %d/%d %s done: %d/%d requests, ok %d, failed %d, short %d, "
            "%d tokens, agg %s tok/s over %.1f s%s",
            p.index + 1,
            len(self.ctrl.levels),
            level_label(p.concurrency, p.repeat, p.rate),
            lv.received,
            budget,
            lv.ok,
            lv.failed,
            lv.short,
            lv.tokens,
            f"{agg:.1f}" if agg is not None else "-",
            wall,
            client,
        )

    def log_resumed(self) -> None:
        assert self.ctrl is not None
        lv = self.ctrl.current
        logger.warning(
            "the server answers again; new requests resume%s",
            f" ({level_label(lv.plan.concurrency, lv.plan.repeat, lv.plan.rate)})" if lv else "",
        )
