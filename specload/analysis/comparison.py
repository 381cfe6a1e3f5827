"""Baseline vs treatments, computed: ``build_comparison(runs) -> Comparison``.

The first run is the baseline; every other run is compared with it at each concurrency level.
The figures per run are those of ``specload report`` (specload.analysis.metrics), repeats of a level
combined by ``metrics.repeats_at``. Everything here is pure (no I/O, no formatting choices beyond
the verdict's words), so the arithmetic can be tested on its own and every consumer (the
``specload compare`` text, its JSON, the plot) shows the same finished numbers instead of
recomputing them. docs/metrics.md defines the change, the interval, the crossover, the
comparability rule and the verdict.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specload.analysis import figures
from specload.analysis.accept_compare import AcceptChange, AcceptFigures, accept_change, accept_figures
from specload.analysis.cap import RunningCap
from specload.analysis.clientcheck import client_flags
from specload.analysis.metrics import LevelStats, RepeatedLevelStats, combine_parts, mean, repeats_at
from specload.analysis.paired import PairedComparison, paired_of_runs
from specload.analysis.prompt_material import acceptance_caveat
from specload.analysis.run import Run
from specload.analysis.slo_compare import SloComparison, compare_slo
from specload.core.records import SRC_CHUNKS
from specload.core.rundir import RUN_COMPLETED, RunMeta
from specload.core.tdist import t_quantile_975
from specload.core.text import MISSING, fmt_pct
from specload.workload.config import FORCED
from specload.workload.recorded import recorded_scenario

NOISE_MARK = "~"
NOT_LIKE = "the comparison is not like for like"  # the end of a note: no capacity change is claimed
NOT_COMPARABLE = "n/c"  # the Δ cell of a level where the runs are not comparable
# A change smaller than this (in percent) is no direction: it neither makes nor breaks a crossover.
NEGLIGIBLE_PCT = 1.0
# Above this share of a level's measured requests (failed or short, or counted from stream chunks)
# in either run, the level's changes are not comparable; at or below it they are noted only.
NOT_COMPARABLE_SHARE = 0.05


# ---------------------------------------------------------------- change and its interval


def change_pct(base: float | None, new: float | None) -> float | None:
    """(new − base) / base × 100; None when either is missing or base is not positive."""
    if base is None or new is None or base <= 0:
        return None
    return (new - base) / base * 100.0


def _welch_df(qa: float, qb: float, na: int, nb: int) -> float:
    """Welch–Satterthwaite degrees of freedom of a sum of two variance terms (each s²/n)."""
    den = qa**2 / (na - 1) + qb**2 / (nb - 1)
    return (qa + qb) ** 2 / den if den > 0 else float(na + nb - 2)


@dataclass(frozen=True)
class ChangeInterval:
    """A change of the means with its 95% interval (printed) and its noise test (the ~ mark)."""

    pct: float  # (mean(new) / mean(base) − 1) × 100
    half_width: float  # delta-method 95% half-width of the ratio, percent (printed as ±)
    test_half_width: float  # Welch test at floor(df), relative to mean(base): |pct| <= it is ~
    df: float  # degrees of freedom of the printed interval


def ci_change(base: Sequence[float], new: Sequence[float]) -> ChangeInterval | None:
    """The change of mean(new) vs mean(base) from repeat values, with its interval; None if n < 2.

    Printed interval (delta method for R = mean_n / mean_b, so the baseline's own noise counts
    in the denominator too): half-width = t_{0.975, df} × sqrt(s²_n/n_n + R² s²_b/n_b) / mean_b × 100,
    df = Welch–Satterthwaite of the two terms. Noise test (the ~ mark): Welch's t test of
    mean_n − mean_b, i.e. the same variance at R = 1 (no change), with t at floor(df) — flooring
    keeps the test at or under its 5% false alarms when df is estimated from a few repeats.
    """
    if len(base) < 2 or len(new) < 2:
        return None
    mb, mn = mean(base), mean(new)
    pct = change_pct(mb, mn)
    if pct is None or mb is None or mn is None:
        return None
    qb, qn = statistics.variance(base) / len(base), statistics.variance(new) / len(new)
    r = mn / mb
    rb = r * r * qb
    df = _welch_df(rb, qn, len(base), len(new)) if rb + qn > 0 else float(len(base) + len(new) - 2)
    half = t_quantile_975(df) * math.sqrt(rb + qn) / mb * 100.0
    if qb + qn <= 0:
        return ChangeInterval(pct, half, 0.0, df)
    test_df = math.floor(_welch_df(qb, qn, len(base), len(new)) + 1e-6)  # float noise: 3.9999999 is 4
    return ChangeInterval(pct, half, t_quantile_975(test_df) * math.sqrt(qb + qn) / mb * 100.0, df)


def repeats_to_settle(base: Sequence[float], new: Sequence[float]) -> int | None:
    """How many repeats per arm the measured spread would need to settle the sign of the change
    (docs/metrics.md, "Repeats to settle the sign"): the smallest n above the repeats run with
    t_{0.975, 2n−2} × s × sqrt(2/n) < |mean(new) − mean(base)|, s² the two arms' sample variances
    averaged. None where there is no spread to go on (fewer than 2 repeats a side, or none at all)
    or no difference to settle."""
    if len(base) < 2 or len(new) < 2:
        return None
    d = abs(statistics.fmean(new) - statistics.fmean(base))
    s = math.sqrt((statistics.variance(base) + statistics.variance(new)) / 2.0)
    if s <= 0 or d <= 0:
        return None

    def settles(n: int) -> bool:
        return t_quantile_975(2 * n - 2) * s * math.sqrt(2.0 / n) < d

    lo = max(len(base), len(new))  # does not settle it (or is not asked: the runs' own repeats)
    hi = lo + 1
    while not settles(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # settles(n) only grows with n: t and sqrt(2/n) both shrink
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if settles(mid) else (mid, hi)
    return hi


@dataclass(frozen=True)
class Change:
    """A treatment figure vs the baseline's at one level."""

    pct: float | None  # change of the means, percent (computed even where not comparable)
    ci: float | None = None  # printed 95% half-width, percent (None without >= 2 repeats in both runs)
    test_hw: float | None = None  # the ~ test's threshold, percent (None: ``ci`` is the threshold)
    comparable: bool = True  # False: the runs are not comparable at this level; shown as n/c
    single: bool = False  # a single run on one side at least: no interval, and no finding (SINGLE_MARK)
    settle_n: int | None = None  # repeats per arm to settle the sign (repeats_to_settle); None: settled

    @property
    def noise(self) -> bool:
        """The noise test does not reject 'no change': the change is inside the repeats' noise."""
        hw = self.test_hw if self.test_hw is not None else self.ci
        return self.pct is not None and hw is not None and abs(self.pct) <= hw

    @property
    def negligible(self) -> bool:
        """Inside the noise or under NEGLIGIBLE_PCT: no direction (the verdict calls both 'inside the noise')."""
        return self.pct is not None and (self.noise or abs(self.pct) < NEGLIGIBLE_PCT)

    @property
    def usable(self) -> bool:
        """Measured in both runs and comparable: the verdict and the crossover may use it."""
        return self.pct is not None and self.comparable

    @property
    def shown(self) -> float | None:
        """The change as shown: None where it is suppressed (not comparable)."""
        return self.pct if self.comparable else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "pct": self.shown,
            "raw_pct": self.pct,
            "ci_half_width_pct": self.ci,
            "noise": self.noise,
            "noise_test_half_width_pct": self.test_hw,
            "comparable": self.comparable,
            "single_run": self.single,
            "repeats_to_settle": self.settle_n,
        }


