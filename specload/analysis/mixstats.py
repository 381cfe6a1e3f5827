"""The workload a level actually sent: its length distributions, its request classes and its
conversation turns, and how much of its prompts the server's prefix cache served.

Pure functions over a level's columns (``columns.LevelColumns``: the length counters and the
per-class and per-turn columns are filled as records.jsonl is read) and the run's server samples
(``metrics.ServerSample``, read by attribute). ``metrics.level_stats`` calls ``mix_stats`` and
``prefix_cache_rate`` for every level, whichever way it was read. The definitions are in
docs/metrics.md ("Request lengths", "Request classes and conversation turns", "Prefix cache hit rate").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specload.analysis.columns import LevelColumns
from specload.core.counters import window_ends

# Where LevelStats.prefix_cache_hit_rate came from.
CACHE_FROM_RECORDS = "records"  # per request: SGLang meta_info / OpenAI usage prompt_tokens_details
CACHE_FROM_COUNTERS = "server_counters"  # vLLM prefix_cache_hits / queries counters, sampled
CACHE_FROM_GAUGE = "server_gauge"  # SGLang cache_hit_rate gauge, sampled (its last prefill batch's)

# The lengths a level has, in the report's order: (key, what, which requests).
LENGTHS = (
    ("input_sent", "input sent"),  # requested_prompt_tokens, every measured request
    ("input_counted", "input counted"),  # the server's prompt_tokens, requests not failed that have it
    ("output_asked", "output asked"),  # requested_output_tokens, every measured request
    ("output_received", "output received"),  # output_tokens, requests not failed
)


@dataclass
class LengthSummary:
    """A length's distribution over a level's requests: count, mean, p50, p90, max (tokens)."""

    n: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    max: float | None = None


def summarize_counts(counts: Mapping[Any, int]) -> LengthSummary:
    """The summary of values given as value -> how many times (percentiles interpolated as numpy's
    default, like every percentile of specload, from the sorted values without listing them)."""
    items = sorted((v, k) for v, k in counts.items() if v is not None and k > 0)
    n = sum(k for _, k in items)
    if not n:
        return LengthSummary()
    total = sum(v * k for v, k in items)

    def at(i: int) -> float:  # the i-th smallest value (0-based)
        seen = 0
        for v, k in items:
            seen += k
            if i < seen:
                return float(v)
        return float(items[-1][0])

    def pct(q: float) -> float:
        pos = (n - 1) * q / 100.0
        lo = int(pos)
        a, b = at(lo), at(min(lo + 1, n - 1))
        return a + (b - a) * (pos - lo)

    return LengthSummary(n, total / n, pct(50.0), pct(90.0), float(items[-1][0]))


@dataclass
class GroupStats:
    """One request class (or one conversation turn) of a level: its share, outcomes, lengths and latencies.

    Throughput figures are over the level's wall time, so the classes of a level add up to it."""

    key: Any  # the class's name, or the turn index
    sent: int = 0
    share: float | None = None  # sent / the level's measured requests
    ok: int = 0
    failed: int = 0
    short: int = 0
    input_mean: float | None = None  # requested prompt tokens
    input_counted_mean: float | None = None  # the server's prompt tokens (not failed)
    output_mean: float | None = None  # output tokens received (not failed)
    output_tokens: int = 0  # every measured request's, as the level's Tokens
    agg_tok_s: float | None = None  # output_tokens / the level's wall
    req_s: float | None = None  # ok / the level's wall
    per_req_tok_s: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    e2e_p50_s: float | None = None
    prefix_cache_hit_rate: float | None = None  # from the records only


@dataclass
class MixStats:
    """A level's workload as sent: its lengths, and per class and per turn (empty when there are none)."""

    lengths: dict[str, LengthSummary] = field(default_factory=dict)
    varied: bool = False  # some length asked for was not the same for every request
    classes: list[GroupStats] = field(default_factory=list)
    turns: list[GroupStats] = field(default_factory=list)


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


