"""The capacity search as a sweep runs it: the state machine that picks each next level. Pure.

``CapacitySearch``: observed x, met or not -> the next x, or done. Bracketing from a start (doubling
while the SLO is met, halving while it is not), then bisection between the highest x that met it
and the lowest that did not, until they are one step apart (integers: 1; rates: a relative
tolerance). ``CapacityRun`` wraps it for the sweep's owner: which level to add next, the progress
lines and ``capacity.json``. The answer read back from any run is specload.analysis.capacity.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from specload.analysis.capacity import (
    KIND_CONCURRENCY,
    KIND_RATE,
    Capacity,
    SearchSpace,
    capacity_of,
    describe,
    fmt_x,
    verdict_text,
)
from specload.core.slo import LevelSlo, Slo, SloTally
from specload.sweep.levels import LevelPlan
from specload.workload.config import Scenario

# How a search ended (CapacitySearch.status).
SEARCHING = "searching"
BRACKETED = "bracketed"  # met at lo, failed at hi, and they are one step apart
MEETS_AT_MAX = "meets at the maximum"  # every x up to the maximum met: the capacity is higher
FAILS_AT_MIN = "fails at the minimum"  # even the minimum failed
PROBE_LIMIT = "probe limit"  # out of probes before the bracket was narrow enough
STOPPED = "stopped"  # the sweep ended before the search did (interrupted, aborted)


@dataclass(frozen=True)
class Probe:
    """One observation: the level at ``x`` met the SLO or not."""

    x: float
    met: bool
    inside_noise: bool = False  # the level's verdict is inside the noise (LevelSlo.inside_noise)
    level: int | None = None  # its index in the run
    note: str | None = None  # e.g. the client was the bottleneck


@dataclass
class CapacitySearch:
    """Bracketing then bisection over x; ``observe`` a probe, get the next x (None: done).

    The state is always consistent: every x probed after the first lies strictly between the
    highest x that met the SLO (``lo``) and the lowest that did not (``hi``), so the answer is
    always a bracket, never a contradiction, whatever the noise does at the boundary.
    """

    space: SearchSpace
    probes: list[Probe] = field(default_factory=list)
    lo: float | None = None  # highest x that met the SLO
    hi: float | None = None  # lowest x that did not
    status: str = SEARCHING
    next_x: float | None = None

    def __post_init__(self) -> None:
        self.space.check()
        self.next_x = self.space.start

    @property
    def done(self) -> bool:
        return self.status != SEARCHING

    @property
    def phase(self) -> str:
        """What the next probe is for (the progress line says it)."""
        if self.lo is None or self.hi is None:
            return "bracketing: " + ("doubling" if self.hi is None else "halving")
        return f"bisecting {fmt_x(self.space.kind, self.lo)}..{fmt_x(self.space.kind, self.hi)}"

    def observe(self, probe: Probe) -> float | None:
        """Record a probe of the x asked for; returns the next x, or None when the search is over."""
        if self.done:
            raise ValueError(f"the search is over ({self.status}); nothing more to observe")
        if self.next_x is None or probe.x != self.next_x:
            raise ValueError(f"expected a probe at x={self.next_x}, got x={probe.x}")
        self.probes.append(probe)
        if probe.met:
            self.lo = probe.x if self.lo is None else max(self.lo, probe.x)
        else:
            self.hi = probe.x if self.hi is None else min(self.hi, probe.x)
        self.next_x = self._decide()
        return self.next_x

    def stop(self) -> None:
        """The sweep ended first (interrupted, aborted): the bracket so far is the answer."""
        if not self.done:
            self.status, self.next_x = STOPPED, None

    def _step(self) -> float:
        return 1.0 if self.space.integer else 0.0

    def _narrow(self, lo: float, hi: float) -> bool:
        return hi - lo <= max(self._step(), self.space.tolerance * lo)

    def _decide(self) -> float | None:
        sp = self.space
        lo, hi = self.lo, self.hi
        nxt: float | None
        if lo is not None and hi is not None and self._narrow(lo, hi):
            self.status = BRACKETED
            return None
        if hi is None:
            assert lo is not None
            if lo >= sp.maximum:
                self.status = MEETS_AT_MAX
                return None
            nxt = min(sp.maximum, lo * 2)
        elif lo is None:
            if hi <= sp.minimum:
                self.status = FAILS_AT_MIN
                return None
            nxt = max(sp.minimum, math.floor(hi / 2) if sp.integer else hi / 2)
        else:
            nxt = (lo + hi) // 2 if sp.integer else (lo + hi) / 2
        if len(self.probes) >= sp.max_probes:
            self.status = PROBE_LIMIT
            return None
        return float(nxt)


RATE_TOLERANCE = 0.05  # a rate search's default: stop when the bracket is within 5 % of its lower end


def search_space(
    sc: Scenario,
    start: float | None = None,
    minimum: float = 1,
    maximum: float = 512,
    tolerance: float | None = None,
    max_probes: int = 16,
) -> SearchSpace:
    """The space ``specload capacity`` searches: concurrency, or request rates when the scenario has
    rate levels (``--rates R``: the search starts at R unless ``start`` says otherwise). ValueError
    when it does not hold together."""
    if len(sc.rates) > 1 and start is None:
        raise ValueError(f"--rates: give one rate to start the search from (or --start), got {sc.rates}")
    if sc.rates:
        first = sc.rates[0] if start is None else start
        return SearchSpace(
            KIND_RATE,
            float(first),
            float(minimum),
            float(maximum),
            RATE_TOLERANCE if tolerance is None else tolerance,
            max_probes,
        ).check()
    return SearchSpace(
        KIND_CONCURRENCY,
        8 if start is None else start,
        minimum,
        maximum,
        0.0 if tolerance is None else tolerance,
        max_probes,
    ).check()


def probe_plan(sc: Scenario, space: SearchSpace, x: float, index: int) -> LevelPlan:
    """The level that probes ``x``: a short level with the scenario's own budget rule and warmup,
    a concurrency level (C users, closed loop) or a rate level (x requests/s, open loop, with the
    scenario's arrival process and user pool)."""
    rate = space.kind == KIND_RATE
    plan = LevelPlan(
        index=index,
        concurrency=sc.pool() if rate else int(x),
        repeat=0,
        budget=sc.rate_budget(x) if rate else sc.budget(int(x)),
        warmup=sc.warmup_requests,
        duration_s=sc.duration_s,
        warmup_tokens=sc.warmup_tokens,
        output_tokens=sc.output_tokens,
    )
    return replace(plan, rate=x, arrival=sc.arrival, burstiness=sc.burstiness, seed=sc.seed) if rate else plan


# ---------------------------------------------------------------- inside a sweep


@dataclass
class CapacityRun:
    """The search as the sweep's owner runs it: it names each next level, and keeps the trace.

    The owner calls ``level_done`` with a level's SLO tally when the level has every record back;
    the answer is the search's bracket.
    """

    space: SearchSpace
    slo: Slo
    scenario: Scenario
    search: CapacitySearch = field(init=False)
    results: dict[int, LevelSlo] = field(default_factory=dict)  # by level index
    x_of: dict[int, float] = field(default_factory=dict)  # by level index

    def __post_init__(self) -> None:
        self.search = CapacitySearch(self.space)

    def first_plan(self) -> LevelPlan:
        assert self.search.next_x is not None
        self.x_of[0] = self.search.next_x
        return probe_plan(self.scenario, self.space, self.search.next_x, 0)

    def level_done(
        self, index: int, tally: SloTally, client_flag: str | None = None
    ) -> tuple[LevelPlan | None, str]:
        """The level ``index`` has all its records: judge it; (the next level, or None when done; a progress line)."""
        result = tally.result()
        self.results[index] = result
        x = self.x_of.get(index, self.search.next_x or 0.0)
        met = bool(result.met)
        probe = Probe(x, met, result.inside_noise, index, client_flag)
        nxt = self.search.observe(probe)
        line = f"capacity: {fmt_x(self.space.kind, x)} {verdict_text(result)}"
        if client_flag:
            line += f"; NOTE {client_flag}"
        if nxt is None:
            return None, line + f"; search {self.search.status}: {self.answer_text()}"
        self.x_of[index + 1] = nxt
        line += f"; next {fmt_x(self.space.kind, nxt)} ({self.search.phase})"
        return probe_plan(self.scenario, self.space, nxt, index + 1), line

    def capacity(self) -> Capacity | None:
        return capacity_of(
            [(self.x_of[i], r) for i, r in self.results.items() if i in self.x_of], self.space.kind
        )

    def answer_text(self) -> str:
        c = self.capacity()
        return describe(c) if c is not None else "no level finished"

    def to_json(self) -> dict[str, Any]:
        c = self.capacity()
        return {
            "slo": self.slo.text,
            "space": asdict(self.space),
            "status": self.search.status,
            "lo": self.search.lo,
            "hi": self.search.hi,
            "answer": c.to_json() if c is not None else None,
            "probes": [
                {
                    **asdict(p),
                    "slo": self.results[p.level].to_json() if p.level in self.results else None,
                }
                for p in self.search.probes
            ],
        }