def change_of(
    base: Sequence[float], new: Sequence[float], base_mean: float | None, new_mean: float | None
) -> Change:
    """Change of the means, with an interval when both sides have >= 2 repeat values."""
    ci = ci_change(base, new)
    if ci is not None:
        ch = Change(ci.pct, ci.half_width, ci.test_half_width)
        return dataclasses.replace(ch, settle_n=repeats_to_settle(base, new)) if ch.noise else ch
    pct = change_pct(base_mean, new_mean)
    return Change(pct, single=pct is not None)


def _as_change(y: Change | float | None) -> Change:
    return y if isinstance(y, Change) else Change(y)


# ---------------------------------------------------------------- the crossover (one function)


@dataclass(frozen=True)
class Crossover:
    """Where a change crosses zero between two measured levels (low < high)."""

    low: float  # the last level on the old side (outside the noise)
    high: float  # the first level on the new side (outside the noise)
    at: float  # interpolated concurrency, linear in log2(C); the level itself when inside_noise
    direction: str  # "down": gain turns into loss; "up": loss turns into gain
    inside_noise: bool = False  # the crossing is at a level whose change is inside the noise
    skipped: tuple[float, ...] = ()  # levels between low and high left out: not comparable
    single_runs: bool = False  # low or high is a single run: a sign change measured, not a finding


def crossover(levels: Sequence[float], changes: Sequence[Change | float | None]) -> list[Crossover]:
    """Every sign change of ``changes`` (aligned with ascending ``levels``), in level order.

    The one definition the verdict, the JSON and the plot all use. Levels without a change and
    levels where the runs are not comparable are skipped (and listed in ``skipped``). Between two
    levels of opposite sign outside the noise: when some level in between is inside the noise
    (or under NEGLIGIBLE_PCT), the crossover is that level (the one nearest zero), since the data
    cannot place it more finely; otherwise it is the raw changes' linear interpolation in log2(C):
    log2(C*) = log2(Ca) + (log2(Cb) − log2(Ca)) × ya / (ya − yb).
    """
    if len(levels) != len(changes):
        raise ValueError("levels and changes must have the same length")
    pts = [
        (c, ch)
        for c, ch in zip(levels, map(_as_change, changes), strict=True)
        if c > 0 and ch.pct is not None
    ]
    usable = [(c, ch) for c, ch in pts if ch.comparable]
    decided = [i for i, (_, ch) in enumerate(usable) if not ch.negligible]
    out: list[Crossover] = []
    for i, j in zip(decided, decided[1:], strict=False):
        (ca, a), (cb, b) = usable[i], usable[j]
        ya, yb = a.pct or 0.0, b.pct or 0.0
        if (ya > 0) == (yb > 0):
            continue
        direction = "down" if ya > 0 else "up"
        skipped = tuple(c for c, ch in pts if not ch.comparable and ca < c < cb)
        between = usable[i + 1 : j]
        if between:
            c0 = min(between, key=lambda p: abs(p[1].pct or 0.0))[0]
            out.append(Crossover(ca, cb, float(c0), direction, True, skipped))
            continue
        xa, xb = math.log2(ca), math.log2(cb)
        out.append(Crossover(ca, cb, 2.0 ** (xa + (xb - xa) * ya / (ya - yb)), direction, False, skipped))
    return out


# ---------------------------------------------------------------- the verdict, in words


def _fmt_c(c: float) -> str:
    return f"{c:.0f}" if c >= 10 else f"{c:.1f}"


@dataclass(frozen=True)
class Axis:
    """How a comparison's levels are named in words: concurrency (C=32) or request rate (8 req/s)."""

    rate: bool = False

    def at(self, x: float) -> str:
        return f"{x:g} req/s" if self.rate else f"C={x}"

    def many(self, xs: Sequence[float]) -> str:
        return f"{', '.join(f'{x:g}' for x in xs)} req/s" if self.rate else f"C={', '.join(map(str, xs))}"

    def near(self, x: float) -> str:
        return f"≈{_fmt_c(x)} req/s" if self.rate else f"C≈{_fmt_c(x)}"

    def from_(self, x: float) -> str:
        return f"from {x:g} req/s" if self.rate else f"at C>={x}"

    @property
    def name(self) -> str:
        return "request rate" if self.rate else "concurrency"


CONCURRENCY, RATE = Axis(), Axis(rate=True)


def fmt_raw_pct(pct: float) -> str:
    """A change with one decimal (+0.4%): the raw value a whole percent would round to 0%."""
    return f"{pct:+.1f}%"


