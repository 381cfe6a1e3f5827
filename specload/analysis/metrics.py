"""Per-level figures computed from a level's columns. Pure functions: no I/O, no clock, no Locust.

Every number the report prints is derived here, from ``records.jsonl`` alone, so that the same
records always give the same table (Locust's own statistics are bucketed and only cross-checked).
Each figure has one definition, over the numpy columns of ``columns.LevelColumns``, whoever reads
the records (the report, compare, the live web view). The definitions are written out for users
in ``docs/metrics.md``; keep the two in step.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from specload.analysis import figures
from specload.analysis.acceptance import Acceptance, acceptance
from specload.analysis.columns import GroupKey, LevelColumns, count_of, slo_tally
from specload.analysis.drift import DRIFT_SEGMENTS, Drift, drift_of
from specload.analysis.mixstats import (
    LengthSummary,
    answers_varied,
    lengths_of,
    parts_of,
    varied,
)
from specload.analysis.reasoning import ReasoningStats, reasoning_stats
from specload.core import histogram, stats
from specload.core.records import FAILED, OK, SHORT, SRC_CHUNKS, RequestRecord, level_label
from specload.core.rundir import LevelMeta
from specload.core.slo import LevelSlo, Slo

Floats = npt.NDArray[np.float64]

# A closed-loop user hands its slot from a finished request to its next one in (milli)seconds; a
# dip below C shorter than this is that hand-off, not the end of the steady state.
STEADY_MAX_DIP_S = 0.5
# A steady-state window shorter than this is too short to be a rate worth printing.
STEADY_MIN_WINDOW_S = 1.0
# The percentiles every latency distribution carries (the report shows a chosen subset).
PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
# Rate levels: a request sent more than this long after it was due was late (it waited for a
# free user, or for the client's own event loop). Below it is ordinary scheduling jitter.
LATE_S = 0.010
SERIES_BUCKET_S = 1.0  # tok/s over time: one value per this many seconds of the level
SERIES_STREAMED = "streamed"  # LevelStats.tok_s_series_source: from the streamed-token samples
SERIES_RECORDS = "records"  # from the records, each request's tokens spread evenly


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


def dist_of_hist(hist: histogram.Hist) -> Dist:
    n = histogram.count(hist)
    if n == 0:
        return Dist(exact=False)
    m, sd = histogram.mean_std(hist)
    return Dist(n, m, sd, {q: histogram.quantile(hist, q) or 0.0 for q in PERCENTILES}, exact=False)


def mean(values: Iterable[float | None]) -> float | None:
    """Mean of the values that exist; None when none does (a figure that is undefined stays so)."""
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def dist_of(xs: Floats) -> Dist:
    """A latency's Dist over the values (seconds; no nan among them)."""
    n = len(xs)
    if not n:
        return Dist()
    return Dist(
        n,
        float(xs.mean()),
        float(xs.std(ddof=1)) if n > 1 else None,
        {q: p or 0.0 for q, p in zip(PERCENTILES, stats.percentiles(xs, PERCENTILES), strict=True)},
    )


def _mean_of(xs: Floats) -> float | None:
    return float(xs.mean()) if len(xs) else None


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


@dataclass
class GroupStats:
    """One part of a level (a request class, a conversation turn, a prompt category): its share of
    the level's requests and its figures, summarized by the level's own code (``summarize``)."""

    key: Any  # the class's or category's name, or the turn index
    share: float | None  # its requests / the level's measured requests
    stats: LevelStats


