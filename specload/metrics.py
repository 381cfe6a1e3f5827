"""Per-level figures computed from RequestRecords. Pure functions: no I/O, no clock, no Locust.

Every number the report prints is derived here, from ``records.jsonl`` alone, so that the same
records always give the same table (Locust's own statistics are bucketed and only cross-checked).
The definitions are written out for users in ``docs/metrics.md``; keep the two in step.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from specload import histogram
from specload.records import (
    FAILED,
    OK,
    PHASE_MEASURE,
    PHASE_WARMUP,
    SHORT,
    SRC_CHUNKS,
    RequestRecord,
    level_label,
)
from specload.rundir import LevelMeta

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
SERIES_BUCKET_S = 1.0  # tok/s over time: one value per this many seconds of the level


@dataclass
class Dist:
    """A latency's distribution over one level: count, mean, sample std-dev and percentiles.

    Values are seconds. ``exact`` is False for ITL, read from the per-request histograms (each
    percentile within specload.histogram.MAX_REL_ERROR, 1%, of the true value)."""

    n: int = 0
    mean: float | None = None
    std: float | None = None
    p: dict[float, float] = field(default_factory=dict)
    exact: bool = True

    def to_dict(self, scale: float = 1.0) -> dict[str, Any]:
        def sc(v: float | None) -> float | None:
            return None if v is None else v * scale

        return {"n": self.n, "mean": sc(self.mean), "std": sc(self.std), "exact": self.exact,
                **{f"p{q:g}": sc(v) for q, v in self.p.items()}}  # fmt: skip


def dist_of(values: Iterable[float | None]) -> Dist:
    xs = [v for v in values if v is not None]
    if not xs:
        return Dist()
    return Dist(len(xs), sum(xs) / len(xs), statistics.stdev(xs) if len(xs) > 1 else None,
                {q: percentile(xs, q) or 0.0 for q in PERCENTILES})  # fmt: skip


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
    xs = sorted(v for v in values if v is not None)
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
    tok_s_series: list[float] = field(default_factory=list)  # output tok/s per SERIES_BUCKET_S from the first send
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


def level_json(s: LevelStats) -> dict[str, Any]:
    """A level's figures for JSON: every field unrounded, the distributions keyed p50, p99.9, ..."""
    d = asdict(s)
    d["dists"] = {name: dist.to_dict() for name, dist in s.dists.items()}
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
    before = [s for s in usable if s.t <= start]
    first = before[-1] if before else next((s for s in usable if start <= s.t <= end), None)
    upto = [s for s in usable if s.t <= end]
    last = upto[-1] if upto else None
    if first is None or last is None or last.t <= first.t:
        return None
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


def _is_measured(r: RequestRecord) -> bool:
    return r.phase == PHASE_MEASURE


def _belongs(r: RequestRecord, concurrency: int, repeat: int, index: int | None) -> bool:
    if r.concurrency != concurrency or r.repeat != repeat:
        return False
    return index is None or r.level == index


def _mode(values: Iterable[int]) -> int | None:
    counts = Counter(values)
    return counts.most_common(1)[0][0] if counts else None


def _tokens_in_window(r: RequestRecord, a: float, b: float) -> float:
    """Tokens a request produced inside [a, b], assuming a linear stream.

    The record keeps t_first and t_last (the first and last content events), so the first
    token(s) arrive at t_first and the rest evenly over (t_first, t_last]; nothing arrives between
    the last token and the end of the stream.
    """
    n = r.output_tokens
    if n <= 0:
        return 0.0
    t0 = r.t_first if r.t_first is not None else r.t_end
    t1 = r.t_last if r.t_last is not None else t0
    k = min(n, max(1, r.first_event_tokens or 1))
    first = float(k) if a <= t0 <= b else 0.0
    span = t1 - t0
    if span <= 0 or n == k:
        return n * (1.0 if a <= t0 <= b else 0.0)
    overlap = max(0.0, min(b, t1) - max(a, t0))
    return first + (n - k) * overlap / span


