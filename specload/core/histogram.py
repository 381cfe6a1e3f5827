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
from typing import Any

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
        if _usable(pair):
            out[pair[0]] = get(pair[0], 0) + pair[1]


def _usable(pair: Sequence[int]) -> bool:
    """A well-formed ``[bin, count]``: two ints, the count above zero."""
    return len(pair) == 2 and isinstance(pair[0], int) and isinstance(pair[1], int) and pair[1] > 0


class _Malformed(Exception):
    """A pair that ``merge_into`` would skip (or a bin beyond the fast path's list)."""


class Counts:
    """Many requests' ``[[bin, count], ...]`` summed as they come: what ``merge`` gives, made faster.

    The counts of bins 0 to ``SPAN - 1`` (every gap from 10 µs to days) are kept in a list indexed by
    bin, any other bin in a dict, and every bin once, in the order it was first seen: ``hist()`` is
    then the dict ``merge`` would have built, its key order included (``mean_std`` sums the bins in
    that order, so the order is part of the result). ``add`` sums a batch of requests in one loop
    into a scratch list, and adds that when every pair was well-formed (two ints, bin 0 to
    ``SPAN - 1``, count > 0); otherwise it goes pair by pair with ``merge_into``'s checks.
    """

    SPAN = 4096
    __slots__ = ("_list", "_other", "order")

    def __init__(self) -> None:
        self._list = [0] * self.SPAN
        self._other: Hist = {}
        self.order: list[int] = []

    def add(self, pairs_list: Iterable[Sequence[Sequence[int]]]) -> None:
        """``merge_into`` of each request's pairs in turn (each request's a non-empty list, as JSON
        gives them: a pair is a list, or something the fast loop cannot unpack into two numbers)."""
        pairs_list = list(pairs_list)
        scratch, seen = [0] * self.SPAN, []
        try:
            for pairs in pairs_list:
                for b, c in pairs:  # a pair of another length or type raises
                    if c <= 0 or b < 0:
                        raise _Malformed
                    was = scratch[b]  # a bin beyond the list raises
                    if was:
                        scratch[b] = was + c
                    else:  # (a bool count stays a bool here: not an int, so pair by pair below)
                        seen.append(b)
                        scratch[b] = c
            for b in seen:
                if type(scratch[b]) is not int:  # a float count was added
                    raise _Malformed
        except (_Malformed, TypeError, ValueError, IndexError):
            for pairs in pairs_list:
                for pair in pairs:
                    if _usable(pair):
                        self._add_one(pair[0], pair[1])
            return
        for b in seen:
            self._add_one(b, scratch[b])

    def add_flat(self, bins: Any, counts: Any) -> None:
        """Pairs given as two integer arrays (numpy), every one well-formed (bin 0 to ``SPAN - 1``,
        count > 0), in the order they came: what ``add`` of them gives (bins in first-seen order)."""
        import numpy as np

        uniq, first = np.unique(bins, return_index=True)
        totals = np.bincount(bins, weights=counts, minlength=self.SPAN)  # exact: counts far below 2**53
        for b in uniq[np.argsort(first, kind="stable")].tolist():
            self._add_one(b, int(totals[b]))

    def _add_one(self, b: int, c: int) -> None:
        if 0 <= b < self.SPAN:
            if not self._list[b]:
                self.order.append(b)
            self._list[b] += c
        else:
            if b not in self._other:
                self.order.append(b)
            self._other[b] = self._other.get(b, 0) + c

    def merge(self, other: Counts) -> None:
        """Add another one's counts (its bins in its first-seen order)."""
        for b, c in other.hist().items():
            self._add_one(b, c)

    def hist(self) -> Hist:
        """The counts as ``merge`` gives them: bin -> count, bins in first-seen order."""
        acc, other = self._list, self._other
        return {b: acc[b] if 0 <= b < self.SPAN else other[b] for b in self.order}


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
