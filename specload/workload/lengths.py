"""Request lengths from a distribution: the syntax of ``--input-dist`` / ``--output-dist`` and the draw.

Production traffic does not send 1000-token prompts only; a length distribution says how long each
request's prompt (or answer) is. One spec string per distribution, parsed once and checked before
any traffic (``LengthError`` names what is wrong; ``config`` turns it into an error naming the field):

- ``fixed``: every request the scenario's (or its class's) ``input_tokens`` / ``output_tokens``
- ``uniform:MIN:MAX``: an integer from MIN to MAX, both included, each equally likely
- ``normal:mean=M,sd=S[,min=A][,max=B]``: N(M, S) rounded to the nearest integer, then clipped to [A, B]
- ``lognormal:mean=M,sigma=S[,min=A][,max=B]`` (or ``median=M`` instead of ``mean``): exp(N(mu, S))
  rounded and clipped, mu chosen so that the unclipped distribution has that mean (mu = ln M - S²/2)
  or that median (mu = ln M)
- ``dataset``: the dataset's own lengths (``--dataset``)

``min`` defaults to 1 and ``max`` to no bound. A value outside the bounds is set to the bound
(clipped, not drawn again), so ``P(length = max)`` is the whole tail above it.

The draw is a pure function of uniforms in [0, 1): ``draw(u1, u2)``. The caller gets them from a
``random.Random`` seeded by (seed, level, phase, seq), so every Locust process that builds request
k draws the same lengths for it, and a rerun with the same seed sends the same lengths.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

FIXED, UNIFORM, NORMAL, LOGNORMAL, DATASET = "fixed", "uniform", "normal", "lognormal", "dataset"
KINDS = (FIXED, UNIFORM, NORMAL, LOGNORMAL, DATASET)
SYNTAX = (
    "fixed, uniform:MIN:MAX, normal:mean=M,sd=S[,min=A][,max=B], "
    "lognormal:mean=M,sigma=S[,min=A][,max=B] (or median=M), or dataset"
)


class LengthError(ValueError):
    """A length distribution spec that cannot be used; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class LengthDist:
    """A parsed length distribution (see the module docstring for each kind's parameters)."""

    kind: str
    lo: int = 1  # uniform MIN, or the lower bound of normal / lognormal
    hi: int | None = None  # uniform MAX, or the upper bound (None: none)
    mean: float = 0.0  # normal: its mean; lognormal: mu of the underlying normal
    sd: float = 0.0  # normal: its standard deviation; lognormal: sigma
    text: str = FIXED  # the canonical spec, as written back to run.json and flags

    @property
    def fixed(self) -> bool:
        """The request takes the class's fixed length (or the dataset's): nothing is drawn."""
        return self.kind in (FIXED, DATASET)

    def draw(self, u1: float, u2: float, fixed: int) -> int:
        """One length from two uniforms in [0, 1); ``fixed`` is the length of a ``fixed`` kind."""
        kind = self.kind
        if kind == UNIFORM:
            assert self.hi is not None
            return min(self.hi, self.lo + int(u1 * (self.hi - self.lo + 1)))
        if kind in (NORMAL, LOGNORMAL):
            # Box-Muller: 1 - u1 lies in (0, 1], so the log is finite.
            z = math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2)
            x = self.mean + self.sd * z
            if kind == LOGNORMAL:
                x = math.exp(min(x, 700.0))
            n = int(math.floor(x + 0.5))
            n = max(self.lo, n)
            return n if self.hi is None else min(self.hi, n)
        return fixed

    def minimum(self, fixed: int) -> int:
        """The shortest length this distribution can give (``fixed``'s own for fixed)."""
        return self.lo if not self.fixed else fixed


def _int(spec: str, what: str, raw: str) -> int:
    try:
        v = int(raw)
    except ValueError:
        raise LengthError(f"{what} must be an integer, got {raw!r} in {spec!r}") from None
    return v


def _num(spec: str, what: str, raw: str) -> float:
    try:
        v = float(raw)
    except ValueError:
        raise LengthError(f"{what} must be a number, got {raw!r} in {spec!r}") from None
    if not math.isfinite(v):
        raise LengthError(f"{what} must be finite, got {raw!r} in {spec!r}")
    return v


def _bounds(spec: str, params: dict[str, str]) -> tuple[int, int | None]:
    lo = _int(spec, "min", params.pop("min")) if "min" in params else 1
    hi = _int(spec, "max", params.pop("max")) if "max" in params else None
    if lo < 1:
        raise LengthError(f"min must be >= 1, got {lo} in {spec!r}")
    if hi is not None and hi < lo:
        raise LengthError(f"max must be >= min ({lo}), got {hi} in {spec!r}")
    return lo, hi