def steady_window(
    records: Sequence[RequestRecord], concurrency: int, max_dip_s: float = STEADY_MAX_DIP_S, cap: int | None = None
) -> tuple[float, float] | None:
    """The span during which the server was saturated with this level's load, or None.

    D = min(C, cap) requests can run at once (``cap``: the server's running-request limit, when
    known). The window opens when the D-th request has its first token (the synchronized prefill
    burst is over: D requests are decoding) and closes when fewer than D requests are left in flight
    and that lasts over ``max_dip_s`` (a closed-loop user's hand-off from one request to its next
    is no drop). With C above the cap the client keeps C in flight while the server runs ``cap``
    and queues the rest, so the server stays saturated until fewer than ``cap`` are left.
    """
    d = min(concurrency, cap) if cap else concurrency
    if d <= 0 or len(records) < d:
        return None
    # (time, order, in-flight change, decoding change); at equal times a send comes before a first
    # token before an end, so a same-instant hand-off is no dip.
    events = sorted(
        [(r.t_send, 0, 1, 0) for r in records]
        + [(r.t_first, 1, 0, 1) for r in records if r.t_first is not None]
        + [(r.t_end, 2, -1, -1 if r.t_first is not None else 0) for r in records]
    )
    count = decoding = 0
    start: float | None = None
    below_since: float | None = None
    for t, _, d_flight, d_decoding in events:
        count += d_flight
        decoding += d_decoding
        if start is None:
            if decoding >= d:
                start = t
            continue
        if count < d:
            if below_since is None:
                below_since = t
        elif below_since is not None:
            if t - below_since > max_dip_s:
                return start, below_since
            below_since = None
    if start is None or below_since is None or below_since <= start:
        return None
    return start, below_since


def steady_tok_s(
    records: Sequence[RequestRecord],
    concurrency: int,
    max_dip_s: float = STEADY_MAX_DIP_S,
    min_window_s: float = STEADY_MIN_WINDOW_S,
    cap: int | None = None,
) -> tuple[float | None, float | None]:
    """(tokens/s inside the steady window, window length): the rate the server sustains while
    saturated, without the prefill burst at the start and the drain at the end."""
    window = steady_window(records, concurrency, max_dip_s, cap)
    if window is None:
        return None, None
    a, b = window
    length = b - a
    if length < min_window_s:
        return None, length
    tokens = sum(_tokens_in_window(r, a, b) for r in records)
    return tokens / length, length


def peak_in_flight(records: Sequence[RequestRecord]) -> int:
    events = sorted([(r.t_send, 1) for r in records] + [(r.t_end, -1) for r in records], key=lambda e: (e[0], e[1]))
    count = peak = 0
    for _, delta in events:  # an end before a send at the same instant: a hand-off is no overlap
        count += delta
        peak = max(peak, count)
    return peak


def tok_s_series(records: Sequence[RequestRecord], bucket_s: float = SERIES_BUCKET_S) -> list[float]:
    """Output tokens per second in consecutive buckets from the level's first send (the last,
    partial bucket is divided by its own length). Tokens are placed as for the steady window: the
    first event's at t_first, the rest spread evenly over (t_first, t_last]. Each record touches only
    the buckets it overlaps, so a long level costs its request-seconds, not buckets x records."""
    if not records:
        return []
    t0 = min(r.t_send for r in records)
    t1 = max(r.t_end for r in records)
    n = max(1, math.ceil((t1 - t0) / bucket_s))
    tokens = [0.0] * n

    def at(t: float) -> int:
        return min(n - 1, max(0, int((t - t0) / bucket_s)))

    for r in records:
        total = r.output_tokens
        if total <= 0:
            continue
        a = r.t_first if r.t_first is not None else r.t_end
        b = r.t_last if r.t_last is not None else a
        k = min(total, max(1, r.first_event_tokens or 1))
        span = b - a
        if span <= 0 or total == k:
            tokens[at(a)] += total
            continue
        tokens[at(a)] += k
        rate = (total - k) / span
        for i in range(at(a), at(b) + 1):
            lo, hi = max(a, t0 + i * bucket_s), min(b, t0 + (i + 1) * bucket_s)
            if hi > lo:
                tokens[i] += rate * (hi - lo)
    widths = [min(bucket_s, t1 - (t0 + i * bucket_s)) for i in range(n)]
    return [tok / w for tok, w in zip(tokens, widths, strict=True) if w > 0]


