"""The workload a level actually sent: its length distributions, its request classes and its
conversation turns, and how much of its prompts the server's prefix cache served.

Pure functions over a level's columns (``columns.LevelColumns``; a class's or a turn's requests
are the level's columns where its label is) and the run's server samples
(``metrics.ServerSample``, read by attribute). ``metrics.summarize`` calls these for every
level, whichever way it was read, and summarizes each part (a class, a turn, a category) as it
summarizes the level. The definitions are in
docs/metrics.md ("Request lengths", "Request classes and conversation turns", "Prefix cache hit rate").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from specload.analysis.acceptance import counter_delta
from specload.analysis.columns import LevelColumns
from specload.core.records import FAILED, OK
from specload.core.stats import percentiles

Floats = npt.NDArray[np.float64]

# Where the prefix cache hit rate came from (figures' prefix_hit, LevelStats.sources).
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


def lengths_of(c: LevelColumns) -> dict[str, LengthSummary]:
    """The summary of each of a level's (or a part's) LENGTHS."""
    lengths = _lengths(c)
    return {key: summarize(lengths[key]) for key, _ in LENGTHS}


def varied(c: LevelColumns) -> bool:
    """Some length asked for was not the same for every request."""
    return len(np.unique(c.col("req_prompt"))) > 1 or len(np.unique(c.col("req_out"))) > 1


def answers_varied(c: LevelColumns) -> bool:
    """Ok answers of different lengths (natural lengths: the model ended them)."""
    return len(np.unique(c.col("tokens")[c.is_label("status", OK)])) > 1


# The parts of a level the report has a table for: (kind, its LABELS column), in the report's order.
PARTS = (("class", "request_class"), ("turn", "turn"), ("category", "category"))


def parts_of(c: LevelColumns) -> dict[str, list[tuple[Any, npt.NDArray[np.bool_]]]]:
    """Per kind of PARTS, each value's mask of the level's requests (classes and categories in name
    order, turns by number); a kind the level does not have is []."""
    out: dict[str, list[tuple[Any, npt.NDArray[np.bool_]]]] = {}
    for kind, name in PARTS:
        codes = c.codes(name)
        found = [(key, codes == code) for code, key in enumerate(c.labels[name]) if key is not None]
        found = [(key, mask) for key, mask in found if mask.any()]
        out[kind] = sorted(found, key=lambda km: km[0] if kind == "turn" else str(km[0]))
    return out


def _cache_counters(s: Any) -> tuple[float, float] | None:
    q, h = s.prefix_cache_queries, s.prefix_cache_hits
    return None if q is None or h is None else (q, h)


def cache_from_counters(samples: Sequence[Any], start: float, end: float) -> float | None:
    """Δhits / Δqueries of vLLM's prefix cache counters over [start, end], the deltas taken as for the
    accept length (acceptance.counter_delta): from the last sample at or before ``start`` (else the
    first inside) to the last at or before ``end``; None without two such samples or queries."""
    delta = counter_delta(samples, start, end, _cache_counters)
    if delta is None or delta[0] <= 0:
        return None
    return float(delta[1] / delta[0])


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
