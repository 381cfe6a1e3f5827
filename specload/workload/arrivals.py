"""Open-loop arrival schedules: when each request of a rate level is due.

A rate level sends requests at given times whatever the server does, like production traffic,
instead of a fixed number of users each waiting for its last answer (a closed loop). The times are
drawn here, seeded per (seed, level, phase), so that a rerun sends the same schedule and any number
of processes agree: only the sweep's owner draws them.

The processes follow vLLM's ``bench serve`` definitions: Poisson arrivals have exponential gaps of
mean 1/rate; ``constant`` has gaps of exactly 1/rate; ``gamma`` has gamma-distributed gaps of
shape ``burstiness`` and mean 1/rate (burstiness 1 is Poisson; below 1 burstier, above 1 more even).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

POISSON, CONSTANT, GAMMA = "poisson", "constant", "gamma"
ARRIVALS = (POISSON, CONSTANT, GAMMA)


def gap(rng: random.Random, rate: float, arrival: str, burstiness: float = 1.0) -> float:
    """One inter-arrival gap in seconds."""
    if arrival == CONSTANT:
        return 1.0 / rate
    if arrival == POISSON or (arrival == GAMMA and burstiness == 1.0):
        return rng.expovariate(rate)
    if arrival == GAMMA:
        return rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    raise ValueError(f"unknown arrival process {arrival!r} (expected one of {', '.join(ARRIVALS)})")


def schedule_seed(seed: int, level: int, phase: str) -> int:
    """A stable integer seed per (scenario seed, level, phase); ``hash()`` of a str is salted per process."""
    return (seed * 1_000_003 + level) * 4 + (1 if phase == "warmup" else 2)


@dataclass
class Schedule:
    """Arrival times of one phase of one rate level, relative to its start (the first is at 0).

    Offsets rather than epochs: the phase's start is only known when it opens, and an offset is the
    same on every clock. The first request is due at once, as in vLLM and GuideLLM.
    """

    rate: float
    arrival: str = POISSON
    burstiness: float = 1.0
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False)
    _due: list[float] = field(default_factory=lambda: [0.0], init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"a rate must be positive, got {self.rate!r}")
        self._rng = random.Random(self.seed)

    def offset(self, seq: int) -> float:
        """Request ``seq``'s due time in seconds after the phase's start (a ticket handed back and
        granted again keeps its time: the schedule is a function of the sequence number)."""
        due = self._due
        while len(due) <= seq:
            due.append(due[-1] + gap(self._rng, self.rate, self.arrival, self.burstiness))
        return due[seq]


def offsets(
    rate: float, n: int, arrival: str = POISSON, burstiness: float = 1.0, seed: int = 0
) -> list[float]:
    """The first ``n`` due times of a schedule (for tests and the simulator's checks)."""
    s = Schedule(rate, arrival, burstiness, seed)
    return [s.offset(i) for i in range(n)]


@dataclass(frozen=True)
class FixedSchedule:
    """Due times given in advance (a replayed trace's, ``specload.workload.replay``), relative to the
    phase's start; the same ``offset`` as a drawn ``Schedule``."""

    offsets: tuple[float, ...]

    def offset(self, seq: int) -> float:
        return self.offsets[min(seq, len(self.offsets) - 1)]