@dataclass
class MixStats:
    """A level's workload as sent: its lengths, and its parts (empty when there are none)."""

    lengths: dict[str, LengthSummary] = field(default_factory=dict)
    varied: bool = False  # some length asked for was not the same for every request
    answers_varied: bool = False  # ok answers of different lengths (natural lengths: the model ended them)
    classes: list[GroupStats] = field(default_factory=list)
    turns: list[GroupStats] = field(default_factory=list)
    categories: list[GroupStats] = field(default_factory=list)  # a categorised dataset's row categories


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
    per_req_tok_s: float | None = None  # mean over OK of the records' per_request_tok_s
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
    drift: Drift | None = None  # the steady window's second half against its first (specload.analysis.drift)
    mean_concurrency: float | None = None  # sum(e2e) / wall_s
    peak_in_flight: int | None = None  # most measured requests in flight at once (client side)
    req_s: float | None = None  # OK requests / wall_s
    input_tok_s: float | None = None  # prompt tokens of all measured requests / wall_s
    total_tok_s: float | None = None  # input_tok_s + agg_tok_s
    tok_s_series: list[float] = field(
        default_factory=list
    )  # output tok/s per SERIES_BUCKET_S from the first send
    # where tok_s_series came from: SERIES_STREAMED (the client's streamed-token samples, streamed.jsonl)
    # or SERIES_RECORDS (each request's tokens spread evenly over its stream; runs without those samples)
    tok_s_series_source: str | None = None
    series_t0: float | None = None  # the level's first measured send (wall clock): where the series starts
    # Latency distributions over OK requests (seconds): ttft, tpot, itl, e2e.
    dists: dict[str, Dist] = field(default_factory=dict)
    itl_unit: str | None = None  # "token" | "event" | "mixed": what an ITL gap is between
    reasons: dict[str, int] = field(default_factory=dict)  # "failed: <reason>" / "short: <reason>"
    acceptance: Acceptance | None = None  # every acceptance figure (specload.analysis.acceptance)
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
    # The workload (specload.analysis.mixstats, filled by summarize): the lengths, classes and turns.
    mix: MixStats | None = None
    reasoning: ReasoningStats | None = None  # reasoning streams (specload.analysis.reasoning); None: none
    # the figure table's computed figures (analysis.figures, Figure.compute), by JSON field, and
    # where those that said so came from (figures.Sourced)
    extra: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def x(self) -> float:
        """The level's value on a report's x axis: its rate, or its concurrency."""
        return self.rate if self.rate is not None else self.concurrency

    def p(self, name: str, q: float, scale: float = 1.0) -> float | None:
        """The q-th percentile of the ``dists`` latency ``name``, times ``scale``; None without one."""
        d = self.dists.get(name)
        v = d.p.get(q) if d is not None and d.n else None
        return None if v is None else v * scale

    def figure(self, key: str) -> Any:
        """A figure of the table (analysis.figures) by its key, as the table reads it from here."""
        return figures.BY_KEY[key].value(self)


def level_json(s: LevelStats) -> dict[str, Any]:
    """A level's figures for JSON: every field unrounded, the distributions keyed p50, p99.9, ..."""
    d = asdict(s)
    d.update(figures.figures_json(s))  # every figure of the table (analysis.figures)
    a = s.acceptance
    d["accept_length_source"] = a.sources.get("length") if a is not None else None
    d["accept_length_requests"] = a.requests if a is not None else 0
    d["dists"] = {name: dist.to_dict() for name, dist in s.dists.items()}
    if s.mix is not None:  # each part as a level
        for kind in ("classes", "turns", "categories"):
            d["mix"][kind] = [
                {"key": g.key, "share": g.share, **level_json(g.stats)} for g in getattr(s.mix, kind)
            ]
    d["slo"] = s.slo.to_json() if s.slo is not None else None
    return d


@dataclass
class RepeatedLevelStats:
    """One concurrency across its repeats (--repeat): the figures a report and a comparison show
    for it, and the per-repeat values that the spread and confidence intervals are built on.

    Figures are combined by the figure table's rule (analysis.figures): means over the repeats that
    have a value, the server gauges' max (how far the server's queue went, not how far it went on
    average), the counts' sum.
    """

    concurrency: int
    repeats: list[int]  # repeat index of each row; [] when the run has no row at this concurrency
    levels: list[LevelStats]
    # every numeric figure of the figure table by JSON field, its repeats combined (figures.combine)
    combined: dict[str, float | None] = field(default_factory=dict)
    rate: float | None = None  # a rate level's requests/s (then ``concurrency`` is its user pool)

    def of(self, name: str) -> float | None:
        """A figure of the table (its JSON field) over the repeats; None where none has it."""
        return self.combined.get(name)

    def values(self, name: str) -> list[float]:
        """A figure of the table (its JSON field) per repeat, those that have it: what a spread or
        a confidence interval is built on."""
        fig = figures.BY_FIELD[name]
        return [v for s in self.levels if (v := fig.number(s)) is not None]

    def std(self, name: str) -> float | None:
        """The sample std-dev (n - 1) of a figure over the repeats; None with fewer than 2 values."""
        xs = self.values(name)
        return statistics.stdev(xs) if len(xs) >= 2 else None

    @property
    def n(self) -> int:
        """Repeats that produced an agg value (levels with no records have none)."""
        return len(self.values("agg_tok_s"))

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
    spec_verify_calls: float | None = None  # SGLang's cumulative verify steps
    generation_tokens: float | None = None  # SGLang's (and vLLM's) cumulative output tokens
    spec_accepted_per_pos: tuple[float, ...] | None = None  # vLLM's accepted tokens per draft position
    closes: int | None = None  # taken as run.json level ``closes`` ended (MetricsSampler.sample_close)

    @classmethod
    def from_dict(cls, d: Any) -> ServerSample | None:
        """None when ``d`` is not an object with a numeric ``t``; unknown keys are ignored."""
        if not isinstance(d, Mapping):
            return None
        t = _num(d.get("t"))
        if t is None:
            return None
        numbers = {name: _num(d.get(name)) for name in _SAMPLE_NUMBERS}
        return cls(t=t, **numbers, spec_accepted_per_pos=_per_pos(d), closes=_index(d.get("closes")))