def _params(spec: str, body: str, allowed: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in body.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise LengthError(f"expected KEY=VALUE pairs separated by commas, got {part!r} in {spec!r}")
        if key not in allowed:
            raise LengthError(f"unknown parameter {key!r} in {spec!r} (known: {', '.join(allowed)})")
        if key in out:
            raise LengthError(f"parameter {key!r} given twice in {spec!r}")
        out[key] = value
    return out


def _tail(lo: int, hi: int | None) -> str:
    return (f",min={lo}" if lo != 1 else "") + (f",max={hi}" if hi is not None else "")


def parse_dist(spec: str) -> LengthDist:
    """The distribution a spec string means; LengthError (naming the problem) for anything else."""
    if not isinstance(spec, str):
        raise LengthError(f"expected a string, got {spec!r}")
    s = spec.strip()
    kind, _, body = s.partition(":")
    kind = kind.strip().lower()
    if kind in (FIXED, DATASET):
        if body:
            raise LengthError(f"{kind!r} takes no parameters, got {spec!r}")
        return LengthDist(kind, text=kind)
    if kind == UNIFORM:
        parts = body.split(":")
        if len(parts) != 2:
            raise LengthError(f"expected uniform:MIN:MAX, got {spec!r}")
        low, high = _int(spec, "MIN", parts[0].strip()), _int(spec, "MAX", parts[1].strip())
        if low < 1 or high < low:
            raise LengthError(f"expected 1 <= MIN <= MAX, got {spec!r}")
        return LengthDist(UNIFORM, low, high, text=f"uniform:{low}:{high}")
    if kind == NORMAL:
        p = _params(spec, body, ("mean", "sd", "min", "max"))
        if "mean" not in p or "sd" not in p:
            raise LengthError(f"normal needs mean= and sd=, got {spec!r}")
        mean, sd = _num(spec, "mean", p.pop("mean")), _num(spec, "sd", p.pop("sd"))
        if sd < 0:
            raise LengthError(f"sd must be >= 0, got {sd:g} in {spec!r}")
        lo, hi = _bounds(spec, p)
        return LengthDist(NORMAL, lo, hi, mean, sd, f"normal:mean={mean:g},sd={sd:g}{_tail(lo, hi)}")
    if kind == LOGNORMAL:
        p = _params(spec, body, ("mean", "median", "sigma", "min", "max"))
        if ("mean" in p) == ("median" in p) or "sigma" not in p:
            raise LengthError(f"lognormal needs sigma= and one of mean= or median=, got {spec!r}")
        sigma = _num(spec, "sigma", p.pop("sigma"))
        if sigma < 0:
            raise LengthError(f"sigma must be >= 0, got {sigma:g} in {spec!r}")
        which = "mean" if "mean" in p else "median"
        centre = _num(spec, which, p.pop(which))
        if centre <= 0:
            raise LengthError(f"{which} must be > 0, got {centre:g} in {spec!r}")
        lo, hi = _bounds(spec, p)
        mu = math.log(centre) - (sigma * sigma / 2.0 if which == "mean" else 0.0)
        return LengthDist(
            LOGNORMAL, lo, hi, mu, sigma, f"lognormal:{which}={centre:g},sigma={sigma:g}{_tail(lo, hi)}"
        )
    raise LengthError(f"expected one of {SYNTAX}; got {spec!r}")


def expected_mean(d: LengthDist, fixed: int) -> float:
    """The mean length the distribution gives, clipping and rounding included (for the report's
    check against what was sent and for tests); exact for fixed and uniform, by numeric
    integration over the rounded values for normal and lognormal."""
    if d.fixed:
        return float(fixed)
    if d.kind == UNIFORM:
        assert d.hi is not None
        return (d.lo + d.hi) / 2.0
    total = 0.0
    # P(round(X) = n) summed over the integers between the bounds' quantiles; clipped mass at the bounds.
    cdf = _cdf(d)
    lo_mass = cdf(d.lo + 0.5)
    total += d.lo * lo_mass
    top = d.hi if d.hi is not None else _quantile_bound(d)
    for n in range(d.lo + 1, top):
        total += n * (cdf(n + 0.5) - cdf(n - 0.5))
    if top > d.lo:
        total += top * (1.0 - cdf(top - 0.5))
    return total


def _cdf(d: LengthDist) -> Callable[[float], float]:
    def normal(x: float) -> float:
        return 0.5 * math.erfc(-(x - d.mean) / (d.sd * math.sqrt(2.0))) if d.sd > 0 else float(x >= d.mean)

    if d.kind == NORMAL:
        return normal
    return lambda x: normal(math.log(x)) if x > 0 else 0.0


def _quantile_bound(d: LengthDist) -> int:
    """An integer above which the unbounded distribution has no mass worth counting (1e-12)."""
    cdf, n = _cdf(d), max(d.lo + 1, 2)
    while 1.0 - cdf(n) > 1e-12:
        n *= 2
    return n
