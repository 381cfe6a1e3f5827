"""Per-level figures computed from RequestRecords. Pure functions: no I/O, no clock, no Locust.

Every number the report prints is derived here, from ``records.jsonl`` alone, so that the same
records always give the same table (Locust's own statistics are bucketed and only cross-checked).
The definitions are written out for users in ``docs/metrics.md``; keep the two in step.
"""

from __future__ import annotations

import math
import statistics
import sys
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from itertools import accumulate, compress, count, islice, repeat
from operator import add, and_, eq, ge, gt, le, mul, not_, sub, truediv
from typing import Any

from specload.analysis.columns import GroupKey, LevelColumns, Timeline
from specload.analysis.mixstats import MixStats, mix_stats, prefix_cache_rate
from specload.core import histogram
from specload.core.counters import window_ends
from specload.core.records import (
    OK,
    RequestRecord,
    level_label,
)
from specload.core.rundir import LevelMeta
from specload.core.slo import LevelSlo

# Where LevelStats.accept_length came from.
ACCEPT_FROM_RECORDS = "meta_info"  # SGLang per-request meta_info.spec_verify_ct
ACCEPT_FROM_COUNTERS = "server_counters"  # vLLM /metrics spec_decode counters, sampled

# A closed-loop user hands its slot from a finished request to its next one in (milli)seconds; a
# dip below C shorter than this is that hand-off, not the end of the steady state.
STEADY_MAX_DIP_S = 0.5
# A steady-state window shorter than this is too short to be a rate worth printing.
STEADY_MIN_WINDOW_S = 1.0
# The percentiles every latency distribution carries (the report shows a chosen subset).
PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
# Below this many values a high percentile is little more than the maximum: the report marks it.
SMALL_SAMPLE = 100
# Rate levels: a request sent more than this long after it was due was late (it waited for a
# free user, or for the client's own event loop). Below it is ordinary scheduling jitter.
LATE_S = 0.010
SERIES_BUCKET_S = 1.0  # tok/s over time: one value per this many seconds of the level


@dataclass
class Dist:
    """A latency's distribution over one level: count, mean, sample std-dev and percentiles.

    Values are seconds. ``exact`` is False for ITL, read from the per-request histograms (each
    percentile within specload.core.histogram.MAX_REL_ERROR, 1%, of the true value)."""

    n: int = 0
    mean: float | None = None
    std: float | None = None
    p: dict[float, float] = field(default_factory=dict)
    exact: bool = True

    def to_dict(self, scale: float = 1.0) -> dict[str, Any]:
        def sc(v: float | None) -> float | None:
            return None if v is None else v * scale

        return {
            "n": self.n,
            "mean": sc(self.mean),
            "std": sc(self.std),
            "exact": self.exact,
            **{f"p{q:g}": sc(v) for q, v in self.p.items()},
        }


def dist_of(values: Iterable[float | None]) -> Dist:
    return _sorted_dist([v for v in values if v is not None])[0]