# ServerSample's plain numbers: every field but the time, the per-position counts and ``closes``.
_SAMPLE_NUMBERS = tuple(
    f.name for f in fields(ServerSample) if f.name not in ("t", "spec_accepted_per_pos", "closes")
)


def _index(v: Any) -> int | None:
    """A level index as written (a whole number), else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _per_pos(d: Mapping[str, Any]) -> tuple[float, ...] | None:
    """introspect.PER_POS_KEY + position keys as one tuple by position (None: absent, or a gap)."""
    pos = {
        k[len("spec_accepted_pos_") :]: _num(v) for k, v in d.items() if k.startswith("spec_accepted_pos_")
    }
    values = [pos.get(str(i)) for i in range(len(pos))]
    return tuple(v for v in values if v is not None) if values and None not in values else None


def _fill_server(s: LevelStats, samples: Sequence[ServerSample], start: float, end: float) -> None:
    inside = [x for x in samples if start <= x.t <= end]
    s.server_samples = len(inside)
    for gauge in ("running", "queued"):
        xs = [v for x in inside if (v := getattr(x, gauge)) is not None]
        setattr(s, f"server_{gauge}_max", max(xs, default=None))
        setattr(s, f"server_{gauge}_mean", mean(xs))


def _mode(xs: Floats) -> Any:
    """The most common value (the first seen among equals), None when there is none."""
    if not len(xs):
        return None
    values, first, counts = np.unique(xs, return_index=True, return_counts=True)
    top = counts == counts.max()
    return count_of(values[top][np.argmin(first[top])])


@dataclass
class Timeline:
    """What the time-based figures (in flight, steady window, tok/s series) need of each measured
    request, one array per field, in file order: ``t0``/``t1`` when its first and last tokens came
    (``t_first``/``t_last``; a request without content has both at ``t_end``), ``tokens`` its
    output count, ``k`` what its first event carried (``min(n, max(1, first_event_tokens))``),
    ``has_first`` whether it had a first token."""

    t_send: Floats
    t_end: Floats
    t0: Floats
    t1: Floats
    tokens: Floats
    k: Floats
    has_first: npt.NDArray[np.bool_]

    def __len__(self) -> int:
        return len(self.t_send)

    @classmethod
    def of_columns(cls, c: LevelColumns) -> Timeline:
        t_first, t_end, n = c.col("t_first"), c.col("t_end"), c.col("tokens")
        has_first = ~np.isnan(t_first)
        t0 = np.where(has_first, t_first, t_end)
        t_last = c.col("t_last")
        t1 = np.where(np.isnan(t_last), t0, t_last)
        fe = c.col("first_event")
        fe = np.where(np.isnan(fe) | (fe == 0), 1.0, fe)  # ``first_event_tokens or 1``
        return cls(c.col("t_send"), t_end, t0, t1, n, np.minimum(n, np.maximum(1.0, fe)), has_first)

    @classmethod
    def of(cls, records: Iterable[RequestRecord]) -> Timeline:
        return cls.of_columns(LevelColumns.of(records))


def _timeline(records: Sequence[RequestRecord] | Timeline) -> Timeline:
    return records if isinstance(records, Timeline) else Timeline.of(r for r in records)


def _window_tokens(tl: Timeline, a: float, b: float) -> Floats:
    """Tokens each request produced inside [a, b], in file order, assuming a linear stream.

    The first token(s) arrive at t_first (``t0``) and the rest evenly over (t_first, t_last];
    nothing arrives between the last token and the end of the stream."""
    t0, t1, n, k = tl.t0, tl.t1, tl.tokens, tl.k
    inside = ((a <= t0) & (t0 <= b)).astype(np.float64)
    span = t1 - t0
    flat = (span <= 0) | (n == k)
    with np.errstate(divide="ignore", invalid="ignore"):
        overlap = np.minimum(b, t1) - np.maximum(a, t0)
        spread = k * inside + (n - k) * np.maximum(overlap, 0.0) / span
    return np.where(n <= 0, 0.0, np.where(flat, n * inside, spread))


def peak_in_flight(records: Sequence[RequestRecord] | Timeline) -> int:
    """The most requests in flight at once; an end before a send at the same instant (a hand-off
    is no overlap): after the j-th send (sorted), j + 1 - (ends at or before it) are in flight."""
    tl = _timeline(records)
    if not len(tl):
        return 0
    sends, ends = np.sort(tl.t_send), np.sort(tl.t_end)
    after = np.arange(1, len(sends) + 1) - np.searchsorted(ends, sends, side="right")
    return max(0, int(after.max()))


def steady_window(
    records: Sequence[RequestRecord] | Timeline,
    concurrency: int,
    max_dip_s: float = STEADY_MAX_DIP_S,
    cap: int | None = None,
) -> tuple[float, float] | None:
    """The span during which the server was saturated with this level's load, or None.

    D = min(C, cap) requests can run at once (``cap``: the server's running-request limit, when
    known). The window opens when the D-th request has its first token (the synchronized prefill
    burst is over: D requests are decoding) and closes when fewer than D requests are left in flight
    and that lasts over ``max_dip_s`` (a closed-loop user's hand-off from one request to its next
    is no drop). With C above the cap the client keeps C in flight while the server runs ``cap``
    and queues the rest, so the server stays saturated until fewer than ``cap`` are left.

    Every send, first token and end in time order (at equal times a send, then a first token, then
    an end): the requests in flight and decoding after each event are running sums.
    """
    tl = _timeline(records)
    d = min(concurrency, cap) if cap else concurrency
    if d <= 0 or len(tl) < d:
        return None
    has = tl.has_first
    n, n_first = len(tl), int(has.sum())
    # sends, first tokens, ends: a stable sort by time keeps that order at equal times
    t = np.concatenate([tl.t_send, tl.t0[has], tl.t_end])
    order = np.argsort(t, kind="stable")
    t = t[order]
    ones, zeros = np.ones(n, np.int8), np.zeros(n, np.int8)
    in_flight = np.cumsum(np.concatenate([ones, np.zeros(n_first, np.int8), -ones])[order], dtype=np.int32)
    decoding = np.concatenate([zeros, np.ones(n_first, np.int8), -has.astype(np.int8)])[order]
    decoding = np.cumsum(decoding, dtype=np.int32)
    del order, ones, zeros
    opened = np.flatnonzero(decoding >= d)
    if not len(opened):
        return None
    at = int(opened[0])
    start = float(t[at])
    below = in_flight[at + 1 :] < d  # after the window opened
    times = t[at + 1 :]
    prev = np.concatenate([[False], below[:-1]])
    down = np.flatnonzero(below & ~prev)  # where a dip below D starts
    up = np.flatnonzero(~below & prev)  # where the dip before it ends
    dips = times[up] - times[down[: len(up)]]
    long_dip = np.flatnonzero(dips > max_dip_s)
    if len(long_dip):
        return start, float(times[down[long_dip[0]]])
    if len(down) > len(up):  # the last dip lasts to the end
        below_since = float(times[down[-1]])
        return (start, below_since) if below_since > start else None
    return None


def steady_tok_s(
    records: Sequence[RequestRecord] | Timeline,
    concurrency: int,
    max_dip_s: float = STEADY_MAX_DIP_S,
    min_window_s: float = STEADY_MIN_WINDOW_S,
    cap: int | None = None,
) -> tuple[float | None, float | None]:
    """(tokens/s inside the steady window, window length): the rate the server sustains while
    saturated, without the prefill burst at the start and the drain at the end."""
    tl = _timeline(records)
    return steady_rate_in(tl, steady_window(tl, concurrency, max_dip_s, cap), min_window_s)


def steady_rate_in(
    tl: Timeline, window: tuple[float, float] | None, min_window_s: float = STEADY_MIN_WINDOW_S
) -> tuple[float | None, float | None]:
    """``steady_tok_s`` of a steady window already found."""
    if window is None:
        return None, None
    a, b = window
    length = b - a
    if length < min_window_s:
        return None, length
    return float(_window_tokens(tl, a, b).sum()) / length, length


def level_drift(tl: Timeline, window: tuple[float, float] | None) -> Drift | None:
    """The drift of the steady window's output tok/s (specload.analysis.drift), over DRIFT_SEGMENTS
    equal segments of it, each request's tokens spread as in the steady rate."""
    if window is None or window[1] - window[0] < STEADY_MIN_WINDOW_S:
        return None
    a, b = window
    rates = tok_s_series(tl, (b - a) / DRIFT_SEGMENTS, span=(a, b))[:DRIFT_SEGMENTS]
    return drift_of(rates)