def _reasons(records: Iterable[RequestRecord]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for r in records:
        if r.status != OK:
            counts[f"{r.status}: {r.reason or 'no reason given'}"] += 1
    return dict(counts)


def _token_note(fallback: int, ok: int) -> str | None:
    if not fallback:
        return None
    return (
        f"{fallback} of {ok} OK requests counted output tokens from stream chunks (the server sent no "
        "token count); a chunk can carry several tokens (e.g. speculative decoding)"
    )


def _output_mismatch(r: RequestRecord) -> bool:
    return r.status != FAILED and r.output_tokens != r.requested_output_tokens


def _prompt_mismatch(r: RequestRecord) -> bool:
    return r.prompt_tokens is not None and r.prompt_tokens != r.requested_prompt_tokens


def _fill_outcomes(s: LevelStats, measured: list[RequestRecord]) -> None:
    s.sent = len(measured)
    s.ok = sum(r.status == OK for r in measured)
    s.short = sum(r.status == SHORT for r in measured)
    s.failed = sum(r.status == FAILED for r in measured)
    s.rate_limited = sum(r.status == FAILED and r.http_status == 429 for r in measured)
    s.output_tokens = sum(max(r.output_tokens, 0) for r in measured)
    s.token_sources = dict(Counter(r.output_tokens_source for r in measured))
    s.output_mismatch = sum(_output_mismatch(r) for r in measured)
    s.prompt_mismatch = sum(_prompt_mismatch(r) for r in measured)
    s.requested_output_tokens = _mode(r.requested_output_tokens for r in measured)
    s.requested_prompt_tokens = _mode(r.requested_prompt_tokens for r in measured)
    s.reasons = _reasons(measured)


def _prompt_len(r: RequestRecord) -> int:
    return r.prompt_tokens if r.prompt_tokens is not None else r.requested_prompt_tokens


def _fill_throughput(s: LevelStats, measured: list[RequestRecord], cap: int | None = None) -> None:
    wall = max(r.t_end for r in measured) - min(r.t_send for r in measured)
    s.wall_s = wall
    if wall > 0:
        s.agg_tok_s = s.output_tokens / wall
        s.mean_concurrency = sum(r.e2e_s for r in measured) / wall
        s.req_s = s.ok / wall
        s.input_tok_s = sum(_prompt_len(r) for r in measured) / wall
        s.total_tok_s = s.input_tok_s + s.agg_tok_s
    s.peak_in_flight = peak_in_flight(measured)
    s.tok_s_series = tok_s_series(measured)
    s.steady_tok_s, s.steady_window_s = steady_tok_s(measured, s.concurrency, cap=cap)


def _fill_latency(s: LevelStats, ok: list[RequestRecord]) -> None:
    s.per_req_tok_s = mean(r.output_tokens / r.e2e_s for r in ok if r.e2e_s > 0)
    ttft = [r.ttft_s for r in ok]
    tpot = [r.tpot_s for r in ok]
    e2e = [r.e2e_s for r in ok]
    s.ttft_p50_ms, s.ttft_p99_ms = _ms(percentile(ttft, 50)), _ms(percentile(ttft, 99))
    s.tpot_p50_ms, s.tpot_p99_ms = _ms(percentile(tpot, 50)), _ms(percentile(tpot, 99))
    s.e2e_p50_s, s.e2e_p99_s = percentile(e2e, 50), percentile(e2e, 99)
    s.decode_tok_s_mean = mean(r.decode_tok_s for r in ok)
    s.dists = {"ttft": dist_of(ttft), "tpot": dist_of(tpot), "e2e": dist_of(e2e),
               "itl": dist_of_hist(histogram.merge(r.itl for r in ok))}  # fmt: skip
    units = {r.itl_unit for r in ok if r.itl}
    s.itl_unit = units.pop() if len(units) == 1 else ("mixed" if units else None)
    s.prompt_tokens_mean = mean(r.prompt_tokens for r in ok)
    s.chunk_fallback_ok = sum(r.output_tokens_source == SRC_CHUNKS for r in ok)
    s.token_note = _token_note(s.chunk_fallback_ok, len(ok))
    s.accept_length, s.accept_length_requests = accept_length_from_records(ok)
    if s.accept_length is not None:
        s.accept_length_source = ACCEPT_FROM_RECORDS


def summarize_level(
    records: Iterable[RequestRecord],
    concurrency: int,
    repeat: int = 0,
    *,
    index: int | None = None,
    status: str | None = None,
    samples: Sequence[ServerSample] | None = None,
    cap: int | None = None,
) -> LevelStats:
    """Stats of one level from any set of records (those of other levels are filtered out).

    ``index`` narrows the match to one run.json level when the same (C, repeat) occurs twice;
    ``status`` is that level's status in run.json, copied as is. ``samples`` are the run's
    server samples (any order; those outside the level's measured window are ignored).
    """
    mine = [r for r in records if _belongs(r, concurrency, repeat, index)]
    measured = [r for r in mine if _is_measured(r)]
    s = LevelStats(
        concurrency=concurrency,
        repeat=repeat,
        label=level_label(concurrency, repeat),
        index=index,
        status=status,
        warmup=sum(r.phase == PHASE_WARMUP for r in mine),
    )
    if not measured:
        return s
    _fill_outcomes(s, measured)
    if samples:
        _fill_server(s, samples, min(r.t_send for r in measured), max(r.t_end for r in measured))
    if s.server_running_max is not None and s.server_queued_max:
        # The server queued part of this level: it ran at most what its gauge peaked at.
        cap = min(cap or s.concurrency, int(s.server_running_max))
    _fill_throughput(s, measured, cap)
    _fill_latency(s, [r for r in measured if r.status == OK])
    if samples and s.accept_length is None:
        _fill_server(s, samples, min(r.t_send for r in measured), max(r.t_end for r in measured))
    return s


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
        summarize_level(records, lv.concurrency, lv.repeat, index=lv.index, status=lv.status, samples=samples,
                        cap=cap)  # fmt: skip
        for lv in plan
    ]
    extra = sorted({(r.level, r.concurrency, r.repeat) for r in records if not _claimed(r, plan)})
    for idx, c, rep in extra:
        s = summarize_level(records, c, rep, index=idx, samples=samples, cap=cap)
        s.planned = False
        out.append(s)
    return out