def _integer_sqrt_of_frac_rto(n: int, m: int) -> int:
    a = math.isqrt(n // m)
    return a | (a * a * m != n)


def _float_sqrt_of_frac(n: int, m: int) -> float:
    """sqrt(n / m) correctly rounded (statistics' own method, CPython 3.11+)."""
    q = (n.bit_length() - m.bit_length() - 109) // 2
    if q >= 0:
        return float(_integer_sqrt_of_frac_rto(n, m << 2 * q) << q)
    return _integer_sqrt_of_frac_rto(n << -2 * q, m) / (1 << -q)


def stdev(xs: Sequence[float], ordered: Sequence[float] | None = None) -> float:
    """Sample standard deviation, the value ``statistics.stdev`` gives (from Python 3.11 on: the
    exact sum of squared deviations, its square root correctly rounded), without its per-value
    fractions: every double is an integer times 2**-shift, so the sums are exact integer sums.
    ``ordered``: the same values sorted, when the caller has them (the smallest one that is not
    zero is then found by bisection instead of a pass)."""
    n = len(xs)
    if n < 2:
        raise statistics.StatisticsError("stdev requires at least two data points")
    try:
        smallest = None
        if ordered is not None:  # the largest value below zero and the smallest above
            lo, hi = bisect_left(ordered, 0.0), bisect_right(ordered, 0.0)
            near = [abs(ordered[i]) for i in (lo - 1, hi) if 0 <= i < n and ordered[i] != 0.0]
            smallest = min(near) if near else None  # none: all zero, or a nan spoilt the order; look at all
        if smallest is None:
            smallest = min(map(abs, filter(None, xs)), default=0.0)
        if smallest == 0.0:
            return 0.0
        shift = min(1074, max(0, 53 - math.frexp(smallest)[1]))
        # (the values in their own order: sorted ones lie all over memory, ~40% slower to walk when many);
        # a product by 2**shift is ldexp's exact scaling, and trunc is int() in fewer instructions
        scaled = map(mul, xs, repeat(2.0**shift)) if shift <= 1023 else map(math.ldexp, xs, repeat(shift))
        ints = list(map(math.trunc, scaled))
        s1 = sum(ints)
        s2 = sum(map(mul, ints, ints))
        del ints
    except (OverflowError, ValueError, TypeError):  # inf, nan, not floats: the library's way
        return statistics.stdev(xs)
    num = n * s2 - s1 * s1
    return _float_sqrt_of_frac(num, (n * (n - 1)) << (2 * shift)) if num else 0.0


if sys.version_info < (3, 11):  # statistics.stdev was not correctly rounded before 3.11
    stdev = statistics.stdev  # type: ignore[assignment]  # noqa: F811


def dist_of_hist(hist: histogram.Hist) -> Dist:
    n = histogram.count(hist)
    if n == 0:
        return Dist(exact=False)
    m, sd = histogram.mean_std(hist)
    return Dist(n, m, sd, {q: histogram.quantile(hist, q) or 0.0 for q in PERCENTILES}, exact=False)


def percentile(values: Iterable[float | None], q: float) -> float | None:
    """q-th percentile (0..100), linear interpolation between closest ranks.

    Same as numpy's default ``np.percentile`` (method="linear"), which ``vllm bench serve`` uses, so
    our p50/p99 can be compared with theirs on the same data. None values are ignored because
    per-request figures are None when undefined (e.g. TPOT of a one-token reply).
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be within [0, 100], got {q}")
    return percentile_sorted(sorted(v for v in values if v is not None), q)


def percentile_sorted(xs: Sequence[float], q: float) -> float | None:
    """``percentile`` of values already sorted (no None among them)."""
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def mean(values: Iterable[float | None]) -> float | None:
    """Mean of the values that exist; None when none does (a figure that is undefined stays so).

    A plain sum / n rather than statistics.fmean: fmean's exact summation differs in the last bit,
    and every figure in records-derived JSON has been sum / n since the first run directory.
    """
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def _max(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return max(xs) if xs else None


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


@dataclass
class LevelStats:
    """Figures of one level (one repeat of one concurrency), all from measured records only."""

    concurrency: int
    repeat: int
    label: str  # level_label(C, repeat): the name used in Locust rows
    index: int | None = None  # level index in run.json (None when the level is not in run.json)
    planned: bool = True  # False: records exist for a level run.json does not list
    status: str | None = None  # level status from run.json (completed | incomplete | running)
    warmup: int = 0  # warmup requests (excluded from every other figure)
    sent: int = 0  # measured requests (any outcome)
    ok: int = 0
    short: int = 0
    failed: int = 0
    rate_limited: int = 0  # of the failed: HTTP 429 answers (the server shedding load, not an error of ours)
    output_tokens: int = 0  # sum over all measured records, whatever their outcome
    wall_s: float | None = None  # last measured t_end - first measured t_send
    agg_tok_s: float | None = None  # output_tokens / wall_s
    per_req_tok_s: float | None = None  # mean over OK of output_tokens / e2e
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p99_ms: float | None = None
    e2e_p50_s: float | None = None
    e2e_p99_s: float | None = None
    decode_tok_s_mean: float | None = None  # mean over OK of (N - 1) / (e2e - ttft)
    prompt_tokens_mean: float | None = None  # server-counted, over OK records that report it
    requested_output_tokens: int | None = None  # most common requested max_tokens
    requested_prompt_tokens: int | None = None  # most common requested prompt length
    token_sources: dict[str, int] = field(default_factory=dict)  # measured records per token source
    chunk_fallback_ok: int = 0  # OK records whose output count is a chunk count
    token_note: str | None = None  # set when chunk_fallback_ok > 0
    output_mismatch: int = 0  # non-failed records whose output count != requested
    prompt_mismatch: int = 0  # records whose server prompt count != requested
    steady_tok_s: float | None = None
    steady_window_s: float | None = None
    mean_concurrency: float | None = None  # sum(e2e) / wall_s
    peak_in_flight: int | None = None  # most measured requests in flight at once (client side)
    req_s: float | None = None  # OK requests / wall_s
    input_tok_s: float | None = None  # prompt tokens of all measured requests / wall_s
    total_tok_s: float | None = None  # input_tok_s + agg_tok_s
    tok_s_series: list[float] = field(
        default_factory=list
    )  # output tok/s per SERIES_BUCKET_S from the first send
    # Latency distributions over OK requests (seconds): ttft, tpot, itl, e2e.
    dists: dict[str, Dist] = field(default_factory=dict)
    itl_unit: str | None = None  # "token" | "event" | "mixed": what an ITL gap is between
    reasons: dict[str, int] = field(default_factory=dict)  # "failed: <reason>" / "short: <reason>"
    # speculative decoding: tokens per verify step (bonus token included), see accept_length_*()
    accept_length: float | None = None
    accept_length_source: str | None = None  # ACCEPT_FROM_RECORDS | ACCEPT_FROM_COUNTERS
    accept_length_requests: int = 0  # OK records that carried spec_verify_ct > 0
    # the server's own gauges (server_samples.jsonl) inside the level's measured window
    server_samples: int = 0  # samples with t inside [first measured t_send, last measured t_end]
    server_running_max: float | None = None
    server_running_mean: float | None = None
    server_queued_max: float | None = None
    server_queued_mean: float | None = None
    # the level judged against the run's SLO (--slo; specload.core.slo): None without one
    slo: LevelSlo | None = None
    # Rate levels (open loop): the planned requests/s, the rate the sends really had, how many went
    # late (more than LATE_S after they were due) and how late; dists also get "ttft_sched" and
    # "e2e_sched", the latencies counted from the due time (no coordinated omission).
    rate: float | None = None
    send_rate: float | None = None  # (sent - 1) / (last t_send - first t_send)
    late: int = 0
    lag_p99_ms: float | None = None
    lag_max_ms: float | None = None
    late_note: str | None = None
    # The workload (specload.analysis.mixstats, filled by level_stats): the share of prompt tokens the
    # server's prefix cache served, where that figure came from, and the lengths, classes and turns.
    prefix_cache_hit_rate: float | None = None
    prefix_cache_source: str | None = None  # "records" | "server_counters" | "server_gauge"
    mix: MixStats | None = None

    @property
    def x(self) -> float:
        """The level's value on a report's x axis: its rate, or its concurrency."""
        return self.rate if self.rate is not None else self.concurrency


def level_json(s: LevelStats) -> dict[str, Any]:
    """A level's figures for JSON: every field unrounded, the distributions keyed p50, p99.9, ..."""
    d = asdict(s)
    d["dists"] = {name: dist.to_dict() for name, dist in s.dists.items()}
    d["slo"] = s.slo.to_json() if s.slo is not None else None
    return d


@dataclass
class RepeatedLevelStats:
    """One concurrency across its repeats (--repeat): the figures a report and a comparison show
    for it, and the per-repeat values that the spread and confidence intervals are built on.

    Figures are means over the repeats that have a value, except the server gauges, which are the
    max over repeats (how far the server's queue went, not how far it went on average).
    """

    concurrency: int
    repeats: list[int]  # repeat index of each row; [] when the run has no row at this concurrency
    n: int  # repeats that produced an agg value (levels with no records have none)
    agg_tok_s_mean: float | None
    agg_tok_s_std: float | None  # sample std-dev (n - 1); None when fewer than 2 values
    per_req_tok_s_mean: float | None
    per_req_tok_s_std: float | None
    levels: list[LevelStats]
    agg_tok_s_values: list[float] = field(default_factory=list)  # per repeat, those with a value
    per_req_tok_s_values: list[float] = field(default_factory=list)
    ttft_p50_ms_mean: float | None = None
    ttft_p99_ms_mean: float | None = None
    tpot_p50_ms_mean: float | None = None
    itl_p99_ms_mean: float | None = None
    req_s_mean: float | None = None
    steady_tok_s_mean: float | None = None
    accept_length_mean: float | None = None
    server_running_max: float | None = None
    server_queued_max: float | None = None
    rate: float | None = None  # a rate level's requests/s (then ``concurrency`` is its user pool)

    @property
    def x(self) -> float:
        """The level's value on the x axis: its rate, or its concurrency."""
        return self.rate if self.rate is not None else self.concurrency

    @property
    def measured(self) -> bool:
        """Some repeat has measured requests."""
        return any(s.sent > 0 for s in self.levels)


def _num(v: Any) -> float | None:
    """A JSON number as float; None for null, booleans, strings and non-finite values."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


@dataclass(frozen=True, slots=True)
class ServerSample:
    """One line of server_samples.jsonl: the server's gauges and counters at wall-clock time ``t``.

    ``running``/``queued`` are gauges (requests being decoded / waiting in the server's queue);
    ``spec_*`` are vLLM's cumulative speculative-decoding counters (None on servers without them).
    """

    t: float
    running: float | None = None
    queued: float | None = None
    spec_num_drafts: float | None = None
    spec_num_draft_tokens: float | None = None
    spec_num_accepted_tokens: float | None = None
    prefix_cache_queries: float | None = None  # vLLM's cumulative prompt tokens looked up in its prefix cache
    prefix_cache_hits: float | None = None  # ... and served from it
    cache_hit_rate: float | None = None  # SGLang's gauge: the hit share of its last prefill batch

    @classmethod
    def from_dict(cls, d: Any) -> ServerSample | None:
        """None when ``d`` is not an object with a numeric ``t``; unknown keys are ignored."""
        if not isinstance(d, Mapping):
            return None
        t = _num(d.get("t"))
        if t is None:
            return None
        return cls(
            t=t,
            running=_num(d.get("running")),
            queued=_num(d.get("queued")),
            spec_num_drafts=_num(d.get("spec_num_drafts")),
            spec_num_draft_tokens=_num(d.get("spec_num_draft_tokens")),
            spec_num_accepted_tokens=_num(d.get("spec_num_accepted_tokens")),
            prefix_cache_queries=_num(d.get("prefix_cache_queries")),
            prefix_cache_hits=_num(d.get("prefix_cache_hits")),
            cache_hit_rate=_num(d.get("cache_hit_rate")),
        )


def accept_length_from_records(records: Iterable[RequestRecord]) -> tuple[float | None, int]:
    """(accept length, requests used) from SGLang's per-request ``spec_verify_ct``.

    Over OK records with ``spec_verify_ct > 0``: sum(output_tokens) / sum(spec_verify_ct), i.e. the
    mean of each request's completion_tokens / spec_verify_ct weighted by its verify steps.
    """
    used = [r for r in records if r.status == OK and r.spec_verify_ct is not None and r.spec_verify_ct > 0]
    if not used:
        return None, 0
    verify = sum(r.spec_verify_ct or 0 for r in used)
    return sum(r.output_tokens for r in used) / verify, len(used)


def accept_length_from_counters(samples: Sequence[ServerSample], start: float, end: float) -> float | None:
    """1 + Δaccepted / Δdrafts of vLLM's cumulative counters over [start, end]; None if not measurable.

    The deltas run from the last sample at or before ``start`` (or, when sampling began later, the
    first sample inside the window) to the last sample at or before ``end``. None when the counters
    are absent, the two samples are the same, or Δdrafts <= 0 (no drafts, or a counter reset).
    """
    usable = sorted(
        (s for s in samples if s.spec_num_drafts is not None and s.spec_num_accepted_tokens is not None),
        key=lambda s: s.t,
    )
    ends = window_ends(usable, start, end)
    if ends is None:
        return None
    first, last = ends
    drafts = (last.spec_num_drafts or 0.0) - (first.spec_num_drafts or 0.0)
    if drafts <= 0:
        return None
    accepted = (last.spec_num_accepted_tokens or 0.0) - (first.spec_num_accepted_tokens or 0.0)
    return 1.0 + accepted / drafts


def _max_mean(values: list[float]) -> tuple[float | None, float | None]:
    return _max(values), mean(values)


def _fill_server(s: LevelStats, samples: Sequence[ServerSample], start: float, end: float) -> None:
    inside = [x for x in samples if start <= x.t <= end]
    s.server_samples = len(inside)
    running = [x.running for x in inside if x.running is not None]
    queued = [x.queued for x in inside if x.queued is not None]
    s.server_running_max, s.server_running_mean = _max_mean(running)
    s.server_queued_max, s.server_queued_mean = _max_mean(queued)
    if s.accept_length is None:
        s.accept_length = accept_length_from_counters(samples, start, end)
        if s.accept_length is not None:
            s.accept_length_source = ACCEPT_FROM_COUNTERS


def _belongs(r: RequestRecord, concurrency: int, repeat: int, index: int | None) -> bool:
    if r.concurrency != concurrency or r.repeat != repeat:
        return False
    return index is None or r.level == index


def _mode(counts: Counter[Any]) -> Any:
    """The most common value (the first seen among equals), None when there is none."""
    return counts.most_common(1)[0][0] if counts else None


def _timeline(records: Sequence[RequestRecord] | Timeline) -> Timeline:
    return records if isinstance(records, Timeline) else Timeline.of(records)


def _window_tokens(tl: Timeline, a: float, b: float) -> list[float]:
    """Tokens each request produced inside [a, b], in file order, assuming a linear stream.

    The first token(s) arrive at t_first (``t0``) and the rest evenly over (t_first, t_last];
    nothing arrives between the last token and the end of the stream. (One loop with the builtins'
    min/max written out: ``max(a, t0)`` is t0 only when t0 > a, and so on.)
    """
    out: list[float] = []
    append = out.append
    for t0, t1, n, k in zip(tl.t0, tl.t1, tl.tokens, tl.k, strict=True):
        if n <= 0:
            append(0.0)
            continue
        inside = a <= t0 <= b
        span = t1 - t0
        if span <= 0 or n == k:
            append(n * (1.0 if inside else 0.0))
            continue
        overlap = (t1 if t1 < b else b) - (t0 if t0 > a else a)  # min(b, t1) - max(a, t0)
        append((k if inside else 0.0) + (n - k) * (overlap if overlap > 0.0 else 0.0) / span)
    return out


def _steady_window_events(tl: Timeline, d: int, max_dip_s: float) -> tuple[float, float] | None:
    """The steady window by walking every send, first token and end in time order (the
    definition; ``_steady_window`` gets the same answer from sorted arrays)."""
    has = tl.has_first
    events = sorted(
        [(t, 0, 1, 0) for t in tl.t_send]
        + [(t, 1, 0, 1) for t in compress(tl.t0, has)]
        + [(t, 2, -1, -1 if f else 0) for t, f in zip(tl.t_end, has, strict=True)]
    )
    n_flight = decoding = 0
    start: float | None = None
    below_since: float | None = None
    for t, _, d_flight, d_decoding in events:
        n_flight += d_flight
        decoding += d_decoding
        if start is None:
            if decoding >= d:
                start = t
            continue
        if n_flight < d:
            if below_since is None:
                below_since = t
        elif below_since is not None:
            if t - below_since > max_dip_s:
                return start, below_since
            below_since = None
    if start is None or below_since is None or below_since <= start:
        return None
    return start, below_since


class Flight:
    """The sorted sends and ends of a level's requests and how many were in flight after each, from
    one stable merge of the two (at equal times a send comes first): what the peak in flight and
    the steady window walk, made once for both (a bisection per send and per end costs ~1 µs on a
    million requests, the merge a fraction of that).

    ``after_send()``: after the j-th send, j + 1 - (ends strictly before it); ``after_end()``: after
    the i-th end, (sends up to it) - (i + 1). Only which places of the merge are sends is kept (a
    byte each: the merge's permutation, as ints, would be ~36 bytes a request)."""

    __slots__ = ("sends", "ends", "_is_send", "_tied")

    def __init__(self, sends: list[float], ends: list[float]) -> None:
        self.sends, self.ends = sends, ends
        both = [*sends, *ends]
        order = sorted(range(len(both)), key=both.__getitem__)  # stable: sends first at equal times
        ordered = list(map(both.__getitem__, order))
        self._tied = set(
            compress(ordered, map(eq, ordered, islice(ordered, 1, None)))
        )  # times seen twice: rare
        del ordered, both
        self._is_send = bytes(map(gt, repeat(len(sends)), order))

    @classmethod
    def of(cls, tl: Timeline) -> Flight:
        return cls(sorted(tl.t_send), sorted(tl.t_end))

    def after_send(self) -> Iterator[int]:
        # the j-th send at place p of the merge: j + 1 sends and p - j ends are done
        return map(sub, count(1, 2), compress(count(), self._is_send))

    def after_end(self) -> Iterator[int]:
        # the i-th end at place p: p - i sends and i + 1 ends are done
        return map(sub, compress(count(), map(not_, self._is_send)), count(1, 2))

    def peak(self) -> int:
        """The most requests in flight at once, an end before a send at the same instant (a hand-off
        is no overlap): ``after_send``, less for a send the ends at its very instant."""
        if not self.sends:
            return 0
        if not self._tied:
            return max(0, max(self.after_send()))
        after = list(self.after_send())
        sends, ends = self.sends, self.ends
        for t in self._tied:
            at_t = bisect_right(ends, t) - bisect_left(ends, t)
            for j in range(bisect_left(sends, t), bisect_right(sends, t)):
                after[j] -= at_t
        return max(0, max(after))


def _steady_window(tl: Timeline, d: int, max_dip_s: float, fl: Flight) -> tuple[float, float] | None:
    """``_steady_window_events`` from the sorted sends and ends, without a list of events.

    At equal times a send comes before a first token before an end. The window opens at the first
    first-token event after which ``d`` requests are decoding: the j-th first token (sorted) has
    j + 1 - (ends of decoding requests before it) decoding. From there on, the requests in flight
    cross below d only at an end (``Flight.after_end`` is d - 1) and back at a send (``after_send``
    is d); the window closes at the first crossing below whose way back takes longer than
    ``max_dip_s``, or at the last one when there is no way back.
    """
    has = tl.has_first
    sends, ends = fl.sends, fl.ends
    if has.count(0):
        firsts = sorted(compress(tl.t0, has))
        ends_decoding = sorted(compress(tl.t_end, has))
    else:  # every request had a first token
        firsts, ends_decoding = sorted(tl.t0), ends
    decoding = map(sub, count(1), map(partial(bisect_left, ends_decoding), firsts))
    start = next(compress(firsts, map(ge, decoding, repeat(d))), None)
    del firsts, ends_decoding
    if start is None:
        return None
    if bisect_right(sends, start) - bisect_left(ends, start) < d:  # a first token before its send
        return _steady_window_events(tl, d, max_dip_s)
    down = list(compress(ends, map(eq, fl.after_end(), repeat(d - 1))))
    up = list(compress(sends, map(eq, fl.after_send(), repeat(d))))
    i0, j0 = bisect_left(down, start), bisect_right(up, start)  # the crossings after the window opened
    gaps = map(sub, islice(up, j0, None), islice(down, i0, None))
    long_dip = next(compress(count(), map(gt, gaps, repeat(max_dip_s))), None)
    if long_dip is not None:
        return start, down[i0 + long_dip]
    below_since = down[i0 + len(up) - j0] if len(down) - i0 > len(up) - j0 else None
    if below_since is None or below_since <= start:
        return None
    return start, below_since


def steady_window(
    records: Sequence[RequestRecord] | Timeline,
    concurrency: int,
    max_dip_s: float = STEADY_MAX_DIP_S,
    cap: int | None = None,
    *,
    flight: Flight | None = None,
) -> tuple[float, float] | None:
    """The span during which the server was saturated with this level's load, or None.

    D = min(C, cap) requests can run at once (``cap``: the server's running-request limit, when
    known). The window opens when the D-th request has its first token (the synchronized prefill
    burst is over: D requests are decoding) and closes when fewer than D requests are left in flight
    and that lasts over ``max_dip_s`` (a closed-loop user's hand-off from one request to its next
    is no drop). With C above the cap the client keeps C in flight while the server runs ``cap``
    and queues the rest, so the server stays saturated until fewer than ``cap`` are left.
    ``flight``: the level's Flight, when the caller has it.
    """
    tl = _timeline(records)
    d = min(concurrency, cap) if cap else concurrency
    if d <= 0 or len(tl) < d:
        return None
    return _steady_window(tl, d, max_dip_s, flight if flight is not None else Flight.of(tl))


def steady_tok_s(
    records: Sequence[RequestRecord] | Timeline,
    concurrency: int,
    max_dip_s: float = STEADY_MAX_DIP_S,
    min_window_s: float = STEADY_MIN_WINDOW_S,
    cap: int | None = None,
    *,
    flight: Flight | None = None,
) -> tuple[float | None, float | None]:
    """(tokens/s inside the steady window, window length): the rate the server sustains while
    saturated, without the prefill burst at the start and the drain at the end."""
    tl = _timeline(records)
    window = steady_window(tl, concurrency, max_dip_s, cap, flight=flight)
    if window is None:
        return None, None
    a, b = window
    length = b - a
    if length < min_window_s:
        return None, length
    return sum(_window_tokens(tl, a, b)) / length, length


def peak_in_flight(records: Sequence[RequestRecord] | Timeline, *, flight: Flight | None = None) -> int:
    """The most requests in flight at once; an end before a send at the same instant (a hand-off
    is no overlap): after the j-th send (sorted), j + 1 - (ends at or before it) are in flight."""
    return (flight if flight is not None else Flight.of(_timeline(records))).peak()


def tok_s_series(
    records: Sequence[RequestRecord] | Timeline,
    bucket_s: float = SERIES_BUCKET_S,
    *,
    span: tuple[float, float] | None = None,
) -> list[float]:
    """Output tokens per second in consecutive buckets from the level's first send (the last,
    partial bucket is divided by its own length), each request's tokens spread as in the steady
    window (its first event's at t_first, the rest evenly up to t_last; a bucket's ends both count).

    One pass over the requests: a request adds its first tokens to the bucket of t_first, its rate
    to the buckets it spans (partial ones directly, whole ones through a running sum), so the cost
    is the requests plus the buckets, not their product. The sums run in another order than a
    bucket-by-bucket sum over the requests would: equal up to float rounding (~1e-12 relative).
    (The builtins' min/max and the bucket clamp are written out in the loop: same values, fewer calls.)
    ``span``: the level's first send and last end, when the caller has them.
    """
    tl = _timeline(records)
    if not len(tl):
        return []
    t_lo, t_hi = span if span is not None else (min(tl.t_send), max(tl.t_end))
    # bucket i is [edges[i], ends_[i]]: t_lo + i * bucket_s to min(t_hi, t_lo + (i + 1) * bucket_s),
    # up to the first that would be empty
    most = max(1, math.ceil((t_hi - t_lo) / bucket_s))
    edges = list(map(add, repeat(t_lo), map(mul, range(most), repeat(bucket_s))))
    ends_ = list(
        map(min, repeat(t_hi), map(add, repeat(t_lo), map(mul, range(1, most + 1), repeat(bucket_s))))
    )
    nb = next(compress(count(), map(le, ends_, edges)), most)
    if not nb:
        return []
    del edges[nb:], ends_[nb:]
    last = nb - 1
    tokens = [0.0] * nb  # first-event tokens and partial buckets
    rate_diff = [0.0] * (nb + 1)  # rate of the requests covering whole buckets, as differences
    for t0, t1, n, k in zip(tl.t0, tl.t1, tl.tokens, tl.k, strict=True):
        if n <= 0:
            continue
        span = t1 - t0
        spread = span > 0 and n != k  # else all n tokens count at t0
        mass = k if spread else n
        iu = 0  # the bucket of max(t0, t_lo): t0's when t0 is inside, the first when it is before
        if t_lo <= t0 <= t_hi:
            i = int((t0 - t_lo) // bucket_s)
            iu = i = last if i > last else (0 if i < 0 else i)
            tokens[i] += mass
            if i and t0 == edges[i]:  # on a boundary: in both buckets, as [a, b] intervals are
                tokens[i - 1] += mass
        if not spread:
            continue
        rate = (n - k) / span
        u = t0 if t0 >= t_lo else t_lo  # max(t0, t_lo)
        v = t1 if t1 <= t_hi else t_hi  # min(t1, t_hi)
        if v <= u:  # (so t0 <= t_hi, and iu is u's bucket)
            continue
        iv = int((v - t_lo) // bucket_s)
        iv = last if iv > last else (0 if iv < 0 else iv)
        if iu == iv:
            tokens[iu] += rate * (v - u)
            continue
        tokens[iu] += rate * (ends_[iu] - u)
        tokens[iv] += rate * (v - edges[iv])
        rate_diff[iu + 1] += rate
        rate_diff[iv] -= rate
    running = accumulate(rate_diff[:nb], initial=0.0)  # 0.0 + d0, then + d1, ...
    next(running)
    widths = list(map(sub, ends_, edges))
    return list(map(truediv, map(add, tokens, map(mul, running, widths)), widths))


def _token_note(fallback: int, ok: int) -> str | None:
    if not fallback:
        return None
    return (
        f"{fallback} of {ok} OK requests counted output tokens from stream chunks (the server sent no "
        "token count); a chunk can carry several tokens (e.g. speculative decoding)"
    )


def _fill_outcomes(s: LevelStats, c: LevelColumns) -> None:
    s.sent = c.sent
    s.ok, s.short, s.failed, s.rate_limited = c.ok, c.short, c.failed, c.rate_limited
    s.output_tokens = c.output_tokens
    s.token_sources = dict(c.token_sources)
    s.output_mismatch = c.output_mismatch
    s.prompt_mismatch = c.prompt_mismatch
    s.requested_output_tokens = _mode(c.requested_output)
    s.requested_prompt_tokens = _mode(c.requested_prompt)
    s.reasons = dict(c.reasons)


def _fill_throughput(
    s: LevelStats, c: LevelColumns, start: float, end: float, cap: int | None = None
) -> None:
    tl = c.timeline
    wall = end - start
    s.wall_s = wall
    if wall > 0:
        s.agg_tok_s = s.output_tokens / wall
        s.mean_concurrency = sum(tl.e2e) / wall
        s.req_s = s.ok / wall
        s.input_tok_s = c.input_tokens / wall
        s.total_tok_s = s.input_tok_s + s.agg_tok_s
    fl = Flight.of(tl)
    sends = fl.sends
    s.peak_in_flight = fl.peak()
    if s.rate is None:  # an open loop has no saturated closed-loop window to measure
        s.steady_tok_s, s.steady_window_s = steady_tok_s(tl, s.concurrency, cap=cap, flight=fl)
    elif len(sends) > 1 and sends[-1] > sends[0]:
        s.send_rate = (len(sends) - 1) / (sends[-1] - sends[0])


# Below this many values a distribution's percentiles come from a full sort; above, from ``ranked``.
RANKED_FROM = 20_000
_SAMPLE = 16384  # values drawn (evenly spaced) to place the brackets around the wanted ranks


class Ranked:
    """Some order statistics of n values: ``self[i]`` is what ``sorted(values)[i]`` would be, for
    the places asked for (``percentile_sorted`` takes it as it takes the sorted list)."""

    __slots__ = ("n", "at")

    def __init__(self, n: int, at: dict[int, float]) -> None:
        self.n, self.at = n, at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> float:
        return self.at[i]


def _places(n: int, qs: Iterable[float]) -> list[int]:
    """The sorted places ``percentile_sorted`` reads for each q of n values."""
    out: set[int] = set()
    for q in qs:
        lo = math.floor((n - 1) * q / 100.0)
        out.update((lo, min(lo + 1, n - 1)))
    return sorted(out)


def ranked(xs: Sequence[float], qs: Iterable[float]) -> Ranked | None:
    """The values at the sorted places the percentiles ``qs`` need, without sorting all of them,
    or None (then sort): brackets around each place are set from an evenly spaced sample, one pass
    sorts every value into below/inside/above them (a bisection over the brackets' ends), and only
    the values inside are sorted. A place its bracket missed (an odd sample, many equal values)
    gives None. Values must be finite numbers (the caller checks their sum)."""
    n = len(xs)
    places = _places(n, qs)
    sample = sorted(islice(xs, 0, None, max(1, n // _SAMPLE)))
    k = len(sample)
    spans: list[list[int]] = []  # places of the sample around each place, merged where they overlap
    for i in places:
        at = i * k // n
        margin = 8 + 5 * math.isqrt(max(1, at * (k - at) // k))  # 5 sd of a sample rank, and some
        lo, hi = max(0, at - margin), min(k - 1, at + margin)
        if spans and lo <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], hi)
        else:
            spans.append([lo, hi])
    ends: list[float] = []  # bracket j is [ends[2j], ends[2j + 1]), its values code 2j + 1
    for lo, hi in spans:
        a, b = sample[lo], math.nextafter(sample[hi], math.inf)
        if ends and a <= ends[-1]:
            ends[-1] = b
        else:
            ends += (a, b)
    codes = list(map(bisect_right, repeat(ends), xs))
    inside = sorted(compress(xs, map(and_, codes, repeat(1))))
    counts = Counter(codes)
    at: dict[int, float] = {}
    below = offset = 0  # values below bracket j, values in the brackets before it
    for j in range(len(ends) // 2):
        below += counts[2 * j]
        size = counts[2 * j + 1]
        for i in places:
            if below <= i < below + size:
                at[i] = inside[offset + i - below]
        below += size
        offset += size
    return Ranked(n, at) if len(at) == len(places) else None


def _placed(xs: Sequence[float], total: float) -> Sequence[float]:
    """What ``percentile_sorted`` reads the wanted percentiles (``PERCENTILES``, 50, 99) of ``xs``
    from (``total``: their sum): their places (``ranked``) when there are many, else the sorted list."""
    if len(xs) >= RANKED_FROM and math.isfinite(total):  # no nan or inf, which have no place in an order
        places = ranked(xs, (*PERCENTILES, 50.0, 99.0))
        if places is not None:
            return places
    return sorted(xs)


def _sorted_dist(xs: Sequence[float]) -> tuple[Dist, Sequence[float]]:
    """The Dist of ``xs`` and the values (or the places of them) its percentiles and p50/p99 read."""
    if not xs:
        return Dist(), []
    values = xs.tolist() if isinstance(xs, array) else xs  # floats made once for the passes below
    total = sum(xs)
    placed = _placed(values, total)
    n = len(xs)
    dist = Dist(
        n,
        total / n,
        stdev(values, placed if isinstance(placed, list) else None) if n > 1 else None,
        {q: percentile_sorted(placed, q) or 0.0 for q in PERCENTILES},
    )
    return dist, placed


def _fill_latency(s: LevelStats, c: LevelColumns) -> None:
    s.per_req_tok_s = sum(c.per_req) / len(c.per_req) if c.per_req else None
    dists: dict[str, Dist] = {}
    for name, xs in (("ttft", c.ttft), ("tpot", c.tpot), ("e2e", c.e2e_ok)):
        dists[name], ordered = _sorted_dist(xs)
        p50, p99 = percentile_sorted(ordered, 50), percentile_sorted(ordered, 99)
        del ordered
        if name == "ttft":
            s.ttft_p50_ms, s.ttft_p99_ms = _ms(p50), _ms(p99)
        elif name == "tpot":
            s.tpot_p50_ms, s.tpot_p99_ms = _ms(p50), _ms(p99)
        else:
            s.e2e_p50_s, s.e2e_p99_s = p50, p99
    s.decode_tok_s_mean = sum(c.decode) / len(c.decode) if c.decode else None
    s.dists = {"ttft": dists["ttft"], "tpot": dists["tpot"], "e2e": dists["e2e"], "itl": dist_of_hist(c.itl)}
    units = set(c.itl_units)
    s.itl_unit = units.pop() if len(units) == 1 else ("mixed" if units else None)
    s.prompt_tokens_mean = c.prompt_sum / c.prompt_n if c.prompt_n else None
    s.chunk_fallback_ok = c.chunk_fallback_ok
    s.token_note = _token_note(c.chunk_fallback_ok, c.ok)
    if c.verify_n:
        s.accept_length, s.accept_length_requests = c.verify_tokens / c.verify_sum, c.verify_n
        s.accept_length_source = ACCEPT_FROM_RECORDS
    if c.lag:
        _fill_schedule(s, c)


def _fill_schedule(s: LevelStats, c: LevelColumns) -> None:
    """Rate levels: how far the sends kept to their schedule, and latencies from the due time."""
    lags = c.lag.tolist()
    s.late = sum(map(gt, lags, repeat(LATE_S)))
    s.lag_p99_ms, s.lag_max_ms = _ms(percentile_sorted(_placed(lags, sum(lags)), 99)), max(lags) * 1e3
    s.dists["ttft_sched"] = _sorted_dist(c.ttft_sched)[0]
    s.dists["e2e_sched"] = _sorted_dist(c.e2e_sched)[0]
    # late_note needs the peak in flight (another part): _finish adds it.


def late_note(late: int, n: int, p99_ms: float, peak: int | None, pool: int) -> str | None:
    """Why a rate level's requests went late, and what to read instead; None when they kept time.

    A request goes late when no user was free (the in-flight cap was reached: the server was too
    slow for the rate) or when the client itself lagged (its event loop woke late). Either way its
    latency from the send hides the wait, as a closed-loop tool's would (coordinated omission).
    """
    if late == 0 or n == 0:
        return None
    share = late / n
    if share < 0.01 and p99_ms <= LATE_S * 1e3:
        return None
    why = (
        f"all {pool} users were busy (the cap on requests in flight, --max-in-flight): the server did not keep up "
        "with the rate"
        if peak is not None and peak >= pool
        else "the client sent them late (its event loop lagged: see the Client column)"
    )
    return (
        f"{late} of {n} requests ({share:.0%}) were sent more than {LATE_S * 1e3:g} ms after they were due "
        f"(p99 {p99_ms:.0f} ms late): {why}; read the latencies counted from the schedule (TTFT and E2E from schedule)"
    )


# A level's heavy figures come in three parts, each from the level's columns alone (and the cap of
# the steady window), so that two processes can share a run's parts (specload.analysis.run with
# ``processes=2``). The weights: each part's cost per measured request, relative, to balance them.
PARTS = {"steady": 2.6, "series": 1.7, "latency": 2.5}
_PART_FIELDS = {
    "steady": (
        "wall_s",
        "agg_tok_s",
        "mean_concurrency",
        "req_s",
        "input_tok_s",
        "total_tok_s",
        "peak_in_flight",
        "steady_tok_s",
        "steady_window_s",
        "send_rate",
    ),
    "series": ("tok_s_series",),
    "latency": (
        "per_req_tok_s",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "tpot_p50_ms",
        "tpot_p99_ms",
        "e2e_p50_s",
        "e2e_p99_s",
        "decode_tok_s_mean",
        "dists",
        "itl_unit",
        "prompt_tokens_mean",
        "chunk_fallback_ok",
        "token_note",
        "accept_length",
        "accept_length_requests",
        "accept_length_source",
        "late",
        "lag_p99_ms",
        "lag_max_ms",
    ),
}
Job = tuple[int, str]  # (row, part)


@dataclass
class Row:
    """What one row of a run's table is computed from: its columns and its run.json level; ``cap``:
    what the steady window takes as the server's limit (set by ``summarize_rows``)."""

    columns: LevelColumns
    concurrency: int
    repeat: int
    index: int | None
    status: str | None = None
    planned: bool = True
    cap: int | None = None
    rate: float | None = None
    span: tuple[float, float] = (0.0, 0.0)  # the first send and the last end (set by ``_start``)


def level_part(row: Row, part: str) -> dict[str, Any]:
    """One of a row's ``PARTS``: its LevelStats fields ({} when the row has no requests)."""
    c = row.columns
    if not c.sent:
        return {}
    s = LevelStats(concurrency=row.concurrency, repeat=row.repeat, label="", rate=row.rate)
    if part == "steady":
        s.output_tokens, s.ok = c.output_tokens, c.ok  # what the throughput figures take of the outcomes
        _fill_throughput(s, c, *row.span, row.cap)
    elif part == "series":
        s.tok_s_series = tok_s_series(c.timeline, span=row.span)
    else:
        _fill_latency(s, c)
    return {name: getattr(s, name) for name in _PART_FIELDS[part]}


def jobs(rows: Sequence[Row]) -> list[tuple[Job, float]]:
    """Every part of every row that has requests, with its estimated cost."""
    return [
        ((i, part), weight * row.columns.sent)
        for i, row in enumerate(rows)
        if row.columns.sent
        for part, weight in PARTS.items()
    ]


def _start(row: Row, samples: Sequence[ServerSample] | None, cap: int | None) -> LevelStats:
    """A row's stats without its parts (and its ``cap``)."""
    c = row.columns
    s = LevelStats(
        concurrency=row.concurrency,
        repeat=row.repeat,
        label=level_label(row.concurrency, row.repeat, row.rate),
        index=row.index,
        status=row.status,
        warmup=c.warmup,
        planned=row.planned,
        rate=row.rate,
    )
    row.cap = cap
    if not c.sent:
        return s
    _fill_outcomes(s, c)
    row.span = (min(c.timeline.t_send), max(c.timeline.t_end))
    if samples:
        _fill_server(s, samples, *row.span)
    if s.server_running_max is not None and s.server_queued_max:
        # The server queued part of this level: it ran at most what its gauge peaked at.
        row.cap = min(cap or s.concurrency, int(s.server_running_max))
    return s


def _finish(
    s: LevelStats, row: Row, samples: Sequence[ServerSample] | None, parts: Sequence[dict[str, Any]]
) -> None:
    """Add a row's parts to its stats, then what depends on them."""
    for part in parts:
        for name, value in part.items():
            setattr(s, name, value)
    c = row.columns
    if not c.sent:
        return
    start, end = row.span
    if samples and s.accept_length is None:
        _fill_server(s, samples, start, end)
    if c.lag:
        s.late_note = late_note(s.late, len(c.lag), s.lag_p99_ms or 0.0, s.peak_in_flight, s.concurrency)
    s.mix = mix_stats(c, s.wall_s)
    s.prefix_cache_hit_rate, s.prefix_cache_source = prefix_cache_rate(c, samples or (), start, end)


def level_stats(
    c: LevelColumns,
    concurrency: int,
    repeat: int = 0,
    *,
    index: int | None = None,
    status: str | None = None,
    samples: Sequence[ServerSample] | None = None,
    cap: int | None = None,
    rate: float | None = None,
) -> LevelStats:
    """Stats of one level from its columns (``summarize_level`` for what the arguments mean)."""
    row = Row(c, concurrency, repeat, index, status, rate=rate)
    s = _start(row, samples, cap)
    _finish(s, row, samples, [level_part(row, part) for part in PARTS])
    return s


def summarize_level(
    records: Iterable[RequestRecord],
    concurrency: int,
    repeat: int = 0,
    *,
    index: int | None = None,
    status: str | None = None,
    samples: Sequence[ServerSample] | None = None,
    cap: int | None = None,
    rate: float | None = None,
) -> LevelStats:
    """Stats of one level from any set of records (those of other levels are filtered out).

    ``index`` narrows the match to one run.json level when the same (C, repeat) occurs twice;
    ``status`` is that level's status in run.json, copied as is. ``samples`` are the run's
    server samples (any order; those outside the level's measured window are ignored).
    """
    cols = LevelColumns.of(r for r in records if _belongs(r, concurrency, repeat, index))
    return level_stats(
        cols, concurrency, repeat, index=index, status=status, samples=samples, cap=cap, rate=rate
    )


def _claimed(r: RequestRecord, plan: Sequence[LevelMeta]) -> bool:
    return any(_belongs(r, lv.concurrency, lv.repeat, lv.index) for lv in plan)


def _plan(levels_meta: Sequence[LevelMeta | Mapping[str, Any]] | None) -> list[LevelMeta]:
    """run.json levels as LevelMeta; an entry that is not a level (no concurrency) is skipped."""
    out: list[LevelMeta] = []
    for m in levels_meta or []:
        lv = m if isinstance(m, LevelMeta) else LevelMeta.from_json(m)
        if lv is not None:
            out.append(lv)
    return out


def summarize_run(
    records: Sequence[RequestRecord],
    levels_meta: Sequence[LevelMeta | Mapping[str, Any]] | None,
    samples: Sequence[ServerSample] | None = None,
    cap: int | None = None,
) -> list[LevelStats]:
    """One row per run.json level (in sweep order, even without records), then any unplanned levels.

    ``levels_meta``: run.json ``levels``, typed (RunMeta.levels) or as parsed JSON objects.
    Rows for levels that run.json does not list are kept rather than dropped: records are the
    ground truth, and a missing or stale run.json must not hide measurements. ``samples`` (the
    run's server_samples.jsonl) add the server-side columns and, on vLLM, the accept length.
    """
    samples = sorted(samples or [], key=lambda x: x.t)
    plan = _plan(levels_meta)
    out = [
        summarize_level(
            records,
            lv.concurrency,
            lv.repeat,
            index=lv.index,
            status=lv.status,
            samples=samples,
            cap=cap,
            rate=lv.rate,
        )
        for lv in plan
    ]
    extra = sorted({(r.level, r.concurrency, r.repeat) for r in records if not _claimed(r, plan)})
    for idx, c, rep in extra:
        rate = next((r.rate for r in records if (r.level, r.concurrency, r.repeat) == (idx, c, rep)), None)
        s = summarize_level(records, c, rep, index=idx, samples=samples, cap=cap, rate=rate)
        s.planned = False
        out.append(s)
    return out


def summary_rows(
    groups: Mapping[GroupKey, LevelColumns], levels_meta: Sequence[LevelMeta | Mapping[str, Any]] | None
) -> list[Row]:
    """The rows of ``summarize_columns``: one per run.json level (in sweep order, even without
    records; a level without an index gets every group of its concurrency and repeat, one after
    the other), then one per group no level claims."""
    rows: list[Row] = []
    claimed: set[GroupKey] = set()
    for lv in _plan(levels_meta):
        if lv.index is None:
            keys = [k for k in groups if k[1] == lv.concurrency and k[2] == lv.repeat]
        else:
            key = (lv.index, lv.concurrency, lv.repeat)
            keys = [key] if key in groups else []
        claimed.update(keys)
        cols = groups[keys[0]] if len(keys) == 1 else LevelColumns.concat([groups[k] for k in keys])
        rows.append(Row(cols, lv.concurrency, lv.repeat, lv.index, lv.status, rate=lv.rate))
    for key in sorted(k for k in groups if k not in claimed):
        idx, c, rep = key
        rows.append(Row(groups[key], c, rep, idx, planned=False))
    return rows


def _here(rows: Sequence[Row]) -> Callable[[list[tuple[Job, float]]], dict[Job, dict[str, Any]]]:
    return lambda todo: {job: level_part(rows[job[0]], job[1]) for job, _ in todo}


def summarize_rows(
    rows: Sequence[Row],
    samples: Sequence[ServerSample] | None = None,
    cap: int | None = None,
    run_jobs: Callable[[list[tuple[Job, float]]], dict[Job, dict[str, Any]]] | None = None,
) -> list[LevelStats]:
    """The stats of each row. ``run_jobs``: computes the rows' parts (``jobs``: each is
    ``level_part(rows[i], part)``), e.g. sharing them with another process; by default here."""
    samples = sorted(samples or [], key=lambda x: x.t)
    out = [_start(row, samples, cap) for row in rows]
    todo = jobs(rows)
    done = (run_jobs or _here(rows))(todo)
    for i, (s, row) in enumerate(zip(out, rows, strict=True)):
        _finish(s, row, samples, [done[(i, part)] for part in PARTS if (i, part) in done])
    return out


def summarize_columns(
    groups: Mapping[GroupKey, LevelColumns],
    levels_meta: Sequence[LevelMeta | Mapping[str, Any]] | None,
    samples: Sequence[ServerSample] | None = None,
    cap: int | None = None,
) -> list[LevelStats]:
    """``summarize_run`` from columns per (level, concurrency, repeat) (``columns.read_columns``).

    The same rows with the same figures; a run.json level without an index that matches several
    groups gets them one after the other (not interleaved in file order, so its float sums can
    differ from summarize_run's in the last bits).
    """
    return summarize_rows(summary_rows(groups, levels_meta), samples, cap)


def _sample_std(xs: list[float]) -> float | None:
    return statistics.stdev(xs) if len(xs) >= 2 else None


def _itl_p99_ms(s: LevelStats) -> float | None:
    d = s.dists.get("itl")
    return None if d is None or not d.n else d.p.get(99.0, 0.0) * 1e3


def _combine(x: float, levels: Sequence[LevelStats], rate: bool = False) -> RepeatedLevelStats:
    """``x`` is the level's concurrency, or its requests/s when ``rate``."""
    agg = [s.agg_tok_s for s in levels if s.agg_tok_s is not None]
    per = [s.per_req_tok_s for s in levels if s.per_req_tok_s is not None]
    return RepeatedLevelStats(
        concurrency=levels[0].concurrency if rate and levels else int(x),
        rate=x if rate else None,
        repeats=[s.repeat for s in levels],
        n=len(agg),
        agg_tok_s_mean=mean(agg),
        agg_tok_s_std=_sample_std(agg),
        per_req_tok_s_mean=mean(per),
        per_req_tok_s_std=_sample_std(per),
        levels=list(levels),
        agg_tok_s_values=agg,
        per_req_tok_s_values=per,
        ttft_p50_ms_mean=mean(s.ttft_p50_ms for s in levels),
        ttft_p99_ms_mean=mean(s.ttft_p99_ms for s in levels),
        itl_p99_ms_mean=mean(_itl_p99_ms(s) for s in levels),
        req_s_mean=mean(s.req_s for s in levels),
        steady_tok_s_mean=mean(s.steady_tok_s for s in levels),
        tpot_p50_ms_mean=mean(s.tpot_p50_ms for s in levels),
        accept_length_mean=mean(s.accept_length for s in levels),
        server_running_max=_max(s.server_running_max for s in levels),
        server_queued_max=_max(s.server_queued_max for s in levels),
    )


def combine_repeats(levels: Sequence[LevelStats]) -> RepeatedLevelStats:
    """Mean and sample std-dev across repeats of one concurrency (levels without a value are skipped)."""
    if not levels:
        raise ValueError("combine_repeats needs at least one LevelStats")
    xs = {(s.rate is not None, s.x) for s in levels}
    if len(xs) != 1:
        raise ValueError(f"combine_repeats got several levels: {sorted(x for _, x in xs)}")
    return _combine(levels[0].x, levels, levels[0].rate is not None)


def repeats_at(levels: Sequence[LevelStats], x: float, rate: bool = False) -> RepeatedLevelStats:
    """Every repeat of level ``x`` (a concurrency, or a rate when ``rate``) among a run's ``levels``
    combined; a run without it gives an empty one (repeats [], every figure None), so runs line up
    level by level."""
    return _combine(x, [s for s in levels if s.x == x and (s.rate is not None) == rate], rate)


def group_repeats(levels: Sequence[LevelStats]) -> list[RepeatedLevelStats]:
    """combine_repeats for every level value, in first-seen order."""
    by_x: dict[tuple[bool, float], list[LevelStats]] = {}
    for s in levels:
        by_x.setdefault((s.rate is not None, s.x), []).append(s)
    return [combine_repeats(group) for group in by_x.values()]