def tok_s_series(
    records: Sequence[RequestRecord] | Timeline,
    bucket_s: float = SERIES_BUCKET_S,
    *,
    span: tuple[float, float] | None = None,
) -> list[float]:
    """Output tokens per second in consecutive buckets from the level's first send (the last,
    partial bucket is divided by its own length), each request's tokens spread as in the steady
    window (its first event's at t_first, the rest evenly up to t_last; a bucket's ends both count).

    A request adds its first tokens to the bucket of t_first, its rate to the buckets it spans
    (partial ones directly, whole ones through a running sum of rate changes), so the cost is the
    requests plus the buckets, not their product. ``span``: the level's first send and last end.
    """
    tl = _timeline(records)
    if not len(tl):
        return []
    t_lo, t_hi = span if span is not None else (float(tl.t_send.min()), float(tl.t_end.max()))
    # bucket i is [edges[i], ends[i]]: t_lo + i * bucket_s to min(t_hi, t_lo + (i + 1) * bucket_s),
    # up to the first that would be empty
    most = max(1, math.ceil((t_hi - t_lo) / bucket_s))
    i = np.arange(most, dtype=np.float64)
    edges = t_lo + i * bucket_s
    ends = np.minimum(t_hi, t_lo + (i + 1) * bucket_s)
    empty = np.flatnonzero(ends <= edges)
    nb = int(empty[0]) if len(empty) else most
    if not nb:
        return []
    edges, ends = edges[:nb], ends[:nb]
    last = nb - 1
    t0, t1, n, k = tl.t0, tl.t1, tl.tokens, tl.k
    has = n > 0
    span_ = t1 - t0
    spread = has & (span_ > 0) & (n != k)  # else all n tokens count at t0
    mass = np.where(spread, k, n)
    inside = has & (t_lo <= t0) & (t0 <= t_hi)
    i0 = np.clip(np.floor_divide(t0 - t_lo, bucket_s), 0, last).astype(np.int64)
    tokens = np.bincount(i0[inside], mass[inside], minlength=nb)
    edge = inside & (i0 > 0) & (t0 == edges[i0])  # on a boundary: in both buckets, as [a, b] intervals are
    tokens += np.bincount(i0[edge] - 1, mass[edge], minlength=nb)
    u = np.maximum(t0, t_lo)
    v = np.minimum(t1, t_hi)
    spread &= v > u
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(spread, (n - k) / span_, 0.0)
    iu = np.where(t0 >= t_lo, i0, 0)
    iv = np.clip(np.floor_divide(v - t_lo, bucket_s), 0, last).astype(np.int64)
    same = spread & (iu == iv)
    tokens += np.bincount(iu[same], (rate * (v - u))[same], minlength=nb)
    apart = spread & (iu != iv)
    iu, iv, u, v, rate = iu[apart], iv[apart], u[apart], v[apart], rate[apart]
    tokens += np.bincount(iu, rate * (ends[iu] - u), minlength=nb)
    tokens += np.bincount(iv, rate * (v - edges[iv]), minlength=nb)
    rate_diff = np.bincount(iu + 1, rate, minlength=nb + 1) - np.bincount(iv, rate, minlength=nb + 1)
    widths = ends - edges
    return ((tokens + np.cumsum(rate_diff[:nb]) * widths) / widths).tolist()


