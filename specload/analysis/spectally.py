"""The per-request acceptance lists of a level's OK requests (``spec_hist``, ``spec_along``), summed.

A level's columns (``columns.LevelColumns``) hold one number per request; these two fields are a
list each, of a length the server chose, so they are summed as they are read instead: the histogram
of accepted tokens per step, and the steps and accepted tokens per bucket of output position. The
figures made of them are in ``specload.analysis.acceptance``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

Ints = npt.NDArray[np.int64]
_MAX_LEN = 1 << 16  # a histogram or a bucket index beyond this is not a server's: left out


def _grow(a: Ints, n: int, width: int = 0) -> Ints:
    if len(a) >= n:
        return a
    shape = (n, width) if width else (n,)
    out = np.zeros(shape, dtype=np.int64)
    out[: len(a)] = a
    return out


class SpecTally:
    """``hist[j]``: steps that accepted j draft tokens; ``along[b]``: (steps, accepted) of the steps
    starting in output bucket b (records.SPEC_ALONG_BUCKET positions); ``hist_requests`` and
    ``along_requests``: the OK requests that carried each."""

    def __init__(self) -> None:
        self.hist: Ints = np.zeros(0, dtype=np.int64)
        self.along: Ints = np.zeros((0, 2), dtype=np.int64)
        self.hist_requests = 0
        self.along_requests = 0

    def add(self, recs: Sequence[Any], ok: Sequence[bool]) -> None:
        for r, good in zip(recs, ok, strict=True):
            if not good:
                continue
            h = r.spec_hist
            if h and len(h) < _MAX_LEN and all(type(x) is int and x >= 0 for x in h):
                self.hist = _grow(self.hist, len(h))
                self.hist[: len(h)] += np.asarray(h, dtype=np.int64)
                self.hist_requests += 1
            a = r.spec_along
            if a:
                try:
                    cells = np.asarray(a, dtype=np.int64).reshape(-1, 3)
                except (ValueError, TypeError):
                    continue
                if cells.min() < 0 or cells[:, 0].max() >= _MAX_LEN:
                    continue
                self.along = _grow(self.along, int(cells[:, 0].max()) + 1, 2)
                np.add.at(self.along, cells[:, 0], cells[:, 1:])
                self.along_requests += 1

    def merge(self, other: SpecTally) -> None:
        if len(other.hist):
            self.hist = _grow(self.hist, len(other.hist))
            self.hist[: len(other.hist)] += other.hist
        if len(other.along):
            self.along = _grow(self.along, len(other.along), 2)
            self.along[: len(other.along)] += other.along
        self.hist_requests += other.hist_requests
        self.along_requests += other.along_requests
