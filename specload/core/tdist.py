"""Student's t distribution, exact, without scipy: the comparison's confidence intervals and noise
tests (specload.analysis.comparison) and the SLO's noise test of a mean target (specload.core.slo) share it.
"""

from __future__ import annotations

import math
from functools import lru_cache


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes 6.4).

    Converges in O(sqrt(max(a, b))) terms when x < (a + 1) / (a + b + 2), which the caller ensures.
    """
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 100_000):
        m2 = 2 * m
        for aa in (
            m * (b - m) * x / ((a - 1.0 + m2) * (a + m2)),
            -(a + m) * (a + b + m) * x / ((a + m2) * (a + 1.0 + m2)),
        ):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _reg_inc_beta(a: float, b: float, x: float, y: float) -> float:
    """I_x(a, b), the regularized incomplete beta; ``y`` = 1 − x given separately (no cancellation)."""
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, y) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| > t) for Student's t with ``df`` (real, > 0) degrees of freedom: I_{df/(df+t²)}(df/2, 1/2)."""
    t2 = t * t
    return _reg_inc_beta(df / 2.0, 0.5, df / (df + t2), t2 / (df + t2))


@lru_cache(maxsize=1024)
def t_quantile_975(df: float) -> float:
    """t_{0.975, df} for any real df >= 1 (smaller df are taken as 1), to about 1e-10.

    Found by bisection on the exact two-sided tail (t_two_sided_p): no scipy in the core
    dependencies, and a table with 1.96 above 30 was anti-conservative (2.040 at df = 31).
    """
    df = max(1.0, float(df))
    lo, hi = 0.0, 16.0
    while t_two_sided_p(hi, df) > 0.05:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_two_sided_p(mid, df) > 0.05:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * hi:
            break
    return (lo + hi) / 2.0
