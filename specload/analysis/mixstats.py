"""The workload a level actually sent: its length distributions, its request classes and its
conversation turns, and how much of its prompts the server's prefix cache served.

Pure functions over a level's columns (``columns.LevelColumns``; a class's or a turn's requests
are the level's columns where its label is) and the run's server samples
(``metrics.ServerSample``, read by attribute). ``metrics.level_stats`` calls ``mix_stats`` and
``prefix_cache_rate`` for every level, whichever way it was read. The definitions are in
docs/metrics.md ("Request lengths", "Request classes and conversation turns", "Prefix cache hit rate").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from specload.analysis.acceptance import acceptance
from specload.analysis.columns import LevelColumns
from specload.core.counters import window_ends
from specload.core.records import FAILED, OK, SHORT
from specload.core.stats import percentile, percentiles

Floats = npt.NDArray[np.float64]

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


def summarize(values: Floats) -> LengthSummary:
    """A length's summary over the values (nan: none), percentiles as every percentile of specload
    (specload.core.stats)."""
    xs = values[~np.isnan(values)]
    n = len(xs)
    if not n:
        return LengthSummary()
    p50, p90 = percentiles(xs, (50.0, 90.0))
    return LengthSummary(n, float(xs.sum()) / n, p50, p90, float(xs.max()))


def summarize_counts(counts: Mapping[Any, int]) -> LengthSummary:
    """``summarize`` of values given as value -> how many times."""
    items = [(v, k) for v, k in counts.items() if v is not None and k > 0]
    return summarize(np.repeat(np.array([v for v, _ in items], dtype=np.float64), [k for _, k in items]))


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
    # The group's own accept length from its records (accept_length_of; docs/metrics.md, "Prompt categories")
    accept_length: float | None = None
    accept_length_requests: int = 0


@dataclass
class MixStats:
    """A level's workload as sent: its lengths, and per class and per turn (empty when there are none)."""

    lengths: dict[str, LengthSummary] = field(default_factory=dict)
    varied: bool = False  # some length asked for was not the same for every request
    classes: list[GroupStats] = field(default_factory=list)
    turns: list[GroupStats] = field(default_factory=list)
    categories: list[GroupStats] = field(default_factory=list)  # a categorised dataset's row categories


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


def _lengths(c: LevelColumns) -> dict[str, Floats]:
    """The four lengths of a level's requests (LENGTHS; nan where a request has none)."""
    got = ~c.is_label("status", FAILED)
    nan = np.full(c.sent, np.nan)
    return {
        "input_sent": c.col("req_prompt"),
        "input_counted": np.where(got, c.col("prompt"), nan),
        "output_asked": c.col("req_out"),
        "output_received": np.where(got, c.col("tokens"), nan),
    }


def _cached(c: LevelColumns) -> tuple[int, float, float]:
    """(requests, cached tokens, their prompt tokens) of the not-failed requests that said both."""
    said = ~c.is_label("status", FAILED) & ~np.isnan(c.col("prompt")) & ~np.isnan(c.col("cached"))
    return int(said.sum()), float(c.col("cached")[said].sum()), float(c.col("prompt")[said].sum())


def accept_length_of(c: LevelColumns) -> tuple[float | None, int]:
    """(accept length, requests used) of a part of a level (a category's requests), by the level's
    own definition (specload.analysis.acceptance, from the records only); (None, 0) without one."""
    a = acceptance(c, (), 0.0, 0.0)
    return (a.length, a.requests) if a is not None and a.length is not None else (None, 0)


def group_stats(key: Any, c: LevelColumns, level_sent: int, wall: float | None) -> GroupStats:
    """One class's (or turn's) figures from its columns; ``wall``: the level's wall time."""
    status = c.codes("status")
    ok = c.is_label("status", OK)
    g = GroupStats(
        key,
        c.sent,
        c.sent / level_sent if level_sent else None,
        int(ok.sum()),
        int(c.is_label("status", FAILED).sum()),
        int(c.is_label("status", SHORT).sum()),
    )
    del status
    lengths = _lengths(c)
    g.input_mean = summarize(lengths["input_sent"]).mean
    g.input_counted_mean = summarize(lengths["input_counted"]).mean
    g.output_mean = summarize(lengths["output_received"]).mean
    total = float(np.maximum(c.col("tokens"), 0).sum())
    g.output_tokens = int(total) if total.is_integer() else total  # type: ignore[assignment]
    if wall:
        g.agg_tok_s, g.req_s = g.output_tokens / wall, g.ok / wall
    e2e = c.col("e2e")
    with np.errstate(divide="ignore", invalid="ignore"):
        per_req = (c.col("tokens") / e2e)[ok & (e2e > 0)]
    g.per_req_tok_s = float(per_req.mean()) if len(per_req) else None
    ttft_p50, ttft_p99 = percentiles(c.present("ttft", ok), (50.0, 99.0))
    g.ttft_p50_ms, g.ttft_p99_ms = _ms(ttft_p50), _ms(ttft_p99)
    g.tpot_p50_ms, g.e2e_p50_s = _ms(percentile(c.present("tpot", ok), 50.0)), percentile(e2e[ok], 50.0)
    n, cached, prompt = _cached(c)
    g.prefix_cache_hit_rate = cached / prompt if n and prompt else None
    g.accept_length, g.accept_length_requests = accept_length_of(c)
    return g


def mix_stats(c: LevelColumns, wall: float | None) -> MixStats:
    lengths = _lengths(c)
    m = MixStats(lengths={key: summarize(lengths[key]) for key, _ in LENGTHS})
    m.varied = len(np.unique(lengths["input_sent"])) > 1 or len(np.unique(lengths["output_asked"])) > 1
    groups = []
    for kind, name in (("class", "request_class"), ("turn", "turn"), ("category", "category")):
        codes = c.codes(name)
        for code, key in enumerate(c.labels[name]):
            mine = codes == code
            if key is not None and mine.any():
                groups.append(((kind, key), c.subset(mine)))
    lists = {"class": m.classes, "turn": m.turns, "category": m.categories}
    for (kind, key), group in sorted(groups, key=lambda kv: (kv[0][0], str(kv[0][1]))):
        lists[kind].append(group_stats(key, group, c.sent, wall))
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
    c: LevelColumns, samples: Sequence[Any], start: float, end: float, counters_end: float | None = None
) -> tuple[float | None, str | None]:
    """(hit rate, source): the records' own counts when the server gave them, else its counters
    (their deltas up to ``counters_end``, metrics.counter_window_end; default ``end``), else its gauge."""
    n, cached, prompt = _cached(c)
    if n and prompt:
        return cached / prompt, CACHE_FROM_RECORDS
    rate = cache_from_counters(samples, start, end if counters_end is None else counters_end)
    if rate is not None:
        return rate, CACHE_FROM_COUNTERS
    rate = cache_from_gauge(samples, start, end)
    return (rate, CACHE_FROM_GAUGE) if rate is not None else (None, None)