def streamed_tok_s(
    t: Sequence[float] | Floats,
    tokens: Sequence[float] | Floats,
    span: tuple[float, float],
    bucket_s: float = SERIES_BUCKET_S,
) -> list[float]:
    """tok/s over time from cumulative samples of the tokens the client's streams had read (``t``
    ascending wall clock, ``tokens`` the running total then): the buckets of ``tok_s_series`` over
    ``span``, each the rise of the total across it (linear between two samples, flat outside them)
    over its length. A prefill stall (no token for a second) is a bucket near 0, as it was live:
    records cannot give this, their ITL is a histogram without order. A sample after ``span``'s end
    counts at the end: the level's last token came by its last end, and the processes' counts
    reach the owner up to a sample interval later."""
    t_lo, t_hi = span
    ts = np.minimum(np.asarray(t, np.float64), t_hi)
    ns = np.asarray(tokens, np.float64)
    if len(ts):
        last = np.concatenate([ts[1:] != ts[:-1], [True]])  # of samples at one time, the latest count
        ts, ns = ts[last], ns[last]
    if len(ts) < 2 or t_hi <= t_lo:
        return []
    nb = max(1, math.ceil((t_hi - t_lo) / bucket_s))
    edges = np.minimum(t_hi, t_lo + np.arange(nb + 1, dtype=np.float64) * bucket_s)
    keep = np.concatenate([[True], np.diff(edges) > 0])
    edges = edges[keep]
    total = np.interp(edges, ts, ns)
    return (np.diff(total) / np.diff(edges)).tolist()


