"""The sweep's level state machine: which level runs, which requests may start, when a level ends.

Pure bookkeeping with an injectable clock, so every transition is testable without Locust.
It lives in one process (the Locust master, or the only process when local) and hands out
*tickets*: a user may start a request only with a ticket, which is what makes "a budget of N
means exactly N measured requests" hold however many processes send load. A level ends only
when every ticket it issued has come back as a record, so no request straddles two levels.

Per level: ramping (waiting for C users) -> warmup (W tickets, then wait for their records)
-> measure (budget tickets, or until the duration ends) -> draining (wait for in-flight records)
-> done. Then an optional pause, and the next level.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum

from specload.core.records import FAILED, OK, PHASE_MEASURE, PHASE_WARMUP, SHORT, Phase, RequestRecord
from specload.core.rundir import LevelMeta
from specload.workload.arrivals import POISSON, FixedSchedule, Schedule, schedule_seed
from specload.workload.config import Scenario
from specload.workload.replay import replay_of


class Change(str, Enum):
    """A transition the controller reports, so the owner can log it and tell the users."""

    START = "start"  # the level began ramping its users
    WARMUP = "warmup"  # its tickets opened, warmup first
    MEASURE = "measure"  # its measured tickets opened
    DRAINING = "draining"  # no more tickets; waiting for the records in flight
    DONE = "done"  # every record is back
    FINISHED = "finished"  # that was the last level
    ABORT = "abort"  # the sweep stopped (breaker, every request failed)
    TIMEOUT = "timeout"  # the level ran out of time
    OUTAGE = "outage"  # the server refused a connection: no new tickets until it answers again
    RESUMED = "resumed"  # it answers again: tickets flow


class LevelStatus(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"


class Outcome(str, Enum):
    RUNNING = "running"
    COMPLETED = "completed"
    ABORTED = "aborted"


# A rate level's first request is due this long after its phase opens: time for the first grants
# to reach their users and for them to build their requests, so that the schedule's start is not
# late by construction.
SCHEDULE_LEAD_S = 0.05
# A rate level's ticket is granted at most this long before its request is due: users do not sit
# on far-future tickets (a pool's users are interchangeable; whoever is free near the time sends).
GRANT_AHEAD_S = 0.1
# A replayed trace starts later and grants earlier: its requests come in bursts (up to tens due at
# one instant, prompts up to ~100k tokens), and each is built (token ids, JSON body) before it is
# due, ~30 ms for a 250k-token burst, more for a run's first burst, whose users also connect. With
# the rate level's 0.05 s and 0.1 s, the first burst of a Mooncake window went 3-58 ms late.
TRACE_LEAD_S = 0.5
TRACE_GRANT_AHEAD_S = 0.4

PENDING, RAMPING, WARMUP, MEASURE, DRAINING, DONE = (
    Phase.PENDING,
    Phase.RAMPING,
    Phase.WARMUP,
    Phase.MEASURE,
    Phase.DRAINING,
    Phase.DONE,
)


@dataclass(frozen=True)
class LevelPlan:
    index: int
    concurrency: int
    repeat: int
    budget: int | None  # None: time-boxed
    warmup: int
    duration_s: float | None
    warmup_tokens: int
    output_tokens: int
    # A rate level (requests/s, open loop): requests are due on a seeded schedule and
    # ``concurrency`` is the user pool, the cap on requests in flight. None: a concurrency level.
    rate: float | None = None
    arrival: str = POISSON
    burstiness: float = 1.0
    seed: int = 0
    # A trace replay (specload.workload.replay): each measured request's due time after the phase
    # opens, the trace's own (``rate`` is then the window's mean requests/s). None: drawn arrivals.
    offsets: tuple[float, ...] | None = field(default=None, repr=False)

    @property
    def x(self) -> float:
        """The level's value on a report's x axis: its rate, or its concurrency."""
        return self.rate if self.rate is not None else self.concurrency


def plan_levels(sc: Scenario) -> list[LevelPlan]:
    """The sweep's levels in order. A trace replay is one level per repeat, its budget the window's
    requests, due at the trace's times (reads the trace: TraceError when it cannot be replayed)."""
    plans: list[LevelPlan] = []
    replay = replay_of(sc)
    if replay is not None:
        for r in range(sc.repeat):
            plans.append(
                LevelPlan(
                    index=len(plans),
                    concurrency=sc.pool(),
                    repeat=r,
                    budget=len(replay.requests),
                    warmup=0,
                    duration_s=None,
                    warmup_tokens=sc.warmup_tokens,
                    output_tokens=sc.output_tokens,
                    rate=round(replay.rate, 6),
                    seed=sc.seed,
                    offsets=replay.offsets,
                )
            )
        return plans
    if sc.rates:
        for rate in sc.rates:
            for r in range(sc.repeat):
                plans.append(
                    LevelPlan(
                        index=len(plans),
                        concurrency=sc.pool(),
                        repeat=r,
                        budget=sc.rate_budget(rate),
                        warmup=sc.warmup_requests,
                        duration_s=sc.duration_s,
                        warmup_tokens=sc.warmup_tokens,
                        output_tokens=sc.output_tokens,
                        rate=rate,
                        arrival=sc.arrival,
                        burstiness=sc.burstiness,
                        seed=sc.seed,
                    )
                )
        return plans
    for c in sc.levels:
        for r in range(sc.repeat):
            plans.append(
                LevelPlan(
                    index=len(plans),
                    concurrency=c,
                    repeat=r,
                    budget=sc.budget(c),
                    warmup=sc.warmup_requests,
                    duration_s=sc.duration_s,
                    warmup_tokens=sc.warmup_tokens,
                    output_tokens=sc.output_tokens,
                )
            )
    return plans


