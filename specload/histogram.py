"""Log-binned histograms: the inter-token gaps of every request, kept small and merged exactly.

A request's gaps are kept as counts per bin, bins growing by ``RATIO`` (2%) from ``FLOOR_S``:
a 1000-token reply with a steady decoder fills a handful of bins, so a record grows by tens of
bytes, not by a list of 1000 gaps. Merging records adds counts, so a level's distribution is
exact up to the bin width: any percentile read from it is within ``RATIO``/2 (1%) of the true
value (each bin reports its geometric centre). Gaps below ``FLOOR_S`` share bin 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

RATIO = 1.02
FLOOR_S = 1e-5
_LOG_RATIO = math.log(RATIO)
MAX_REL_ERROR = math.sqrt(RATIO) - 1  # a bin's centre is at most this far (relatively) from any value in it

Hist = dict[int, int]  # bin -> count


def bin_of(x: float) -> int:
    return int(math.log(x / FLOOR_S) / _LOG_RATIO) if x > FLOOR_S else 0


def centre(b: int) -> float:
    """The bin's geometric centre: the value a percentile falling in it reports."""
    return FLOOR_S * RATIO ** (b + 0.5)


def to_pairs(hist: Hist) -> list[list[int]]:
    """The wire and file form: ``[[bin, count], ...]`` sorted (JSON objects need string keys)."""
    return [[b, hist[b]] for b in sorted(hist)]


def merge(pairs_list: Iterable[Sequence[Sequence[int]] | None]) -> Hist:
    """Sum of many requests' ``[[bin, count], ...]``; malformed pairs are skipped."""
    out: Hist = {}
    for pairs in pairs_list:
        merge_into(out, pairs)
    return out


def merge_into(out: Hist, pairs: Sequence[Sequence[int]] | None) -> None:
    """Add one request's ``[[bin, count], ...]`` to ``out``; malformed pairs are skipped."""
    get = out.get
    for pair in pairs or ():
        if len(pair) == 2 and isinstance(pair[0], int) and isinstance(pair[1], int) and pair[1] > 0:
            out[pair[0]] = get(pair[0], 0) + pair[1]


def count(hist: Hist) -> int:
    return sum(hist.values())


def quantile(hist: Hist, q: float) -> float | None:
    """The q-th percentile (0..100): the centre of the bin holding that rank (nearest rank)."""
    n = count(hist)
    if n == 0:
        return None
    rank = max(1, math.ceil(q / 100.0 * n))
    seen = 0
    for b in sorted(hist):
        seen += hist[b]
        if seen >= rank:
            return centre(b)
    return centre(max(hist))


def mean_std(hist: Hist) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation, each bin counted at its centre."""
    n = count(hist)
    if n == 0:
        return None, None
    m = sum(centre(b) * c for b, c in hist.items()) / n
    if n < 2:
        return m, None
    var = sum(c * (centre(b) - m) ** 2 for b, c in hist.items()) / (n - 1)
    return m, math.sqrt(var)
