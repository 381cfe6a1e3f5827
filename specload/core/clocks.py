"""How far a worker's wall clock is from the master's, measured NTP's way.

Records carry wall-clock times taken on the machine that sent the request, and a level's window
(first send to last end) mixes machines: a worker whose clock is 250 ms ahead stretches or shifts
every window it takes part in. The master pings each worker a few times; for one ping sent at
``sent`` and answered at ``received`` (master's clock) with the worker's clock reading ``remote``,
the offset is ``remote - (sent + received) / 2``, wrong by at most half the round trip. The ping
with the shortest round trip is the one kept.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from specload.core.rundir import ClientClock

# Above this (after the round trip's own uncertainty), a worker's clock is reported as off.
SKEW_WARN_S = 0.005


@dataclass(frozen=True, slots=True)
class ClockSample:
    sent: float  # master's clock when the ping left
    remote: float  # the worker's clock when it answered
    received: float  # master's clock when the answer came back

    @property
    def rtt(self) -> float:
        return self.received - self.sent

    @property
    def offset(self) -> float:
        return self.remote - (self.sent + self.received) / 2


def estimate(worker: str, samples: Iterable[ClockSample], measured_at: float) -> ClientClock | None:
    """The offset from the tightest ping; None without a usable answer."""
    usable = [s for s in samples if s.rtt >= 0]
    if not usable:
        return None
    best = min(usable, key=lambda s: s.rtt)
    return ClientClock(
        worker=worker,
        offset_ms=round(best.offset * 1e3, 3),
        rtt_ms=round(best.rtt * 1e3, 3),
        samples=len(usable),
        measured_at=measured_at,
    )


def is_off(clock: ClientClock, limit_s: float = SKEW_WARN_S) -> bool:
    """True when the clock is off by more than ``limit_s`` even at the best end of its uncertainty."""
    return abs(clock.offset_ms) - clock.rtt_ms / 2 > limit_s * 1e3


def describe(clock: ClientClock) -> str:
    way = "ahead of" if clock.offset_ms > 0 else "behind"
    return (
        f"worker {clock.worker}'s clock is {abs(clock.offset_ms):.1f} ms {way} the master's "
        f"(±{clock.rtt_ms / 2:.1f} ms)"
    )