@dataclass(frozen=True, slots=True)
class Grant:
    """Permission to send one request (a ticket)."""

    level: int
    concurrency: int
    repeat: int
    phase: str
    seq: int
    max_tokens: int
    # Rate levels: seconds from the grant to the request's due time (negative: it is already late,
    # all users were busy). The user waits this long on its own clock, so no clock is compared.
    delay_s: float | None = None
    rate: float | None = None  # the level's requests/s (None: a concurrency level)


@dataclass
class LevelProgress:
    plan: LevelPlan
    phase: Phase = Phase.PENDING
    granted_warmup: int = 0
    received_warmup: int = 0
    granted: int = 0
    received: int = 0
    ok: int = 0
    failed: int = 0
    short: int = 0
    tokens: int = 0
    first_send: float | None = None
    last_end: float | None = None
    t_start: float | None = None
    t_measure_start: float | None = None
    t_end: float | None = None
    lost: int = 0  # granted requests whose records can never arrive (their worker died)
    refused: int = 0  # measured requests refused by the server (an outage: counted as failed)
    outage_s: float = 0.0  # time the level spent waiting for the server to come back
    status: LevelStatus = LevelStatus.PENDING
    note: str | None = None
    # Rate levels: each phase's arrival schedule and the time it opened (its offsets' origin).
    schedule: Schedule | FixedSchedule | None = None
    t_phase: float | None = None

    @property
    def in_flight(self) -> int:
        return (self.granted_warmup - self.received_warmup) + (self.granted - self.received)

    def agg_tok_s(self) -> float | None:
        """Output tokens of the measured requests back over the time from the first one's send to the
        last one's end: the level's Agg tok/s so far (docs/metrics.md), before its records are read."""
        if self.first_send is None or self.last_end is None or self.last_end <= self.first_send:
            return None
        return self.tokens / (self.last_end - self.first_send)

    def meta(self) -> LevelMeta:
        """The level's entry in run.json."""
        p = self.plan
        return LevelMeta(
            index=p.index,
            concurrency=p.concurrency,
            repeat=p.repeat,
            budget=p.budget,
            warmup=p.warmup,
            duration_s=p.duration_s,
            t_start=self.t_start,
            t_measure_start=self.t_measure_start,
            t_end=self.t_end,
            status=self.status.value,
            granted=self.granted,
            received=self.received,
            granted_warmup=self.granted_warmup,
            received_warmup=self.received_warmup,
            lost=self.lost,
            refused=self.refused,
            outage_s=round(self.outage_s, 3),
            note=self.note,
            rate=p.rate,
        )


def failure_class(rec: RequestRecord) -> str | None:
    """The kind of failure that, repeated, means no request can succeed; None for any other outcome.

    Client errors (4xx but 408 and 429) are deterministic: the same request will be rejected again.
    A refused connection means the server is gone. Server errors, rate limits, timeouts and cut
    streams can be transient and do not count.
    """
    if rec.status != FAILED:
        return None
    code = rec.http_status
    if isinstance(code, int) and 400 <= code < 500 and code not in (408, 429):
        return f"HTTP {code}"
    if code is None and REFUSED in (rec.reason or ""):
        return REFUSED
    return None


