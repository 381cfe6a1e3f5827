"""The percentile every exact figure of specload uses (docs/metrics.md, "Percentiles"), once.

Linear interpolation between closest ranks, numpy's default ``method="linear"`` (what ``vllm bench
serve`` reports): p = q/100 · (n − 1), x⌊p⌋ + (x⌊p⌋+1 − x⌊p⌋)(p − ⌊p⌋). The order statistics come
from ``np.partition`` (no full sort), and the interpolation is written out rather than left to
``np.percentile`` because a value may be +inf (a failed request judged against an SLO): the result
is then +inf as soon as the interpolation touches one, where numpy's own gives nan.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]


def percentiles(values: Floats | Sequence[float], qs: Iterable[float]) -> list[float | None]:
    """The q-th percentile (0..100) of ``values`` (no nan among them) for each q; None when empty."""
    xs = np.asarray(values, dtype=np.float64)
    qs = list(qs)
    n = len(xs)
    if not n:
        return [None for _ in qs]
    spots = []
    for q in qs:
        if not 0.0 <= q <= 100.0:
            raise ValueError(f"percentile q must be within [0, 100], got {q}")
        pos = (n - 1) * q / 100.0
        lo = math.floor(pos)
        spots.append((lo, min(lo + 1, n - 1), pos - lo))
    places = sorted({i for lo, hi, _ in spots for i in (lo, hi)})
    part = np.partition(xs, places) if n > 1 else xs
    out: list[float | None] = []
    for lo, hi, frac in spots:
        a, b = float(part[lo]), float(part[hi])
        if frac == 0.0 or a == b:
            out.append(a)
        elif math.isinf(b):
            out.append(math.inf)
        else:
            out.append(a + (b - a) * frac)
    return out


def percentile(values: Floats | Sequence[float], q: float) -> float | None:
    """``percentiles`` for one q."""
    return percentiles(values, (q,))[0]