def _segments(points: Sequence[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    """(C, change) points grouped into runs of the same sign."""
    segs: list[list[tuple[float, float]]] = []
    for c, y in points:
        if segs and (segs[-1][-1][1] > 0) == (y > 0):
            segs[-1].append((c, y))
        else:
            segs.append([(c, y)])
    return segs


def _range(ys: Sequence[float], fmt: Callable[[float], str] = fmt_pct) -> str:
    lo, hi = fmt(min(ys)), fmt(max(ys))
    return lo if lo == hi else f"{lo} to {hi}"


def _left_out(levels: Sequence[float], axis: Axis = CONCURRENCY) -> str:
    return f"{', '.join(axis.at(c) for c in levels)} left out, not comparable"


def _where_one(x: Crossover, raw: dict[float, float], axis: Axis = CONCURRENCY) -> str:
    extra = f"; {_left_out(x.skipped, axis)}" if x.skipped else ""
    if x.inside_noise:
        c = x.at if axis.rate else int(x.at)
        return f"at about {axis.at(c)} (inside the noise: {fmt_raw_pct(raw[c])}{extra})"
    return f"near {axis.near(x.at)} (between {axis.at(x.low)} and {axis.at(x.high)}{extra})"


def _where(xs: Sequence[Crossover], raw: dict[float, float], axis: Axis = CONCURRENCY) -> str:
    parts = [_where_one(x, raw, axis) for x in xs]
    if len(parts) == 1:
        return "crossover " + parts[0]
    return "crossovers " + ", ".join(parts[:-1]) + " and " + parts[-1]


@dataclass(frozen=True)
class _Wording:
    """How one figure's changes are told: never changed, one direction throughout, or crossing."""

    unchanged: str
    steady: Callable[[bool, bool], str]  # (up, some levels inside the noise) -> clause head
    detail: Callable[[list[tuple[float, float]], Axis], str]  # the points outside the noise -> what is quoted
    first: Callable[[bool], str]  # the opening of a crossing clause
    later: Callable[[bool], str]  # each later side of a crossing clause


def _raises(up: bool) -> str:
    return "raises" if up else "lowers"


def _higher(up: bool) -> str:
    return "higher" if up else "lower"


_AGG = _Wording(
    unchanged="leaves aggregate tok/s unchanged at every level measured",
    steady=lambda up, quiet: (
        f"{_raises(up)} aggregate tok/s at every level " + ("outside the noise" if quiet else "measured")
    ),
    detail=lambda pts, axis: _range([y for _, y in pts]),
    first=lambda up: f"{_raises(up)} aggregate tok/s",
    later=lambda up: f"{_raises(up)} it",
)
_PER_REQ = _Wording(
    unchanged="per-request speed is unchanged at every level",
    steady=lambda up, quiet: (
        f"per-request speed stays {_higher(up)} at every level" + (" outside the noise" if quiet else "")
    ),
    detail=lambda pts, axis: f"{fmt_pct(pts[-1][1])} at {axis.at(pts[-1][0])}",
    first=lambda up: f"per-request speed is {_higher(up)}",
    later=_higher,
)


def _direction_part(
    levels: Sequence[float], changes: Sequence[Change], wording: _Wording, axis: Axis = CONCURRENCY
) -> str | None:
    """One clause on where ``changes`` are up and where down, with the crossovers between.

    Only levels measured in both runs and comparable count. Levels inside the noise (or under
    NEGLIGIBLE_PCT) have no direction: they are quoted with their raw change, never as 0%, and the
    clause says "outside the noise" when it speaks of every other level.
    """
    pts = [(c, ch) for c, ch in zip(levels, changes, strict=True) if ch.usable]
    if not pts:
        return None
    decided = [(c, ch.pct or 0.0) for c, ch in pts if not ch.negligible]
    quiet = [(c, ch.pct or 0.0) for c, ch in pts if ch.negligible]
    if not decided:
        return f"{wording.unchanged} (all inside the noise: {_range([y for _, y in quiet], fmt_raw_pct)})"
    segs = _segments(decided)
    if len(segs) == 1:
        noted = (
            "; " + ", ".join(f"{axis.at(c)}: {fmt_raw_pct(y)}" for c, y in quiet) + ", inside the noise"
            if quiet
            else ""
        )
        return f"{wording.steady(decided[0][1] > 0, bool(quiet))} ({wording.detail(decided, axis)}{noted})"
    head = segs[0]
    parts = [f"{wording.first(head[0][1] > 0)} up to {axis.at(head[-1][0])} ({fmt_pct(head[-1][1])})"]
    for i, seg in enumerate(segs[1:]):
        again = " again" if i > 0 else ""
        parts.append(
            f"{wording.later(seg[0][1] > 0)}{again} from {axis.at(seg[0][0])} ({fmt_pct(seg[0][1])})"
        )
    text = parts[0] + "".join(f", {p}" for p in parts[1:-1]) + f" and {parts[-1]}"
    raw = {c: ch.pct or 0.0 for c, ch in pts}
    return f"{text}, {_where(crossover(levels, changes), raw, axis)}"


def _tpot_part(
    levels: Sequence[float], changes: Sequence[float | None], axis: Axis = CONCURRENCY
) -> str | None:
    """How the time between tokens of running requests changed: speculation's per-step gain,
    which queueing (in E2E, hence in Per-req tok/s) can hide at high concurrency."""
    pts = [(c, y) for c, y in zip(levels, changes, strict=False) if y is not None]
    if not pts:
        return None
    top_c, top_y = pts[-1]
    faster = [c for c, y in pts if y <= -NEGLIGIBLE_PCT]
    slower = [c for c, y in pts if y >= NEGLIGIBLE_PCT]
    if len(faster) == len(pts):
        return f"Running requests decode faster at every level (TPOT {fmt_pct(top_y)} at {axis.at(top_c)})"
    if len(slower) == len(pts):
        return f"Running requests decode slower at every level (TPOT {fmt_pct(top_y)} at {axis.at(top_c)})"
    if faster and slower:
        return (
            f"Running requests decode faster at {axis.many(faster)} and slower at "
            f"{axis.many(slower)} (TPOT {fmt_pct(top_y)} at {axis.at(top_c)})"
        )
    return None


def crossover_sentence(
    label: str,
    levels: Sequence[float],
    agg_changes: Sequence[Change | float | None],
    per_req_changes: Sequence[Change | float | None],
    *,
    queue_from: float | None = None,
    max_running: int | None = None,
    tpot_changes: Sequence[float | None] = (),
    axis: Axis = CONCURRENCY,
    cap_how: str = "",
) -> str:
    """The verdict for one treatment run vs the baseline, in plain words.

    ``levels`` ascending; the changes (Change, or a bare percent; None where a run lacks the level)
    aligned with it. ``tpot_changes``: None where a run lacks the level or it is not comparable.
    ``queue_from``: the first level at which the treatment's server queued requests (None: never or
    unknown); ``max_running``: its max_running_requests, when known.
    """
    agg_chs, per_chs = [_as_change(y) for y in agg_changes], [_as_change(y) for y in per_req_changes]
    agg = _direction_part(levels, agg_chs, _AGG, axis)
    per = _direction_part(levels, per_chs, _PER_REQ, axis)
    if agg is None and per is None:
        text = f"{label}: no level was measured in both runs and comparable, so there is nothing to compare."
        if not any(ch.pct is not None for ch in (*agg_chs, *per_chs)):
            text = f"{label}: no level was measured in both runs, so there is nothing to compare."
    elif agg is None:
        text = f"{label}: no aggregate tok/s to compare; {per}."
    else:
        text = f"{label} {agg}" + (f"; {per}." if per else ".")
    decode = _tpot_part(levels, tpot_changes, axis)
    if decode:
        text += f" {decode}."
    text += _queue_part(queue_from, max_running, axis, cap_how)
    return text + _left_out_part(levels, agg_chs, per_chs, axis)


def _left_out_part(levels: Sequence[float], agg: Sequence[Change], per: Sequence[Change], axis: Axis) -> str:
    left_out = [
        c
        for c, a, p in zip(levels, agg, per, strict=True)
        if any(ch.pct is not None and not ch.comparable for ch in (a, p))
    ]
    if not left_out:
        return ""
    return f" Not comparable, so left out of this verdict: {', '.join(axis.at(c) for c in left_out)} (see the notes)."


def _queue_part(queue_from: float | None, max_running: int | None, axis: Axis, cap_how: str = "") -> str:
    """' At C>=16 the server queued requests: its max_running_requests is 8.' ('' when it never queued).
    ``cap_how``: how the cap is known when SGLang's own field did not say it (', inferred from its gauges')."""
    if queue_from is None:
        return ""
    where = axis.from_(queue_from)
    text = f" {where[0].upper()}{where[1:]} the server queued requests"
    if max_running is not None and queue_from > max_running:
        return text + f": its max_running_requests is {max_running}{cap_how}."
    if max_running is not None:
        return text + f" (its max_running_requests is {max_running}{cap_how})."
    return text + "."


# ---------------------------------------------------------------- single runs: what one run can show

SINGLE_MARK = "(1 run)"  # next to a change measured from a single run on one side at least
# How to turn single runs into repeats, said wherever a change is left without a verdict.
REPEAT_ADVICE = (
    "repeats would settle it: sweep both again with `--repeat 3` (each level three times, pooled by specload "
    "compare), or make them arms of `specload experiment --repeat 3`, which interleaves them (A, B, A, B, ...) so "
    "that drift of the machine lands in the interval instead of in the difference"
)


def _quote(pts: Sequence[tuple[float, float]], axis: Axis) -> str:
    """'-4% (C=1), +2% (C=4)'; over eight levels the range: '-4% to +6% (C=1 to 64)'."""
    if len(pts) <= 8:
        return ", ".join(f"{_whole(y)} ({axis.at(c)})" for c, y in pts)
    return f"{_range([y for _, y in pts], _whole)} ({axis.at(pts[0][0])} to {pts[-1][0]:g})"


def _whole(pct: float) -> str:
    """A single run's change in whole percents (+12%), one decimal under 1% (+0.4%), never 0%."""
    return fmt_pct(pct) if abs(pct) >= 1 else fmt_raw_pct(pct)


def single_run_part(
    levels: Sequence[float],
    agg_changes: Sequence[Change],
    per_req_changes: Sequence[Change],
    tpot_changes: Sequence[float | None] = (),
    axis: Axis = CONCURRENCY,
) -> str | None:
    """The changes at the levels that are a single run (on one side at least), told as measurements,
    never as a rise, a fall or a crossover: one run per level gives no spread between runs to hold
    a change against (docs/metrics.md, "Single runs"). None when no level is a single run."""
    single = [
        i
        for i, (a, p) in enumerate(zip(agg_changes, per_req_changes, strict=True))
        if (a.usable and a.single) or (p.usable and p.single)
    ]
    if not single:
        return None
    tp = list(tpot_changes) + [None] * (len(levels) - len(tpot_changes))
    parts, crossings = [], []
    for name, chs in (("aggregate tok/s", agg_changes), ("per-request tok/s", per_req_changes)):
        pts = [(levels[i], chs[i].pct or 0.0) for i in single if chs[i].usable and chs[i].single]
        if not pts:
            continue
        parts.append(f"{name} {_quote(pts, axis)}")
        flips = crossover([c for c, _ in pts], [y for _, y in pts])
        if flips:
            crossings.append(
                f"{name} changes sign between "
                + " and between ".join(
                    f"{axis.at(x.low)} and {axis.at(x.high)} (near {axis.near(x.at)})" for x in flips
                )
            )
    tpot = [(levels[i], y) for i in single if (y := tp[i]) is not None]
    if tpot:
        parts.append(f"TPOT p50 {_quote(tpot, axis)}")
    where = axis.many([levels[i] for i in single])
    # where speculation may stop paying comes first (told as measured: a single run makes no crossover)
    lead = f"{' and '.join(crossings)}, in single runs. At" if crossings else "at"
    return (
        f"{lead} {where} each side is a single run, so these changes are no finding yet: {'; '.join(parts)}. "
        "One run per level cannot tell a change from the spread between runs, which only repeats measure; "
        f"{REPEAT_ADVICE}."
    )


# ---------------------------------------------------------------- comparability


@dataclass(frozen=True)
class LevelQuality:
    """One run's requests at one level, over its repeats: what decides whether a Δ there means
    what it says (the figures alone hide a chunk-counted token total or a survivors-only mean)."""

    sent: int = 0  # measured requests, any outcome
    ok: int = 0
    failed: int = 0
    short: int = 0
    chunk_counted: int = 0  # measured requests whose output count is a count of stream chunks
    output_mismatch: int = 0  # non-failed requests whose output count != requested
    prompt_mismatch: int = 0  # requests whose server prompt count != requested
    requested_output_tokens: int | None = None  # most common, in the repeat with most requests
    requested_prompt_tokens: int | None = None


def level_quality(f: RepeatedLevelStats) -> LevelQuality:
    """The counts of every repeat of a level summed (LevelStats keeps them per repeat)."""
    ls: list[LevelStats] = [s for s in f.levels if s.sent > 0]
    if not ls:
        return LevelQuality()
    top = max(ls, key=lambda s: s.sent)
    counts = ("sent", "ok", "failed", "short", "output_mismatch", "prompt_mismatch")
    return LevelQuality(
        **{name: sum(getattr(s, name) for s in ls) for name in counts},
        chunk_counted=sum(s.token_sources.get(SRC_CHUNKS, 0) for s in ls),
        requested_output_tokens=top.requested_output_tokens,
        requested_prompt_tokens=top.requested_prompt_tokens,
    )


@dataclass(frozen=True)
class LevelCheck:
    """Whether one treatment's changes at one level mean what they say."""

    reasons: tuple[str, ...] = ()  # why its changes are not comparable (empty: comparable)
    remarks: tuple[str, ...] = ()  # worth knowing, but the changes stand

    @property
    def comparable(self) -> bool:
        return not self.reasons


def _share(k: int, n: int) -> str:
    return f"{k} of {n} requests"


def _run_issues(label: str, q: LevelQuality) -> tuple[list[str], list[str]]:
    """(reasons, remarks) from one run's own requests at a level; shares over NOT_COMPARABLE_SHARE suppress."""
    reasons: list[str] = []
    remarks: list[str] = []
    if q.sent <= 0:
        return reasons, remarks
    if q.chunk_counted:
        text = (
            f"{label} counted output tokens from stream chunks for {_share(q.chunk_counted, q.sent)} (the "
            "server sent no count; a chunk can carry several tokens, so Tokens, Agg and TPOT are off)"
        )
        (reasons if q.chunk_counted / q.sent > NOT_COMPARABLE_SHARE else remarks).append(text)
    bad = q.failed + q.short
    if bad:
        text = f"{label}: {_share(bad, q.sent)} failed or short ({bad / q.sent * 100:.1f}%)"
        if bad / q.sent > NOT_COMPARABLE_SHARE:
            reasons.append(text)
        else:
            remarks.append(text + "; Per-req, TTFT and TPOT are over the OK ones")
    if q.output_mismatch:
        remarks.append(
            f"{label}: output length differs from the one asked for in {_share(q.output_mismatch, q.sent)}"
        )
    if q.prompt_mismatch:
        remarks.append(
            f"{label}: the server counted another prompt length than asked for in "
            f"{_share(q.prompt_mismatch, q.sent)}"
        )
    return reasons, remarks


def prompt_material(m: RunMeta) -> str | None:
    """What the prompt text is: 'dataset NAME' or 'synthetic' (random ids/words); None when unknown.

    The acceptance length of speculative decoding depends on the text, so runs on different
    material measure the prompts as much as the server."""
    origin = m.prompts.get("origin")
    if not isinstance(origin, str) or not origin:
        return None
    return origin.split(" (")[0] if origin.startswith(("dataset", "real text")) else "synthetic"


def prompts_desc(m: RunMeta) -> str | None:
    """'ids from server /tokenize': run.json prompts' kind and origin; None when not recorded."""
    origin = m.prompts.get("origin")
    if not isinstance(origin, str) or not origin:
        return None
    return f"{m.prompts.get('kind') or 'prompts'} from {origin}"


def _own_lengths(m: RunMeta) -> tuple[bool, bool]:
    """(output, prompt) lengths are fixed by the scenario (not each dataset item's own), so they must match."""
    if (sc := recorded_scenario(m)) is not None and sc.trace:  # a trace's requests: each its own lengths
        return False, False
    if sc is None or not sc.dataset:
        return True, True
    return sc.dataset_lengths == "fixed", False


def check_level(
    base: tuple[str, RunMeta, LevelQuality], treat: tuple[str, RunMeta, LevelQuality]
) -> LevelCheck:
    """The comparability rule (docs/metrics.md) for one treatment at one level.

    Not comparable when, in either run, more than NOT_COMPARABLE_SHARE of the measured requests
    counted tokens from stream chunks or failed or were short; when the requested output or prompt
    length differs; when the prompts are different material (dataset vs synthetic); or when the
    answers end differently (--output-mode forced vs natural). Smaller
    shares and length mismatches inside a run are remarks only. A level a run lacks is not checked.
    """
    (bl, bm, bq), (tl, tm, tq) = base, treat
    if bq.sent <= 0 or tq.sent <= 0:
        return LevelCheck()
    reasons: list[str] = []
    remarks: list[str] = []
    for label, q in ((bl, bq), (tl, tq)):
        r, k = _run_issues(label, q)
        reasons += r
        remarks += k
    (bo, bp), (to, tp) = _own_lengths(bm), _own_lengths(tm)
    for name, fixed, b, t in (
        ("output", bo and to, bq.requested_output_tokens, tq.requested_output_tokens),
        ("prompt", bp and tp, bq.requested_prompt_tokens, tq.requested_prompt_tokens),
    ):
        if fixed and b is not None and t is not None and b != t:
            reasons.append(f"requested {name} tokens differ ({bl} {b}, {tl} {t})")
    mb, mt = prompt_material(bm), prompt_material(tm)
    if mb is not None and mt is not None and mb != mt:
        reasons.append(f"the prompts are different material ({bl} {mb}, {tl} {mt})")
    eb, et = (m.scenario.get("output_mode", FORCED) for m in (bm, tm))  # (run.json without it: forced)
    if eb != et:
        reasons.append(f"the answers end differently ({bl} {eb}, {tl} {et}; --output-mode)")
    return LevelCheck(tuple(reasons), tuple(remarks))


# ---------------------------------------------------------------- the comparison


@dataclass
class ComparedRun:
    """One run of a comparison, its figures lined up on the comparison's levels."""

    label: str  # unique within the comparison
    run: Run
    figures: dict[float, RepeatedLevelStats]  # by concurrency (or rate), for every level of the comparison
    quality: dict[float, LevelQuality] = field(default_factory=dict)  # by concurrency (or rate)
    cap: RunningCap | None = None  # the run's cap on running requests (Run.cap: declared, else inferred)

    @property
    def cap_how(self) -> str:
        return self.cap.how if self.cap is not None else ""

    @property
    def cap_value(self) -> int | None:
        return self.cap.value if self.cap is not None else None

    @property
    def simulated(self) -> bool:
        return self.run.info.simulated

    def queue_from(self) -> float | None:
        """First level where the server queued (sampled queue > 0, or C above max_running_requests)."""
        for c in sorted(self.figures):
            f = self.figures[c]
            if not f.measured:
                continue
            over_cap = f.rate is None and self.cap is not None and c > self.cap.value
            if (f.of("server_queued_max") or 0) > 0 or over_cap:
                return c
        return None


@dataclass(frozen=True)
class Crossovers:
    """Where one treatment's changes cross zero (see ``crossover``)."""

    agg: list[Crossover]
    per_req: list[Crossover]


@dataclass
class Comparison:
    """The finished comparison: every number, crossover and sentence its consumers show."""

    runs: list[ComparedRun]  # runs[0] is the baseline
    levels: list[float]  # union of all runs' levels (concurrencies, or request rates), ascending
    agg: dict[str, list[Change]]  # treatment label -> change per level
    per_req: dict[str, list[Change]]
    tpot: dict[str, list[float | None]]  # treatment label -> TPOT p50 change per level (no interval)
    crossovers: dict[str, Crossovers]  # treatment label -> crossovers of its changes
    sentences: list[str]  # the verdict, one per treatment
    notes: list[str]
    checks: dict[str, list[LevelCheck]] = field(default_factory=dict)  # treatment label -> per level
    slo: SloComparison = field(default_factory=lambda: SloComparison(None))  # capacities, the Pareto points
    axis: Axis = CONCURRENCY  # what the levels are: concurrencies, or request rates
    categories: list[CategoryComparison] = field(default_factory=list)  # per prompt category ([]: none)
    # run label -> per level its acceptance over its repeats (analysis.accept_compare; None: none)
    accept: dict[str, list[AcceptFigures | None]] = field(default_factory=dict)
    accept_delta: dict[str, list[AcceptChange | None]] = field(
        default_factory=dict
    )  # treatment label -> per level
    # treatment label -> figure key -> change per level, of every numeric figure of the table (compare's
    # table shows those with a Figure.delta); agg and per_req are ``agg`` and ``per_req`` above
    changes: dict[str, dict[str, list[Change]]] = field(default_factory=dict)
    paired: list[PairedComparison] = field(default_factory=list)  # trace replays, request by request

    @property
    def baseline(self) -> ComparedRun:
        return self.runs[0]

    @property
    def treatments(self) -> list[ComparedRun]:
        return self.runs[1:]

    @property
    def simulated(self) -> bool:
        """Some run measured the built-in simulator (said in every header and title)."""
        return any(r.simulated for r in self.runs)


def unique_labels(names: Sequence[str]) -> list[str]:
    """The names, with -2, -3, ... appended to repeats so that every label is distinct."""
    out: list[str] = []
    for name in names:
        label, k = name, 2
        while label in out:
            label, k = f"{name}-{k}", k + 1
        out.append(label)
    return out


def _firm(ch: Change, single: bool) -> Change:
    """The change as the firm part of the verdict sees it: none at a single-run level."""
    return Change(None) if single else ch


def _sentence(comp: Comparison, t: ComparedRun) -> str:
    agg, per = comp.agg[t.label], comp.per_req[t.label]
    checks = comp.checks[t.label]
    tpot = [y if k.comparable else None for y, k in zip(comp.tpot[t.label], checks, strict=True)]
    single = [(a.usable and a.single) or (p.usable and p.single) for a, p in zip(agg, per, strict=True)]
    told = single_run_part(comp.levels, agg, per, tpot, comp.axis)
    caveat = acceptance_caveat(t.run) or acceptance_caveat(comp.baseline.run)
    prompts = f" Prompts: {caveat}." if caveat else ""  # the last word, whatever the verdict
    if told is not None and all(
        s or not (a.usable or p.usable) for s, a, p in zip(single, agg, per, strict=True)
    ):
        # every level there is to compare is a single run: the measurements, and nothing firmer
        text = f"{t.label} vs {comp.baseline.label}: {told}"
        text += _queue_part(t.queue_from(), t.cap_value, comp.axis, t.cap_how)
        return text + _left_out_part(comp.levels, agg, per, comp.axis) + prompts
    text = crossover_sentence(
        t.label,
        comp.levels,
        [_firm(a, s) for a, s in zip(agg, single, strict=True)],
        [_firm(p, s) for p, s in zip(per, single, strict=True)],
        queue_from=t.queue_from(),
        max_running=t.cap_value,
        tpot_changes=[None if s else y for y, s in zip(tpot, single, strict=True)],
        axis=comp.axis,
        cap_how=t.cap_how,
    )
    if told is not None:
        text += f" Besides, {told}"
    noisy = [
        c
        for c, a, p in zip(comp.levels, agg, per, strict=True)
        if (a.noise and a.usable) or (p.noise and p.usable)
    ]
    if noisy:
        where = ", ".join(comp.axis.at(c) for c in noisy)
        text += f" The changes marked {NOISE_MARK} ({where}) are inside the noise of the repeats"
        text += _settle_part(comp.levels, agg, per, comp.axis) + "."
    return text + prompts


def _settle_part(levels: Sequence[float], agg: Sequence[Change], per: Sequence[Change], axis: Axis) -> str:
    """What settling the signs inside the noise would take: per level, the repeats per arm that
    settle both its changes (the larger of the two), at the spread the repeats measured."""
    need = []
    for c, a, p in zip(levels, agg, per, strict=True):
        ns = [ch.settle_n for ch in (a, p) if ch.usable and ch.noise and ch.settle_n is not None]
        if ns:
            need.append(f"at {axis.at(c)} would take ~{max(ns)}")
    return f"; at their measured spread, settling the sign {', '.join(need)} repeats per arm" if need else ""


def _with(ch: Change, check: LevelCheck) -> Change:
    return ch if check.comparable else dataclasses.replace(ch, comparable=False)


def _marked(levels: Sequence[float], changes: Sequence[Change]) -> list[Crossover]:
    """The crossovers, those with a single run at either end marked as such (Crossover.single_runs)."""
    single = {c for c, ch in zip(levels, changes, strict=True) if ch.single}
    return [
        dataclasses.replace(x, single_runs=True) if x.low in single or x.high in single else x
        for x in crossover(levels, changes)
    ]


def build_comparison(runs: Sequence[Run]) -> Comparison:
    """Everything the table, the sentences and the plot show, from loaded run directories."""
    if len(runs) < 2:
        raise ValueError("a comparison needs at least two runs (the first is the baseline)")
    labels = unique_labels([r.label for r in runs])
    kinds = [any(s.rate is not None for s in r.levels) for r in runs]
    if len(set(kinds)) > 1:
        which = ", ".join(
            f"{label} ({'request rates' if k else 'concurrency'})"
            for label, k in zip(labels, kinds, strict=True)
        )
        raise ValueError(
            f"cannot compare runs of request-rate levels with runs of concurrency levels: {which}"
        )
    axis = RATE if kinds[0] else CONCURRENCY
    levels = sorted({s.x for r in runs for s in r.levels})
    cruns = []
    for label, r in zip(labels, runs, strict=True):
        figs = {c: repeats_at(r.levels, c, axis.rate) for c in levels}
        cruns.append(ComparedRun(label, r, figs, {c: level_quality(figs[c]) for c in levels}, r.cap))
    base = cruns[0]
    comp = Comparison(cruns, levels, {}, {}, {}, {}, [], [], axis=axis)
    for t in cruns[1:]:
        checks = [
            check_level((base.label, base.run.info, base.quality[c]), (t.label, t.run.info, t.quality[c]))
            for c in levels
        ]
        pairs = [(base.figures[c], t.figures[c]) for c in levels]
        agg, per = (
            [_with(_change(b, n, name, True), k) for (b, n), k in zip(pairs, checks, strict=True)]
            for name in ("agg_tok_s", "per_req_tok_s")
        )
        comp.agg[t.label], comp.per_req[t.label], comp.checks[t.label] = agg, per, checks
        comp.changes[t.label] = {
            f.key: [_change(b, n, f.field, k.comparable) for (b, n), k in zip(pairs, checks, strict=True)]
            for f in figures.FIGURES
            if f.numeric
        } | {"agg": agg, "per_req": per}
        comp.tpot[t.label] = [change_pct(b.of("tpot_p50_ms"), n.of("tpot_p50_ms")) for b, n in pairs]
        comp.crossovers[t.label] = Crossovers(_marked(levels, agg), _marked(levels, per))
    comp.sentences = [_sentence(comp, t) for t in comp.treatments]
    notes = _notes(comp)
    unlike = [n.partition(": the comparison")[0] for n in notes if n.endswith(NOT_LIKE)]
    comp.slo = compare_slo([(r.label, r.run, r.figures) for r in cruns], unlike)
    comp.paired, paired_notes = paired_of_runs([(r.label, [r.run]) for r in cruns], runs[0].slo)
    comp.notes = notes + comp.slo.notes + paired_notes
    comp.categories = compare_categories(comp)
    comp.accept = {r.label: [accept_figures(r.figures[c]) for c in levels] for r in cruns}
    comp.accept_delta = {
        t.label: [
            accept_change(b, n) for b, n in zip(comp.accept[base.label], comp.accept[t.label], strict=True)
        ]
        for t in cruns[1:]
    }
    return comp


# ---------------------------------------------------------------- notes

# Run-level settings that should match between the runs for the comparison to be fair.
_SAME: tuple[tuple[str, Callable[[RunMeta], Any]], ...] = (
    ("model", lambda m: m.model),
    ("backend", lambda m: m.backend),
    ("input tokens", lambda m: sc.input_tokens if (sc := recorded_scenario(m)) else None),
    ("output tokens", lambda m: sc.output_tokens if (sc := recorded_scenario(m)) else None),
    ("server engine", lambda m: m.server.get("engine")),
    ("server version", lambda m: m.server.get("version")),
    ("server tp_size", lambda m: m.server.get("tp_size")),
)


def _prompt_notes(comp: Comparison) -> list[str]:
    descs = [prompts_desc(r.run.info) for r in comp.runs]
    if len({d for d in descs if d is not None}) <= 1:
        return []
    shown = "; ".join(f"{r.label} {d or 'not recorded'}" for r, d in zip(comp.runs, descs, strict=True))
    materials = {m for m in (prompt_material(r.run.info) for r in comp.runs) if m is not None}
    why = (
        "different material: the acceptance length depends on the text, so the changes are n/c"
        if len(materials) > 1
        else "the acceptance length can depend on the prompts"
    )
    return [f"the runs' prompts differ ({shown}): {why}"]


def _level_notes(comp: Comparison) -> list[str]:
    """Per level: why a treatment's changes are n/c, then the remarks that leave them standing."""
    notes: list[str] = []
    for i, c in enumerate(comp.levels):
        for t in comp.treatments:
            k = comp.checks[t.label][i]
            if k.reasons:
                notes.append(
                    f"{comp.axis.at(c)}: not comparable (n/c), changes of {t.label} not shown: "
                    f"{'; '.join(k.reasons)}"
                )
        for t in comp.treatments:
            notes += [f"{comp.axis.at(c)}: {remark}" for remark in comp.checks[t.label][i].remarks]
    return list(dict.fromkeys(notes))  # a baseline remark is said once, not once per treatment


def _notes(comp: Comparison) -> list[str]:
    notes: list[str] = []
    for r in comp.runs:
        notes += [f"{r.label}: {n}" for n in r.run.notices]
        status = r.run.info.status
        if status not in (None, RUN_COMPLETED):
            notes.append(f"{r.label}: run status is {status}: the last levels may be partial")
    for c in comp.levels:
        lacking = [r.label for r in comp.runs if not r.figures[c].measured]
        if lacking:
            notes.append(
                f"{comp.axis.at(c)}: no measured requests in {', '.join(lacking)}; shown as {MISSING}"
            )
    for name, value_of in _SAME:
        values = [value_of(r.run.info) for r in comp.runs]
        if len({json.dumps(v, sort_keys=True, default=str) for v in values if v is not None}) > 1:
            shown = ", ".join(f"{r.label} {v}" for r, v in zip(comp.runs, values, strict=True))
            notes.append(f"the runs differ in {name} ({shown}): {NOT_LIKE}")
    notes += _prompt_notes(comp)
    notes += _level_notes(comp)
    for r in comp.runs:  # levels the load generator itself distorted (specload.analysis.clientcheck)
        notes += [f"{r.label}: {flag}" for _, flag in sorted(client_flags(r.run).items())]
    reps = [
        f"{comp.axis.at(c)} " + "/".join(str(len(r.figures[c].repeats)) for r in comp.runs)
        for c in comp.levels
        if any(len(r.figures[c].repeats) > 1 for r in comp.runs)
    ]
    if reps:
        notes.append(
            "repeats combined by their mean (server maxima: the max); repeats per run "
            f"({'/'.join(r.label for r in comp.runs)}): {', '.join(reps)}"
        )
    if any(ch.ci is not None for chs in (*comp.agg.values(), *comp.per_req.values()) for ch in chs):
        notes.append(
            "(±x%) is the 95% confidence interval of the change (delta method for the ratio of the means over "
            f"the repeats, so the baseline's noise counts too); {NOISE_MARK} means Welch's t test of the means finds "
            "no difference at 5%: the change is inside the noise; Repeats to settle (after Δ agg and Δ per-req) is, "
            f"per arm, the repeats that would settle the sign of whichever of the two is marked {NOISE_MARK} at the "
            "spread measured (the larger where both are)"
        )
    for r in comp.runs:
        if r.cap is not None and r.cap.detail:
            notes.append(f"{r.label}: {r.cap.detail}")
        notes += [f"{r.label}: {n}" for n in r.run.max_running_notes()]
    notes += drift_notes(comp)
    return notes


DRIFT_MARK = "(drift)"  # next to a run's Agg tok/s at a level whose throughput drifted within itself


def drifted(f: RepeatedLevelStats) -> list[LevelStats]:
    """The repeats of a level whose throughput drifted within themselves (specload.analysis.drift)."""
    return [s for s in f.levels if s.drift is not None and s.drift.flagged]


def drift_notes(comp: Comparison) -> list[str]:
    """One note per run and level whose throughput drifted within the level."""
    notes = []
    for c in comp.levels:
        for r in comp.runs:
            for s in drifted(r.figures[c]):
                rep = f" (repeat {s.repeat + 1})" if len(r.figures[c].levels) > 1 else ""
                assert s.drift is not None
                notes.append(
                    f"{comp.axis.at(c)}{rep}: {r.label}'s throughput drifted within the level {DRIFT_MARK}: "
                    f"{s.drift.describe()}; its figures average two speeds, so a change there measures the "
                    "moment as much as the server (warm-up or compilation at a new batch size, a neighbour on the "
                    "machine); a warm-up (--warmup-requests N) or repeats tell which"
                )
    return notes


# ---------------------------------------------------------------- per prompt category
# Speculation's change per prompt category: the answer for a mixed workload. A categorised dataset
# (SPEED-Bench's rows) gives every record its row's category, and metrics.summarize summarizes each
# level's part per category as it summarizes the level; here each part's repeats are combined as the
# level's are and compared with the level's own arithmetic (change_of, crossover, crossover_sentence)
# and comparability, so that a category whose speedup ends at a lower concurrency than the mix's
# says so. docs/metrics.md, "Prompt categories".


def category_figures(f: RepeatedLevelStats, category: str) -> RepeatedLevelStats:
    """The category's part of one level, over its repeats, combined as the level's figures are."""
    parts = [g.stats for s in f.levels if s.mix is not None for g in s.mix.categories if g.key == category]
    return combine_parts(f.x, parts, f.rate is not None)


@dataclass
class CategoryComparison:
    """One category across the comparison: per run and level its figures, per treatment its changes."""

    category: str
    figures: dict[str, list[RepeatedLevelStats]]  # run label -> per level of the comparison
    # Treatment label -> change of the category's Per-req tok/s per level. Its Agg tok/s has no change
    # of its own: over the level's wall time it is the level's times the category's share of the
    # tokens, the same in both runs with the same prompts, so its change is the level's.
    per_req: dict[str, list[Change]]
    crossovers_per_req: dict[str, list[Crossover]]
    sentences: list[str]


def categories(comp: Comparison) -> list[str]:
    """Every category some run has at some level, sorted."""
    return sorted(
        {
            str(g.key)
            for r in comp.runs
            for f in r.figures.values()
            for s in f.levels
            if s.mix is not None
            for g in s.mix.categories
        }
    )


def _change(b: RepeatedLevelStats, n: RepeatedLevelStats, name: str, comparable: bool) -> Change:
    """The change of a figure of the table (its JSON field) from ``b``'s repeats to ``n``'s."""
    ch = change_of(b.values(name), n.values(name), b.of(name), n.of(name))
    return ch if comparable else dataclasses.replace(ch, comparable=False)


def _category_sentence(label: str, levels: Sequence[float], per: Sequence[Change], axis: Axis) -> str:
    """The verdict's per-request part for one category (its aggregate is the level's: CategoryComparison)."""
    words = _direction_part(levels, per, _PER_REQ, axis)
    if words is None:
        return f"{label}: no level was measured in both runs and comparable, so there is nothing to compare."
    return f"{label}: {words}." + _left_out_part(levels, [Change(None)] * len(levels), per, axis)


def compare_categories(comp: Comparison) -> list[CategoryComparison]:
    """Each category's changes and verdict; [] when no run has categories."""
    out = []
    for cat in categories(comp):
        figs = {r.label: [category_figures(r.figures[c], cat) for c in comp.levels] for r in comp.runs}
        base = figs[comp.baseline.label]
        cc = CategoryComparison(cat, figs, {}, {}, [])
        for t in comp.treatments:
            ok = [k.comparable for k in comp.checks[t.label]]
            new = figs[t.label]
            cc.per_req[t.label] = [
                _change(b, n, "per_req_tok_s", k) for b, n, k in zip(base, new, ok, strict=True)
            ]
            cc.crossovers_per_req[t.label] = crossover(comp.levels, cc.per_req[t.label])
            cc.sentences.append(
                _category_sentence(f"{t.label} on {cat} prompts", comp.levels, cc.per_req[t.label], comp.axis)
            )
        out.append(cc)
    return out