def _token_note(fallback: int, ok: int) -> str | None:
    if not fallback:
        return None
    return (
        f"{fallback} of {ok} OK requests counted output tokens from stream chunks (the server sent no "
        "token count); a chunk can carry several tokens (e.g. speculative decoding)"
    )


def _counts(c: LevelColumns, name: str, skip: Any = ...) -> dict[Any, int]:
    """A LABELS column counted: value -> requests, in first-seen order (``skip``: a value left out)."""
    counts = np.bincount(c.codes(name), minlength=len(c.labels[name]))
    return {v: int(k) for v, k in zip(c.labels[name], counts, strict=True) if k and v is not skip}


def _fill_outcomes(s: LevelStats, c: LevelColumns) -> None:
    s.sent = c.sent
    ok, failed = c.is_label("status", OK), c.is_label("status", FAILED)
    s.ok, s.failed = int(ok.sum()), int(failed.sum())
    s.short = int(c.is_label("status", SHORT).sum())
    s.rate_limited = int((failed & c.is_label("http", 429)).sum())
    n = c.col("tokens")
    s.output_tokens = count_of(np.maximum(n, 0).sum())  # type: ignore[assignment]  # (a float count: a float)
    s.token_sources = _counts(c, "source")
    asked = c.col("req_out")
    # An ok record with fewer tokens than asked, counted by the server, is one the model ended itself
    # (--output-mode natural; specload.analysis.validity holds ok records to that): no mismatch.
    stopped = ok & ~c.is_label("source", SRC_CHUNKS) & (n < asked)
    s.output_mismatch = int((~failed & (n != asked) & ~stopped).sum())
    prompt = c.col("prompt")
    s.prompt_mismatch = int((~np.isnan(prompt) & (prompt != c.col("req_prompt"))).sum())
    s.requested_output_tokens = _mode(asked)
    s.requested_prompt_tokens = _mode(c.col("req_prompt"))
    s.reasons = _counts(c, "reason", None)


def _fill_throughput(s: LevelStats, c: LevelColumns, start: float, end: float, cap: int | None) -> None:
    tl = Timeline.of_columns(c)
    wall = end - start
    s.wall_s = wall
    if wall > 0:
        prompt = c.col("prompt")
        input_tokens = count_of(np.where(np.isnan(prompt), c.col("req_prompt"), prompt).sum())
        s.agg_tok_s = s.output_tokens / wall
        s.mean_concurrency = float(c.col("e2e").sum()) / wall
        s.req_s = s.ok / wall
        s.input_tok_s = input_tokens / wall
        s.total_tok_s = s.input_tok_s + s.agg_tok_s
    s.peak_in_flight = peak_in_flight(tl)
    if s.rate is None:  # an open loop has no saturated closed-loop window to measure
        window = steady_window(tl, s.concurrency, cap=cap)
        s.steady_tok_s, s.steady_window_s = steady_rate_in(tl, window)
        s.drift = level_drift(tl, window)
    elif len(tl) > 1:
        first, last = float(tl.t_send.min()), float(tl.t_send.max())
        if last > first:
            s.send_rate = (len(tl) - 1) / (last - first)
    s.tok_s_series = tok_s_series(tl, span=(start, end))
    s.tok_s_series_source, s.series_t0 = SERIES_RECORDS, start


def _fill_latency(s: LevelStats, c: LevelColumns) -> None:
    ok = c.is_label("status", OK)
    s.per_req_tok_s = _mean_of(c.present("per_req", ok))  # the record's own (core.records.derived)
    ttft, tpot, e2e_ok = c.present("ttft", ok), c.present("tpot", ok), c.col("e2e")[ok]
    s.dists = {
        "ttft": dist_of(ttft),
        "tpot": dist_of(tpot),
        "e2e": dist_of(e2e_ok),
        "itl": dist_of_hist(c.itl),
    }
    s.decode_tok_s_mean = _mean_of(c.present("decode", ok))
    units = set(c.itl_units)
    s.itl_unit = units.pop() if len(units) == 1 else ("mixed" if units else None)
    s.prompt_tokens_mean = _mean_of(c.present("prompt", ok))
    s.chunk_fallback_ok = int((ok & c.is_label("source", SRC_CHUNKS)).sum())
    s.token_note = _token_note(s.chunk_fallback_ok, s.ok)


