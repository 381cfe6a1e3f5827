"""Fault injection switches for the simulator.

The switches exist so the load generator's failure accounting (FAILED / SHORT, missing terminator,
malformed stream, dead server) can be tested end to end against a server that misbehaves on purpose
and predictably. Deciding *which* request misbehaves lives here; *how* (the bytes on the wire) is
the HTTP layer's job.

Selection rule, the same for every fault: a fault that is switched on hits generation request ``n``
(1-based, counted over valid generation requests in arrival order) when ``n % every == 0`` if its
``*_every`` is set, else with probability ``*_rate`` (one seeded RNG, so a run is reproducible for a
given arrival order) if that is set, else on every request; requests before ``first`` get none (a
client's probe request before its load, say).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

HTTP_ERROR_STATUSES = (400, 429, 500, 503)
#: The faults picked by the selection rule: each has ``<name>_every`` and ``<name>_rate`` fields.
FAULT_NAMES = ("http_error", "cut", "stall", "malformed", "omit_done", "short")


@dataclass
class Faults:
    """All fault switches; every one is off by default."""

    http_error_status: int = 0  # answer with this status and an OpenAI-style error body; 0 = off
    http_error_every: int = 0
    http_error_rate: float = 0.0
    cut_after_tokens: int | None = None  # close the connection mid-stream after this many tokens
    cut_every: int = 0
    cut_rate: float = 0.0
    stall_after_tokens: int | None = None  # stop sending for stall_s after this many tokens
    stall_s: float = 0.0
    stall_every: int = 0
    stall_rate: float = 0.0
    malformed_every: int = 0  # emit "data: {not json" mid-stream; on when every or rate is set
    malformed_rate: float = 0.0
    omit_done: bool = False  # end the stream without "data: [DONE]"
    omit_done_every: int = 0
    omit_done_rate: float = 0.0
    short_by: int = 0  # finish with this many fewer tokens than asked (honestly counted)
    short_every: int = 0
    short_rate: float = 0.0
    die_after_requests: int = 0  # os._exit the server once this many requests were admitted; 0 = off
    first: int = 1  # faults hit generation requests from this one on (1: all of them)
    seed: int = 0

    def validate(self) -> None:
        """Reject settings that would silently do nothing or something else than asked."""
        if self.http_error_status and self.http_error_status not in HTTP_ERROR_STATUSES:
            raise ValueError(f"http_error_status must be one of {HTTP_ERROR_STATUSES}")
        for name in FAULT_NAMES:
            every = getattr(self, f"{name}_every")
            rate = getattr(self, f"{name}_rate")
            if every < 0:
                raise ValueError(f"{name}_every must be >= 0")
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name}_rate must be within [0, 1]")
        for name in ("cut_after_tokens", "stall_after_tokens"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.first < 1:
            raise ValueError("first must be >= 1")
        if self.stall_s < 0 or self.short_by < 0 or self.die_after_requests < 0:
            raise ValueError("stall_s, short_by and die_after_requests must be >= 0")


@dataclass(frozen=True, slots=True)
class RequestFaults:
    """The faults one request was picked for (``None`` / ``False`` / 0 = not picked)."""

    http_error: int | None = None
    cut_after: int | None = None
    stall_after: int | None = None
    stall_s: float = 0.0
    malformed: bool = False
    omit_done: bool = False
    short_by: int = 0


NO_FAULTS = RequestFaults()


class FaultInjector:
    """Applies the selection rule request by request; one per server process."""

    def __init__(self, faults: Faults) -> None:
        faults.validate()
        self.faults = faults
        self.requests = 0  # generation requests seen
        self.admitted = 0  # generation requests admitted by the engine
        self._rng = random.Random(faults.seed)

    def _hits(self, every: int, rate: float) -> bool:
        if every > 0:
            return self.requests % every == 0
        if rate > 0:
            return self._rng.random() < rate
        return True

    def next_request(self) -> RequestFaults:
        """Count one generation request and decide which faults it gets."""
        self.requests += 1
        f = self.faults
        if self.requests < f.first:
            return NO_FAULTS
        if f.http_error_status and self._hits(f.http_error_every, f.http_error_rate):
            return RequestFaults(http_error=f.http_error_status)
        cut = stall = None
        stall_s = 0.0
        malformed = omit_done = False
        short_by = 0
        if f.cut_after_tokens is not None and self._hits(f.cut_every, f.cut_rate):
            cut = f.cut_after_tokens
        if f.stall_after_tokens is not None and self._hits(f.stall_every, f.stall_rate):
            stall, stall_s = f.stall_after_tokens, f.stall_s
        if (f.malformed_every or f.malformed_rate) and self._hits(f.malformed_every, f.malformed_rate):
            malformed = True
        if f.omit_done and self._hits(f.omit_done_every, f.omit_done_rate):
            omit_done = True
        if f.short_by and self._hits(f.short_every, f.short_rate):
            short_by = f.short_by
        if cut is None and stall is None and not (malformed or omit_done or short_by):
            return NO_FAULTS
        return RequestFaults(None, cut, stall, stall_s, malformed, omit_done, short_by)

    def on_admit(self) -> bool:
        """Count one admission; True when the server must die now (``die_after_requests`` reached)."""
        self.admitted += 1
        n = self.faults.die_after_requests
        return bool(n) and self.admitted >= n