def _sample_std(xs: list[float]) -> float | None:
    return statistics.stdev(xs) if len(xs) >= 2 else None


def _itl_p99_ms(s: LevelStats) -> float | None:
    d = s.dists.get("itl")
    return None if d is None or not d.n else d.p.get(99.0, 0.0) * 1e3


def _combine(concurrency: int, levels: Sequence[LevelStats]) -> RepeatedLevelStats:
    agg = [s.agg_tok_s for s in levels if s.agg_tok_s is not None]
    per = [s.per_req_tok_s for s in levels if s.per_req_tok_s is not None]
    return RepeatedLevelStats(
        concurrency=concurrency,
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
    concurrencies = {s.concurrency for s in levels}
    if len(concurrencies) != 1:
        raise ValueError(f"combine_repeats got several concurrencies: {sorted(concurrencies)}")
    return _combine(levels[0].concurrency, levels)


def repeats_at(levels: Sequence[LevelStats], concurrency: int) -> RepeatedLevelStats:
    """Every repeat of ``concurrency`` among a run's ``levels`` combined; a run without that
    concurrency gives an empty one (repeats [], every figure None), so runs line up level by level."""
    return _combine(concurrency, [s for s in levels if s.concurrency == concurrency])


def group_repeats(levels: Sequence[LevelStats]) -> list[RepeatedLevelStats]:
    """combine_repeats for every concurrency, in first-seen order."""
    by_c: dict[int, list[LevelStats]] = {}
    for s in levels:
        by_c.setdefault(s.concurrency, []).append(s)
    return [combine_repeats(group) for group in by_c.values()]