def _fill_schedule(s: LevelStats, c: LevelColumns) -> None:
    """Rate levels: how far the sends kept to their schedule, and latencies from the due time."""
    lag_all = c.col("t_send") - c.col("t_sched")
    due = ~np.isnan(lag_all)
    if not due.any():
        return
    lag = lag_all[due]
    s.late = int((lag > LATE_S).sum())
    s.lag_p99_ms, s.lag_max_ms = _ms(stats.percentile(lag, 99)), float(lag.max()) * 1e3
    ok = c.is_label("status", OK) & due
    s.dists["ttft_sched"] = dist_of((c.col("ttft") + lag_all)[ok & ~np.isnan(c.col("ttft"))])
    s.dists["e2e_sched"] = dist_of((c.col("e2e") + lag_all)[ok])
    s.late_note = late_note(s.late, len(lag), s.lag_p99_ms or 0.0, s.peak_in_flight, s.concurrency)


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


def summarize(
    c: LevelColumns,
    mask: npt.NDArray[np.bool_] | None = None,
    *,
    part_of: LevelStats | None = None,
    concurrency: int = 0,
    repeat: int = 0,
    index: int | None = None,
    status: str | None = None,
    samples: Sequence[ServerSample] | None = None,
    cap: int | None = None,
    rate: float | None = None,
    slo: Slo | None = None,
) -> LevelStats:
    """Every figure of a level's requests where ``mask`` holds (None: all of them): the one figure
    code behind a level, its parts and the live view. Each fill sets its figures on the stats
    directly: a figure computed is a figure kept (tests/test_metrics.py checks every field).

    A level gets every figure (``index``: its run.json level, whose closing server sample ends its
    counter window; ``status``: its status in run.json, copied as is; ``samples``: the run's server
    samples in time order, those outside the level's window ignored; ``slo``: judge the level
    against it, LevelStats.slo), and its parts (request classes, turns, categories) summarized
    by this same function. A part (``part_of``: the level it is a part of) gets its outcomes,
    latencies, acceptance and prefix cache from its own requests (from the records alone: the
    server's counters and gauges cover the whole level) and its throughput over the level's wall
    time, so that the parts add up to the level; the figures of the level's time course (steady
    state, schedule, series) and its SLO are the level's alone."""
    if mask is not None:
        c = c.subset(mask)
    if part_of is not None:
        s = LevelStats(part_of.concurrency, part_of.repeat, part_of.label, rate=part_of.rate, warmup=c.warmup)
        samples = ()
    else:
        s = LevelStats(
            concurrency=concurrency,
            repeat=repeat,
            label=level_label(concurrency, repeat, rate),
            index=index,
            status=status,
            warmup=c.warmup,
            rate=rate,
        )
        if slo is not None:
            s.slo = slo_tally(c, slo).result()
    if not c.sent:
        return s
    samples = samples or ()
    start, end = float(c.col("t_send").min()), float(c.col("t_end").max())
    _fill_outcomes(s, c)
    _fill_latency(s, c)
    if samples:
        _fill_server(s, samples, start, end)
    counters_end = counter_window_end(samples, index, end)
    s.acceptance = acceptance(c, samples, start, counters_end)
    _fill_computed(s, c, figures.Server(samples, start, end, counters_end))
    if part_of is not None:
        if part_of.wall_s:
            s.agg_tok_s, s.req_s = s.output_tokens / part_of.wall_s, s.ok / part_of.wall_s
        if part_of.output_tokens:
            s.extra["output_token_share"] = s.output_tokens / part_of.output_tokens
        s.mix = MixStats(lengths_of(c))
        return s
    if s.server_running_max is not None and s.server_queued_max:
        # The server queued part of this level: it ran at most what its gauge peaked at.
        cap = min(cap or s.concurrency, int(s.server_running_max))
    _fill_throughput(s, c, start, end, cap)
    _fill_schedule(s, c)
    s.reasoning = reasoning_stats(c, s.wall_s)
    s.mix = MixStats(lengths_of(c), varied(c), answers_varied(c))
    for kind, parts in parts_of(c).items():
        groups = [
            GroupStats(key, int(mask.sum()) / c.sent, summarize(c, mask, part_of=s)) for key, mask in parts
        ]
        setattr(s.mix, {"class": "classes", "turn": "turns", "category": "categories"}[kind], groups)
    return s