REFUSED = "connection refused"


@dataclass
class SweepController:
    plans: list[LevelPlan]
    pause_s: float = 0.0
    level_timeout_s: float = 3600.0
    clock: Callable[[], float] = time.time
    # Stop after this many consecutive requests failed the same hopeless way (failure_class).
    breaker: int = 5
    # A refused connection is an outage (a server restarting), not a verdict: no new tickets until
    # the owner sees the server answer again (resume), for at most this long; then the sweep stops.
    outage_timeout_s: float = 10.0
    # More levels may come while the sweep runs (a capacity search, specload.analysis.capacity): the last
    # level's end then waits for append() or close() instead of finishing the sweep.
    open_ended: bool = False
    outage_since: float | None = None
    _outage_level: int | None = None
    _outage_last: str | None = None
    levels: list[LevelProgress] = field(init=False)
    cursor: int = 0  # index of the current level
    finished: bool = False
    outcome: Outcome = Outcome.RUNNING
    abort_reason: str | None = None
    _streak: int = 0
    _streak_class: str | None = None

    def __post_init__(self) -> None:
        self.levels = [LevelProgress(p) for p in self.plans]

    @property
    def current(self) -> LevelProgress | None:
        return None if self.finished or self.cursor >= len(self.levels) else self.levels[self.cursor]

    @property
    def is_open(self) -> bool:
        lv = self.current
        return lv is not None and lv.phase in (WARMUP, MEASURE) and self._can_grant(lv)

    def _can_grant(self, lv: LevelProgress) -> bool:
        if self.outage_since is not None:
            return False
        if lv.phase == WARMUP:
            return lv.granted_warmup < lv.plan.warmup
        if lv.phase == MEASURE:
            return lv.plan.budget is None or lv.granted < lv.plan.budget
        return False

    def desired_users(self) -> int:
        lv = self.current
        return 0 if lv is None or lv.phase == PENDING else lv.plan.concurrency

    def tick(self, user_count: int) -> list[Change]:
        """Advance time-driven transitions; returns the transitions that happened (for logs)."""
        changes: list[Change] = []
        lv = self.current
        if lv is None:
            return changes
        now = self.clock()
        if lv.phase == PENDING:
            prev = self.levels[self.cursor - 1] if self.cursor else None
            if prev is None or prev.t_end is None or now - prev.t_end >= self.pause_s:
                lv.phase, lv.status, lv.t_start = RAMPING, LevelStatus.RUNNING, now
                changes.append(Change.START)
        if lv.phase == RAMPING and user_count >= lv.plan.concurrency:
            self._open(lv, now)
            changes.append(Change(lv.phase.value))
        if (
            lv.phase == MEASURE
            and lv.plan.duration_s is not None
            and lv.t_measure_start is not None
            and now - lv.t_measure_start >= lv.plan.duration_s
        ):
            lv.phase = DRAINING
            changes.append(Change.DRAINING)
        changes += self._maybe_finish_level(lv, now)
        if (
            self.outage_since is not None
            and now - self.outage_since > self.outage_timeout_s
            and not self.finished
        ):
            self.abort(
                f"the server refused connections for {now - self.outage_since:.1f} s "
                f"(--outage-timeout {self.outage_timeout_s:g}); last: {self._outage_last}"
            )
            return changes + [Change.ABORT]
        if (
            lv.phase not in (DONE, PENDING)
            and lv.t_start is not None
            and now - lv.t_start > self.level_timeout_s
        ):
            lv.status, lv.t_end = LevelStatus.INCOMPLETE, now
            lv.note = (
                f"level timed out after {self.level_timeout_s:g} s with {lv.in_flight} requests in flight"
            )
            self.abort(lv.note)
            changes.append(Change.TIMEOUT)
        return changes

    def _open(self, lv: LevelProgress, now: float) -> None:
        if lv.plan.warmup > 0:
            lv.phase = WARMUP
        else:
            lv.phase, lv.t_measure_start = MEASURE, now
        self._schedule(lv, now)

    @staticmethod
    def _schedule(lv: LevelProgress, now: float) -> None:
        """A rate level's phase opened: its arrivals are due from now."""
        p = lv.plan
        if p.offsets is not None and lv.phase == MEASURE:
            lv.schedule, lv.t_phase = FixedSchedule(p.offsets), now + TRACE_LEAD_S
        elif p.rate is not None:
            seed = schedule_seed(p.seed, p.index, PHASE_WARMUP if lv.phase == WARMUP else PHASE_MEASURE)
            lv.schedule, lv.t_phase = Schedule(p.rate, p.arrival, p.burstiness, seed), now + SCHEDULE_LEAD_S

    def grant(self) -> Grant | None:
        lv = self.current
        if lv is None or not self._can_grant(lv):
            return None
        p = lv.plan
        if lv.phase == WARMUP:
            g = Grant(
                p.index,
                p.concurrency,
                p.repeat,
                PHASE_WARMUP,
                lv.granted_warmup,
                p.warmup_tokens,
                self._delay(lv, lv.granted_warmup),
                p.rate,
            )
            lv.granted_warmup += 1
        else:
            g = Grant(
                p.index,
                p.concurrency,
                p.repeat,
                PHASE_MEASURE,
                lv.granted,
                p.output_tokens,
                self._delay(lv, lv.granted),
                p.rate,
            )
            lv.granted += 1
            if p.budget is not None and lv.granted >= p.budget:
                lv.phase = DRAINING
        return g

    def wait_s(self) -> float | None:
        """Seconds until the next ticket may be granted: 0 now; None when no ticket is available
        (the level is closed or between phases). Only a rate level's tickets ever wait: each is
        granted GRANT_AHEAD_S (a trace's: TRACE_GRANT_AHEAD_S) before its request is due."""
        lv = self.current
        if lv is None or not self._can_grant(lv):
            return None
        if lv.schedule is None or lv.t_phase is None:
            return 0.0
        seq = lv.granted_warmup if lv.phase == WARMUP else lv.granted
        ahead = TRACE_GRANT_AHEAD_S if isinstance(lv.schedule, FixedSchedule) else GRANT_AHEAD_S
        return max(0.0, lv.t_phase + lv.schedule.offset(seq) - ahead - self.clock())

    def _delay(self, lv: LevelProgress, seq: int) -> float | None:
        if lv.schedule is None or lv.t_phase is None:
            return None
        return lv.t_phase + lv.schedule.offset(seq) - self.clock()

    def give_back(self, level: int, phase: str) -> None:
        """A ticket that was granted but never used (its user was stopped before sending)."""
        lv = self.levels[level]
        if phase == PHASE_WARMUP:
            lv.granted_warmup -= 1
        else:
            lv.granted -= 1
            if lv.phase == DRAINING and lv.plan.budget is not None:
                lv.phase = MEASURE

    def receive(self, rec: RequestRecord) -> list[Change]:
        """Account one finished request's record; returns transitions it caused."""
        if not 0 <= rec.level < len(self.levels):
            return []
        lv = self.levels[rec.level]
        if rec.phase == PHASE_WARMUP:
            lv.received_warmup += 1
        else:
            lv.received += 1
            status = rec.status
            if status == OK:
                lv.ok += 1
            elif status == SHORT:
                lv.short += 1
            elif status == FAILED:
                lv.failed += 1
            lv.tokens += rec.output_tokens or 0
            lv.first_send = rec.t_send if lv.first_send is None else min(lv.first_send, rec.t_send)
            lv.last_end = rec.t_end if lv.last_end is None else max(lv.last_end, rec.t_end)
        cls = failure_class(rec)
        if cls == REFUSED:
            if rec.phase != PHASE_WARMUP:
                lv.refused += 1
            return self._outage(rec) + self._settle(lv)
        if cls is None:
            self._streak, self._streak_class = 0, None
        elif cls == self._streak_class:
            self._streak += 1
        else:
            self._streak, self._streak_class = 1, cls
        if self._streak >= self.breaker and not self.finished:
            self.abort(f"{self._streak} requests in a row failed with {cls}; last: {rec.reason}")
            return [Change.ABORT]
        return self._settle(lv)

    def _settle(self, lv: LevelProgress) -> list[Change]:
        """After a record (or a written-off one) came back: warmup over? level over?"""
        if lv is not self.current:
            return []
        now = self.clock()
        changes: list[Change] = []
        if (
            lv.phase == WARMUP
            and lv.granted_warmup >= lv.plan.warmup
            and lv.received_warmup >= lv.plan.warmup
        ):
            lv.phase, lv.t_measure_start = MEASURE, now
            self._schedule(lv, now)
            changes.append(Change.MEASURE)
        return changes + self._maybe_finish_level(lv, now)

    def _maybe_finish_level(self, lv: LevelProgress, now: float) -> list[Change]:
        if lv.phase != DRAINING or lv.in_flight > 0:
            return []
        lv.phase, lv.status, lv.t_end = DONE, LevelStatus.COMPLETED, now
        if 2 * lv.lost > lv.received:
            # Most of its budget never reported: what was measured is not the level asked for.
            lv.status = LevelStatus.INCOMPLETE
            lost = f"{lv.lost} of its {lv.received} measured requests were lost (more than half)"
            lv.note = f"{lv.note}; {lost}" if lv.note else lost
        changes = [Change.DONE]
        if lv.received > 0 and lv.ok == 0 and lv.short == 0 and lv.refused < lv.received:
            # (A level refused whole is an outage's: the outage timeout decides whether to go on.)
            self.abort(f"every measured request of level C={lv.plan.concurrency} failed")
            changes.append(Change.ABORT)
            return changes
        self.cursor += 1
        if self.cursor >= len(self.levels) and not self.open_ended:
            self.finished, self.outcome = True, Outcome.COMPLETED
            changes.append(Change.FINISHED)
        return changes

    def append(self, plan: LevelPlan) -> LevelPlan:
        """Add a level after the others while the sweep runs (its index is the next one); it starts
        like any level, after the pause, once the levels before it are done."""
        plan = replace(plan, index=len(self.levels))
        self.plans.append(plan)
        self.levels.append(LevelProgress(plan))
        return plan

    def close(self) -> list[Change]:
        """No more levels will be appended: an open-ended sweep whose levels are all done is finished."""
        self.open_ended = False
        if self.finished or self.cursor < len(self.levels):
            return []
        self.finished, self.outcome = True, Outcome.COMPLETED
        return [Change.FINISHED]

    def _outage(self, rec: RequestRecord) -> list[Change]:
        self._outage_last = rec.reason
        if self.outage_since is not None or self.finished:
            return []
        self.outage_since, self._outage_level = self.clock(), rec.level
        return [Change.OUTAGE]

    def outage_reason(self) -> str:
        return f"{self._outage_last}" if self._outage_last else "no outage"

    def resume(self) -> list[Change]:
        """The server answers again (the owner checked): tickets flow; the outage is noted on its level."""
        if self.outage_since is None:
            return []
        waited = self.clock() - self.outage_since
        lv = self.levels[self._outage_level or 0]
        lv.outage_s += waited
        outage = (
            f"the server refused connections for {waited:.2f} s; {lv.refused} measured request(s) refused"
        )
        lv.note = f"{lv.note}; {outage}" if lv.note else outage
        self.outage_since = self._outage_level = None
        return [Change.RESUMED]

    def write_off(self, level: int, phase: str, n: int, why: str) -> list[Change]:
        """Count ``n`` granted requests as lost (their records will never come), so the level can end."""
        lv = self.levels[level]
        if phase == PHASE_WARMUP:
            lv.received_warmup += n
        else:
            lv.received += n
            lv.lost += n
        lv.note = why
        return self._settle(lv)

    def abort(self, reason: str) -> None:
        if self.finished:
            return
        self.finished, self.outcome, self.abort_reason = True, Outcome.ABORTED, reason
        for lv in self.levels:
            if lv.status == LevelStatus.RUNNING:
                lv.status = LevelStatus.INCOMPLETE
                lv.note = lv.note or reason
                if lv.t_end is None:
                    lv.t_end = self.clock()

    def state(self) -> SweepState:
        """What users need to know: the current level and whether tickets are available."""
        lv = self.current
        if lv is None:
            return SweepState(finished=True)
        p = lv.plan
        return SweepState(p.index, p.concurrency, p.repeat, lv.phase, self.is_open, False)

    def levels_meta(self) -> list[LevelMeta]:
        return [lv.meta() for lv in self.levels]


@dataclass(frozen=True, slots=True)
class SweepState:
    """The sweep as the users see it: the current level and whether tickets are available now."""

    level: int | None = None
    concurrency: int | None = None
    repeat: int | None = None
    phase: Phase | None = None
    open: bool = False
    finished: bool = False