def _pct_of(xs: Any, q: float) -> float | None:
    """metrics.percentile of the values (numpy's linear interpolation; that module imports this one)."""
    if not len(xs):
        return None
    ordered = sorted(xs)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def group_stats(key: Any, c: LevelColumns, level_sent: int, wall: float | None) -> GroupStats:
    """One class's (or turn's) figures from its columns; ``wall``: the level's wall time."""
    g = GroupStats(key, c.sent, c.sent / level_sent if level_sent else None, c.ok, c.failed, c.short)
    g.input_mean = summarize_counts(c.requested_prompt).mean
    g.input_counted_mean = summarize_counts(c.prompt_counted).mean
    g.output_mean = summarize_counts(c.output_got).mean
    g.output_tokens = c.output_tokens
    if wall:
        g.agg_tok_s, g.req_s = c.output_tokens / wall, c.ok / wall
    g.per_req_tok_s = sum(c.per_req) / len(c.per_req) if c.per_req else None
    g.ttft_p50_ms, g.ttft_p99_ms = _ms(_pct_of(c.ttft, 50.0)), _ms(_pct_of(c.ttft, 99.0))
    g.tpot_p50_ms, g.e2e_p50_s = _ms(_pct_of(c.tpot, 50.0)), _pct_of(c.e2e_ok, 50.0)
    g.prefix_cache_hit_rate = c.cached_sum / c.cached_prompt if c.cached_n and c.cached_prompt else None
    return g


def mix_stats(c: LevelColumns, wall: float | None) -> MixStats:
    sources: dict[str, Counter[Any]] = {
        "input_sent": c.requested_prompt,
        "input_counted": c.prompt_counted,
        "output_asked": c.requested_output,
        "output_received": c.output_got,
    }
    m = MixStats(lengths={key: summarize_counts(sources[key]) for key, _ in LENGTHS})
    m.varied = len(c.requested_prompt) > 1 or len(c.requested_output) > 1
    for (kind, key), group in sorted(c.groups.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        (m.classes if kind == "class" else m.turns).append(group_stats(key, group, c.sent, wall))
    m.turns.sort(key=lambda g: g.key)
    return m


def cache_from_counters(samples: Sequence[Any], start: float, end: float) -> float | None:
    """Δhits / Δqueries of vLLM's prefix cache counters over [start, end], the deltas taken as for the
    accept length (metrics.accept_length_from_counters): from the last sample at or before ``start``
    (else the first inside) to the last at or before ``end``; None without two such samples or queries."""
    usable = [s for s in samples if s.prefix_cache_queries is not None and s.prefix_cache_hits is not None]
    ends = window_ends(usable, start, end)
    if ends is None:
        return None
    first, last = ends
    queries = (last.prefix_cache_queries or 0.0) - (first.prefix_cache_queries or 0.0)
    if queries <= 0:
        return None
    return ((last.prefix_cache_hits or 0.0) - (first.prefix_cache_hits or 0.0)) / queries


def cache_from_gauge(samples: Sequence[Any], start: float, end: float) -> float | None:
    """The mean of SGLang's cache_hit_rate gauge over the samples inside [start, end]."""
    xs = [s.cache_hit_rate for s in samples if start <= s.t <= end and s.cache_hit_rate is not None]
    return sum(xs) / len(xs) if xs else None


def prefix_cache_rate(
    c: LevelColumns, samples: Sequence[Any], start: float, end: float
) -> tuple[float | None, str | None]:
    """(hit rate, source): the records' own counts when the server gave them, else its counters,
    else its gauge."""
    if c.cached_n and c.cached_prompt:
        return c.cached_sum / c.cached_prompt, CACHE_FROM_RECORDS
    rate = cache_from_counters(samples, start, end)
    if rate is not None:
        return rate, CACHE_FROM_COUNTERS
    rate = cache_from_gauge(samples, start, end)
    return (rate, CACHE_FROM_GAUGE) if rate is not None else (None, None)
