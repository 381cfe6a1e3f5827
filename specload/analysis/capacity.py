"""The highest load that meets an SLO, read from any run's levels: the bracket and its sentences. Pure.

The answer is read the same way from any run judged against an SLO (a capacity search or a plain
sweep with ``--slo``): ``capacity_of`` gives the bracket (met at x=lo, failed at x=hi) and whether
the verdict at either end is inside the noise (specload.core.slo). docs/metrics.md, "Capacity", has the
definitions; this module only applies them. The search that picks a capacity run's levels is
specload.sweep.capacity.

x is a number: a concurrency (an integer) or a request rate (req/s, a float; ``--rates``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from specload.core.slo import LevelSlo, TargetResult, fmt_duration, requests_to_settle

KIND_CONCURRENCY = "concurrency"
KIND_RATE = "rate"
KINDS = (KIND_CONCURRENCY, KIND_RATE)
CAPACITY_JSON = "capacity.json"


def fmt_x(kind: str, x: float | None) -> str:
    """C=24 or 2.5 req/s."""
    if x is None:
        return "-"
    if kind == KIND_RATE:
        return f"{x:.3g} req/s"
    return f"C={x:.0f}"


# ---------------------------------------------------------------- the search


@dataclass(frozen=True)
class SearchSpace:
    """Where and how finely to search. ``tolerance``: the search stops when hi − lo <= max(step,
    tolerance × lo), step being 1 for concurrencies (integers) and 0 for rates."""

    kind: str = KIND_CONCURRENCY
    start: float = 8
    minimum: float = 1
    maximum: float = 512
    tolerance: float = 0.0
    max_probes: int = 16

    @property
    def integer(self) -> bool:
        return self.kind == KIND_CONCURRENCY

    def check(self) -> SearchSpace:
        """The space, or ValueError naming what is wrong."""
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {self.kind!r}")
        nums = (self.start, self.minimum, self.maximum, self.tolerance)
        if any(not math.isfinite(v) for v in nums):
            raise ValueError("start, minimum, maximum and tolerance must be finite numbers")
        if self.integer and any(v != int(v) for v in (self.start, self.minimum, self.maximum)):
            raise ValueError("a concurrency search takes whole numbers for start, minimum and maximum")
        if not 0 < self.minimum <= self.start <= self.maximum:
            raise ValueError(
                f"expected 0 < minimum <= start <= maximum, got {self.minimum:g}, {self.start:g}, "
                f"{self.maximum:g}"
            )
        if self.tolerance < 0 or (not self.integer and self.tolerance <= 0):
            raise ValueError("tolerance: expected a fraction >= 0 (> 0 for rates), e.g. 0.05")
        if self.max_probes < 2:
            raise ValueError(f"max probes: expected at least 2, got {self.max_probes}")
        return self

    def to_option(self) -> str:
        """The form ``specload capacity`` hands to the Locust run (--capacity-search)."""
        return f"{self.kind}:{self.start:g}:{self.minimum:g}:{self.maximum:g}:{self.tolerance:g}:{self.max_probes}"

    @classmethod
    def from_option(cls, text: str) -> SearchSpace:
        parts = text.split(":")
        if len(parts) != 6:
            raise ValueError(f"--capacity-search: expected KIND:START:MIN:MAX:TOLERANCE:PROBES, got {text!r}")
        try:
            kind, start, lo, hi, tol, probes = parts[0], *map(float, parts[1:5]), int(parts[5])
        except ValueError:
            raise ValueError(
                f"--capacity-search: expected KIND:START:MIN:MAX:TOLERANCE:PROBES, got {text!r}"
            ) from None
        return cls(kind, start, lo, hi, tol, probes).check()


# ---------------------------------------------------------------- the answer, from any run's levels


@dataclass(frozen=True)
class Capacity:
    """What a run's levels say about the highest x that meets the SLO.

    ``lo``: the highest x that met it below every x that failed; ``hi``: the lowest x that failed.
    An x measured several times (repeats) met it only if every repeat did. ``above``: x that met it
    above ``hi`` (the levels disagree with each other: noise at the boundary).
    """

    kind: str
    lo: float | None
    hi: float | None
    lo_slo: LevelSlo | None = None
    hi_slo: LevelSlo | None = None
    above: tuple[float, ...] = ()
    measured: int = 0  # x values with a verdict

    @property
    def inside_noise(self) -> bool:
        """The boundary is not settled: a verdict at lo or hi is inside the noise, or levels above
        hi met the SLO."""
        return bool(self.above) or any(s is not None and s.inside_noise for s in (self.lo_slo, self.hi_slo))

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "lo": self.lo,
            "hi": self.hi,
            "inside_noise": self.inside_noise,
            "above": list(self.above),
            "measured": self.measured,
            "sentence": describe(self),
        }


def capacity_of(
    points: Sequence[tuple[float, LevelSlo | None]], kind: str = KIND_CONCURRENCY
) -> Capacity | None:
    """The bracket from (x, the level's SLO verdict) pairs; None when no level has a verdict."""
    by_x: dict[float, list[LevelSlo]] = {}
    for x, s in points:
        if s is not None and s.met is not None:
            by_x.setdefault(float(x), []).append(s)
    if not by_x:
        return None
    met = {x: all(s.met for s in ss) for x, ss in by_x.items()}
    failed = sorted(x for x, ok in met.items() if not ok)
    hi = failed[0] if failed else None
    below = [x for x, ok in met.items() if ok and (hi is None or x < hi)]
    lo = max(below) if below else None
    above = tuple(sorted(x for x, ok in met.items() if ok and hi is not None and x > hi))

    def pick(x: float | None, want: bool) -> LevelSlo | None:
        if x is None:
            return None
        return next((s for s in by_x[x] if s.met is want), by_x[x][0])

    return Capacity(kind, lo, hi, pick(lo, True), pick(hi, False), above, len(by_x))


def _value(r: TargetResult) -> str:
    """The statistic as text, with as many digits as it takes to differ from the threshold's."""
    if r.value_s is not None and math.isinf(r.value_s):
        return "unbounded (failed requests)"
    v, t = r.value_s or 0.0, r.target.threshold_s
    for digits in (3, 4, 5):
        text = fmt_duration(v, digits)
        if v == t or text != fmt_duration(t, digits):
            return text
    return text


def _noise_one(r: TargetResult, at: str) -> str:
    """One target whose verdict is inside the noise, with what would settle it."""
    t = r.target
    text = f"at {at} {t.label} was {_value(r)} against {t.threshold_text} with {r.over} of {r.n} requests over it"
    if t.q is None:
        return text + f", a mean a server whose {t.label} is exactly {t.threshold_text} also gives"
    text += f", a count a server whose {t.label} is exactly {t.threshold_text} also gives"
    if r.met and r.over == 0:
        text += f" (it takes {requests_to_settle(t.q)} requests with none over to tell)"
    return text


def noise_text(c: Capacity) -> str | None:
    """Why the boundary is inside the noise, in words; None when it is not."""
    parts: list[str] = []
    if c.lo_slo is not None and c.lo_slo.inside_noise:
        parts += [_noise_one(r, fmt_x(c.kind, c.lo)) for r in c.lo_slo.targets if r.inside_noise]
    if c.hi_slo is not None and c.hi_slo.inside_noise:
        parts += [_noise_one(r, fmt_x(c.kind, c.hi)) for r in c.hi_slo.failed_targets]
    if c.above:
        parts.append(
            f"{', '.join(fmt_x(c.kind, x) for x in c.above)} met the SLO although {fmt_x(c.kind, c.hi)} did not"
        )
    return "; ".join(parts) if parts else None


def describe(c: Capacity) -> str:
    """One sentence: the bracket and whether it is inside the noise."""
    lo, hi = fmt_x(c.kind, c.lo), fmt_x(c.kind, c.hi)
    if c.lo is None and c.hi is None:
        return "no level has an SLO verdict"
    if c.lo is None:
        text = f"does not meet the SLO at any level measured (it fails from {hi} on)"
    elif c.hi is None:
        text = f"meets the SLO at every level measured, up to {lo} (none failed: the capacity may be higher)"
    else:
        text = f"meets the SLO up to {lo} (met at {lo}, failed at {hi})"
    noise = noise_text(c)
    return f"{text}; inside the noise: {noise}" if noise else f"{text}; outside the noise"


@dataclass(frozen=True)
class ServerLimits:
    """What the server said about itself that can explain a limit (run.json ``server``, sampled gauges)."""

    max_running: int | None = None
    configured_max_running: int | None = None
    speculative_algorithm: str | None = None
    kv_tokens: int | None = None  # max_total_num_tokens
    queued_max: float | None = None  # Srv queue max at the failing level
    running_max: float | None = None


_QUEUE_METRICS = ("ttft", "e2e")  # what waiting in the server's queue makes slower
_DECODE_METRICS = ("tpot", "itl")  # what a larger batch makes slower


def limit_reason(c: Capacity, limits: ServerLimits) -> str | None:
    """Why the SLO failed at ``hi``: the failing targets with their values, and what the server's
    own configuration says about it (its running-request cap, a queue, decoding slowing down)."""
    if c.hi is None or c.hi_slo is None:
        return None
    failed = c.hi_slo.failed_targets
    if not failed:
        return None
    vals = ", ".join(f"{r.target.label} {_value(r)} > {r.target.threshold_text}" for r in failed)
    text = f"fails at {fmt_x(c.kind, c.hi)} on {vals}"
    why: list[str] = []
    queue_hit = any(r.target.metric in _QUEUE_METRICS for r in failed)
    cap = limits.max_running
    queued = limits.queued_max or 0
    if queue_hit and cap is not None and c.kind == KIND_CONCURRENCY and c.hi > cap:
        reset = ""
        if limits.configured_max_running not in (None, cap) and limits.speculative_algorithm:
            reset = (
                f", reset from {limits.configured_max_running} for {limits.speculative_algorithm} speculation"
            )
        elif limits.speculative_algorithm:
            reset = f", with {limits.speculative_algorithm} speculation"
        why.append(
            f"{fmt_x(c.kind, c.hi)} is above the server's max_running_requests ({cap}{reset}), so the "
            f"excess requests wait in its queue" + (f" (up to {queued:.0f} waiting)" if queued else "")
        )
    elif queue_hit and queued > 0:
        full = cap is not None and limits.running_max is not None and limits.running_max >= cap
        if full:
            why.append(
                f"the server ran its max_running_requests ({cap}) at once and queued the rest (up to "
                f"{queued:.0f} waiting)"
            )
        elif cap is not None and limits.running_max is not None:
            kv = f" (KV cache of {limits.kv_tokens} tokens)" if limits.kv_tokens else ""
            why.append(
                f"the server queued requests below its max_running_requests ({cap}) (up to {queued:.0f} "
                f"waiting, at most {limits.running_max:.0f} running): its memory{kv} held fewer"
            )
        else:
            why.append(f"the server queued requests (up to {queued:.0f} waiting)")
    for r in failed:
        if r.target.metric not in _DECODE_METRICS:
            continue
        before = next((t for t in c.lo_slo.targets if t.target == r.target), None) if c.lo_slo else None
        grew = f" ({r.target.label} {_value(before)} at {fmt_x(c.kind, c.lo)})" if before is not None else ""
        why.append(f"decoding slows as the batch grows{grew}")
        break
    return text + (": " + "; ".join(why) if why else "")


def capacity_change(base: Capacity, treat: Capacity) -> float | None:
    """(treatment lo − baseline lo) / baseline lo × 100; None unless both have a lo."""
    if base.lo is None or treat.lo is None or base.lo <= 0:
        return None
    return (treat.lo - base.lo) / base.lo * 100.0


def _bracket(label: str, c: Capacity) -> str:
    if c.lo is not None and c.hi is not None:
        return f"{label} met it at {fmt_x(c.kind, c.lo)} and failed at {fmt_x(c.kind, c.hi)}"
    if c.lo is not None:
        return f"{label} met it at every level up to {fmt_x(c.kind, c.lo)}, so its capacity may be higher"
    return f"{label} failed from {fmt_x(c.kind, c.hi)}"


def noise_short(label: str, c: Capacity) -> str | None:
    """Which end of a run's bracket is inside the noise, and on which targets; None when neither."""
    parts = []
    if c.lo_slo is not None and c.lo_slo.inside_noise:
        names = ", ".join(r.target.label for r in c.lo_slo.targets if r.inside_noise)
        parts.append(f"{label}'s pass at {fmt_x(c.kind, c.lo)} ({names})")
    if c.hi_slo is not None and c.hi_slo.inside_noise:
        names = ", ".join(r.target.label for r in c.hi_slo.failed_targets)
        parts.append(f"{label}'s failure at {fmt_x(c.kind, c.hi)} ({names})")
    if c.above:
        parts.append(f"{label}'s levels above {fmt_x(c.kind, c.hi)} that met it")
    return ", ".join(parts) or None


# A capacity change in percent is stated only when both brackets are this narrow (hi <= lo x (1 + it)):
# between a sweep's coarse levels (met at C=4, failed at C=16) the change of the lower ends (+300%)
# says more than the levels know; a capacity search (specload capacity) narrows the brackets.
NARROW_BRACKET = 0.25


def narrow(c: Capacity) -> bool:
    """The capacity is known to within NARROW_BRACKET: it met the SLO at lo and failed just above."""
    return c.lo is not None and c.hi is not None and c.lo > 0 and c.hi <= c.lo * (1 + NARROW_BRACKET)


def compare_sentence(
    base_label: str,
    base: Capacity,
    treat_label: str,
    treat: Capacity,
    reasons: Mapping[str, str | None] | None = None,
    unlike: str | None = None,
) -> str:
    """'With mtp the deployment meets the SLO up to C=31 instead of C=24 (+29%)', then each run's
    bracket, why each fails where it does and which verdicts are inside the noise.

    The percentage only when both brackets are narrow (see NARROW_BRACKET); none at all when the runs
    are not like for like (``unlike``: why), when each run's capacity is said on its own."""
    if unlike is not None:
        text = (
            f"{treat_label} {describe_short(treat)}; {base_label} {describe_short(base)}; no capacity change "
            f"is claimed, the runs are not like for like ({unlike})"
        )
    elif treat.lo is not None and base.lo is not None:
        pct = capacity_change(base, treat) if narrow(base) and narrow(treat) else None
        change = (
            f" ({pct:+.0f}%)"
            if pct is not None
            else " (no percentage: the levels bracket the capacities only coarsely; "
            "`specload capacity` narrows them)"
        )
        if treat.lo == base.lo:
            text = f"With {treat_label} the deployment meets the SLO up to the same {fmt_x(treat.kind, treat.lo)}"
        else:
            text = (
                f"With {treat_label} the deployment meets the SLO up to {fmt_x(treat.kind, treat.lo)} "
                f"instead of {fmt_x(base.kind, base.lo)}{change}"
            )
    else:
        text = (
            f"With {treat_label} the deployment {describe_short(treat)}; {base_label} {describe_short(base)}"
        )
    text += f": {_bracket(treat_label, treat)}, {_bracket(base_label, base)}."
    for label in (base_label, treat_label):
        why = (reasons or {}).get(label)
        if why:
            text += f" {label} {why}."
    noisy = [n for n in (noise_short(base_label, base), noise_short(treat_label, treat)) if n]
    if noisy:
        text += f" Inside the noise: {'; '.join(noisy)}; more requests per level would settle it."
    return text


def describe_short(c: Capacity) -> str:
    if c.lo is None:
        return f"meets the SLO at no level measured (fails from {fmt_x(c.kind, c.hi)})"
    if c.hi is None:
        return f"meets the SLO at every level measured (up to {fmt_x(c.kind, c.lo)})"
    return f"meets the SLO up to {fmt_x(c.kind, c.lo)}"


def verdict_text(r: LevelSlo) -> str:
    """``met the SLO (good 98%; TTFT p90 1.2 s <= 2 s, ...)`` for a progress line."""
    if r.met is None:
        return "has no SLO verdict (no measured request)"
    parts = []
    for t in r.targets:
        v = _value(t)
        parts.append(
            f"{t.target.label} {v} {'<=' if t.met else '>'} {t.target.threshold_text}"
            + (" ~" if t.inside_noise else "")
        )
    share = f"good {r.good_share * 100:.0f}%" if r.good_share is not None else "good -"
    head = "met the SLO" if r.met else "missed the SLO"
    noise = " (inside the noise)" if r.inside_noise else ""
    return f"{head}{noise} ({share}; {', '.join(parts)})"


# ---------------------------------------------------------------- capacity.json read back


@dataclass(frozen=True)
class CapacityRecord:
    """capacity.json as written by a capacity run (the search's parameters, status and trace)."""

    slo: str | None = None
    space: SearchSpace | None = None
    status: str | None = None
    probes: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: Any) -> CapacityRecord | None:
        """The record; None when ``d`` is not one. Older files (a space without its tolerance and
        probes, or its kind: a concurrency search) read with the defaults."""
        try:
            return msgspec.convert(d, cls, strict=False)
        except msgspec.ValidationError:
            return None