def _fill_computed(s: LevelStats, c: LevelColumns, server: figures.Server) -> None:
    """The figure table's figures computed over the columns and the server's samples (Figure.compute)."""
    everything = np.ones(c.sent, dtype=np.bool_)
    for f in figures.FIGURES:
        if f.compute is not None:
            v = f.compute(c, everything, server)
            if isinstance(v, figures.Sourced):
                v, source = v
                if source is not None:
                    s.sources[f.field] = source
            s.extra[f.field] = v


def counter_window_end(samples: Sequence[ServerSample], index: int | None, end: float) -> float:
    """Where a level's counter deltas end: at the sample taken as level ``index`` closed (every one of
    its requests back, the next level not begun: nothing else ran between ``end`` and it), else at
    ``end``, whose last sample may come up to a sampling interval before the level's last steps."""
    closing = [s.t for s in samples if index is not None and s.closes == index and s.t >= end]
    return min(closing) if closing else end


@dataclass
class Row:
    """What one row of a run's table is computed from: its columns and its run.json level."""

    columns: LevelColumns
    concurrency: int
    repeat: int
    index: int | None
    status: str | None = None
    planned: bool = True
    rate: float | None = None


def summary_rows(
    groups: Mapping[GroupKey, LevelColumns], levels_meta: Sequence[LevelMeta | Mapping[str, Any]] | None
) -> list[Row]:
    """One row per run.json level (in sweep order, even without records; a level without an index
    gets every group of its concurrency and repeat, one after the other), then one per group no
    level claims."""
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


def summarize_rows(
    rows: list[Row],
    samples: Sequence[ServerSample] | None = None,
    cap: int | None = None,
    slo: Slo | None = None,
) -> list[LevelStats]:
    """The stats of each row (``slo``: each judged against it). The rows are taken out of ``rows``
    as they are done, so that a level's columns can be let go of once its figures are made: the
    last (and usually biggest) level's figures are then worked out without every other level's
    columns still held."""
    samples = sorted(samples or [], key=lambda x: x.t)
    out = []
    rows.reverse()
    while rows:
        row = rows.pop()
        s = summarize(
            row.columns,
            concurrency=row.concurrency,
            repeat=row.repeat,
            index=row.index,
            status=row.status,
            samples=samples,
            cap=cap,
            rate=row.rate,
            slo=slo,
        )
        s.planned = row.planned
        out.append(s)
    return out


def _plan(levels_meta: Sequence[LevelMeta | Mapping[str, Any]] | None) -> list[LevelMeta]:
    """run.json levels as LevelMeta; an entry that is not a level (no concurrency) is skipped."""
    out: list[LevelMeta] = []
    for m in levels_meta or []:
        lv = m if isinstance(m, LevelMeta) else LevelMeta.from_json(m)
        if lv is not None:
            out.append(lv)
    return out


def combine_parts(x: float, levels: Sequence[LevelStats], rate: bool = False) -> RepeatedLevelStats:
    """Levels (or parts of levels: a category) of one x combined by the figure table's rules; ``x``
    is the level's concurrency, or its requests/s when ``rate``."""
    return RepeatedLevelStats(
        concurrency=levels[0].concurrency if rate and levels else int(x),
        rate=x if rate else None,
        repeats=[s.repeat for s in levels],
        levels=list(levels),
        combined=figures.combined(levels),
    )


def combine_repeats(levels: Sequence[LevelStats]) -> RepeatedLevelStats:
    """Mean and sample std-dev across repeats of one concurrency (levels without a value are skipped)."""
    if not levels:
        raise ValueError("combine_repeats needs at least one LevelStats")
    xs = {(s.rate is not None, s.x) for s in levels}
    if len(xs) != 1:
        raise ValueError(f"combine_repeats got several levels: {sorted(x for _, x in xs)}")
    return combine_parts(levels[0].x, levels, levels[0].rate is not None)


def repeats_at(levels: Sequence[LevelStats], x: float, rate: bool = False) -> RepeatedLevelStats:
    """Every repeat of level ``x`` (a concurrency, or a rate when ``rate``) among a run's ``levels``
    combined; a run without it gives an empty one (repeats [], every figure None), so runs line up
    level by level."""
    return combine_parts(x, [s for s in levels if s.x == x and (s.rate is not None) == rate], rate)


def group_repeats(levels: Sequence[LevelStats]) -> list[RepeatedLevelStats]:
    """combine_repeats for every level value, in first-seen order."""
    by_x: dict[tuple[bool, float], list[LevelStats]] = {}
    for s in levels:
        by_x.setdefault((s.rate is not None, s.x), []).append(s)
    return [combine_repeats(group) for group in by_x.values()]
