"""Service-level objectives: parse ``--slo``, judge each request and each level. Pure: no I/O.

An SLO is a list of targets such as ``ttft_p99=2s,tpot_p50=50ms``: a latency (``ttft``, ``tpot``,
``itl``, ``e2e``), a statistic (a percentile the report carries, or ``mean``) and a threshold. It
answers two questions per level (docs/metrics.md, "SLOs and goodput", defines both exactly):

- **per request**, as ``vllm bench serve --goodput`` and AIPerf's ``--goodput`` do: a request is
  *good* when it succeeded and each of its own values is within every threshold (its TTFT <= 2 s
  and its TPOT <= 50 ms; for ITL, its own gaps' p99 <= the threshold). Goodput is the good
  requests (and their output tokens) per second of the level's wall time.
- **per level**: the level *met* the SLO when each target's statistic over the level is within
  its threshold (its TTFT p99 <= 2 s, its TPOT p50 <= 50 ms). The percentile says how many
  requests must be within the threshold: 99 % for p99, half for p50. A request that failed, was
  cut short or has no value counts as infinitely slow, so failures cannot make a level pass.

Each level verdict also says whether it is *inside the noise*: whether the requests measured
could as well come from a server whose true statistic is exactly the threshold (a two-sided
binomial test of the count over the threshold, a t test for a mean). That is what the capacity
search reports about its boundary.
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from specload.core import histogram
from specload.core.stats import percentile
from specload.core.tdist import t_quantile_975

METRICS = ("ttft", "tpot", "itl", "e2e")
METRIC_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}
# The percentiles every latency distribution of the report carries (metrics.PERCENTILES; a test
# keeps the two equal: metrics imports this module, so it cannot import metrics).
PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
UNITS = {"ms": 1e-3, "s": 1.0}
ALPHA = 0.05  # the noise tests' level: inside the noise = not rejected at 5 %, two-sided
_EXACT_BINOMIAL_MAX_N = 20_000  # above this many requests the binomial tail is its normal approximation

FORM = (
    "METRIC_STAT=DURATION[,...] with METRIC one of ttft, tpot, itl, e2e; STAT one of "
    + ", ".join(f"p{q:g}" for q in PERCENTILES)
    + " or mean; DURATION a number with its unit, ms or s (e.g. ttft_p99=2s,tpot_p50=50ms)"
)

_NAME = re.compile(r"^(ttft|tpot|itl|e2e)_(mean|p(\d+(?:\.\d+)?))$")
_VALUE = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)(ms|s)$")


class SloError(ValueError):
    """An SLO text that cannot be parsed; the message says which part and the expected form."""


@dataclass(frozen=True)
class Target:
    """One target: ``metric``'s ``q``-th percentile (None: its mean) at most ``threshold_s`` seconds."""

    metric: str
    q: float | None
    threshold_s: float
    text: str = ""  # as written, canonical (``ttft_p99=2s``)

    @property
    def stat(self) -> str:
        return "mean" if self.q is None else f"p{self.q:g}"

    @property
    def key(self) -> str:
        """``ttft_p99``: the target's name in JSON and tables."""
        return f"{self.metric}_{self.stat}"

    @property
    def label(self) -> str:
        """``TTFT p99``: how tables and sentences name the statistic."""
        return f"{METRIC_NAMES[self.metric]} {self.stat}"

    @property
    def threshold_text(self) -> str:
        """The threshold as prose shows it: 2 s, 50 ms."""
        return fmt_duration(self.threshold_s)


@dataclass(frozen=True)
class Slo:
    """The parsed SLO: its targets in the order given."""

    targets: tuple[Target, ...]

    @property
    def text(self) -> str:
        """The canonical text (what run.json's scenario keeps)."""
        return ",".join(t.text for t in self.targets)

    def target(self, metric: str) -> Target | None:
        """The first target on ``metric`` (None: the SLO says nothing about it)."""
        return next((t for t in self.targets if t.metric == metric), None)

    def __str__(self) -> str:
        return self.text


def fmt_duration(seconds: float, digits: int = 3) -> str:
    """A threshold or a value the way people write one: 2 s, 50 ms, 1.25 s (``digits`` significant)."""
    if not math.isfinite(seconds):
        return "∞"
    return f"{seconds:.{digits}g} s" if seconds >= 1 else f"{seconds * 1e3:.{digits}g} ms"


def parse_slo(text: str) -> Slo:
    """``ttft_p99=2s,tpot_p50=50ms`` -> Slo; SloError naming the part that is wrong and the form."""
    if not isinstance(text, str) or not text.strip():
        raise SloError(f"expected {FORM}; got {text!r}")
    targets: list[Target] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = (x.strip().lower() for x in part.partition("="))
        m = _NAME.match(name)
        if not sep or m is None:
            raise SloError(f"{part!r} is not METRIC_STAT=DURATION; expected {FORM}")
        metric, stat, pct = m.group(1), m.group(2), m.group(3)
        q = None if stat == "mean" else float(pct)
        if q is not None and q not in PERCENTILES:
            raise SloError(
                f"{part!r}: p{pct} is not a percentile the report gives "
                f"({', '.join(f'p{x:g}' for x in PERCENTILES)}, or mean)"
            )
        v = _VALUE.match(value.replace(" ", ""))
        if v is None:
            raise SloError(f"{part!r}: the threshold must be a number with its unit, ms or s (e.g. 2s, 50ms)")
        seconds = float(v.group(1)) * UNITS[v.group(2)]
        if seconds <= 0:
            raise SloError(f"{part!r}: the threshold must be above 0")
        key = f"{metric}_{stat}"
        if any(t.key == key for t in targets):
            raise SloError(f"{part!r}: {key} is given twice")
        number = float(v.group(1))
        targets.append(Target(metric, q, seconds, f"{key}={number:g}{v.group(2)}"))
    if not targets:
        raise SloError(f"expected {FORM}; got {text!r}")
    return Slo(tuple(targets))


# ---------------------------------------------------------------- statistics


def _log_pmf(k: int, n: int, p: float) -> float:
    ways = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
    return ways + k * math.log(p) + (n - k) * math.log1p(-p)


def binomial_tails(k: int, n: int, p: float) -> tuple[float, float]:
    """(P(X <= k), P(X >= k)) for X ~ Binomial(n, p); exact up to _EXACT_BINOMIAL_MAX_N, else the
    normal approximation with a continuity correction."""
    if p <= 0.0:
        return 1.0, 1.0 if k <= 0 else 0.0
    if p >= 1.0:
        return (1.0 if k >= n else 0.0), 1.0
    if n > _EXACT_BINOMIAL_MAX_N:
        mu, sd = n * p, math.sqrt(n * p * (1 - p))

        def phi(z: float) -> float:
            return 0.5 * math.erfc(-z / math.sqrt(2))

        return phi((k + 0.5 - mu) / sd), 1.0 - phi((k - 0.5 - mu) / sd)
    pmf = [math.exp(_log_pmf(i, n, p)) for i in range(n + 1)]
    return min(1.0, sum(pmf[: k + 1])), min(1.0, sum(pmf[k:]))


def count_inside_noise(over: int, n: int, q: float) -> bool:
    """``over`` of ``n`` requests above the threshold is what a server whose true q-th percentile
    is exactly the threshold gives often enough (two-sided binomial test at ALPHA not rejected)."""
    if n <= 0:
        return False
    low, high = binomial_tails(over, n, 1.0 - q / 100.0)
    return low > ALPHA / 2 and high > ALPHA / 2


def requests_to_settle(q: float) -> int:
    """The fewest requests that, with none over the threshold, tell a q-th percentile below it
    outside the noise: the smallest n with (q/100)^n <= ALPHA/2 (368 for p99, 36 for p90)."""
    return math.ceil(math.log(ALPHA / 2) / math.log(q / 100.0))


def mean_inside_noise(values: Sequence[float] | Floats, threshold: float) -> bool:
    """The mean of ``values`` is not told from ``threshold`` by a two-sided t test at ALPHA."""
    xs = np.asarray(values, dtype=np.float64)
    n = len(xs)
    if n < 2:
        return n == 1
    m = float(xs.mean())
    sd = float(xs.std(ddof=1))
    return abs(m - threshold) <= t_quantile_975(n - 1) * sd / math.sqrt(n)


# ---------------------------------------------------------------- per request


def request_value(
    metric: str, q: float | None, ttft: float | None, tpot: float | None, e2e: float | None, itl: Any
) -> float | None:
    """A request's own value for a target: its TTFT, TPOT or E2E; for ITL, the q-th percentile
    (or the mean) of its own gaps (from its histogram, like the level's ITL). None: it has none."""
    if metric == "ttft":
        return ttft
    if metric == "tpot":
        return tpot
    if metric == "e2e":
        return e2e
    if not itl:
        return None
    hist = histogram.merge([itl]) if isinstance(itl, list) else itl
    if not hist:
        return None
    return histogram.mean_std(hist)[0] if q is None else histogram.quantile(hist, q)


# ---------------------------------------------------------------- per level


@dataclass(frozen=True)
class TargetResult:
    """One target at one level: the level's statistic and the verdict."""

    target: Target
    value_s: float | None  # the level's statistic (inf: failures make it unbounded); None: nothing measured
    met: bool | None  # value_s <= threshold; None when nothing was measured
    over: int  # requests over the threshold (failed, short and without a value included); ITL: estimated
    n: int  # requests judged (every measured request)
    inside_noise: bool  # the verdict could as well have gone the other way (see count_inside_noise)
    missing: int = 0  # OK requests without a value for this metric (counted as over)

    def to_json(self) -> dict[str, Any]:
        v = self.value_s
        return {
            "target": self.target.text,
            "key": self.target.key,
            "threshold_s": self.target.threshold_s,
            "value_s": None if v is None or math.isinf(v) else v,
            "unbounded": v is not None and math.isinf(v),
            "met": self.met,
            "over": self.over,
            "n": self.n,
            "inside_noise": self.inside_noise,
            "missing": self.missing,
        }


@dataclass(frozen=True)
class Goodput:
    """Requests judged one by one against an SLO, over a wall time (docs/metrics.md, "SLOs and goodput")."""

    sent: int  # measured requests
    good: int  # of them, requests that met every target
    good_tokens: int  # output tokens of the good requests
    wall_s: float | None  # first measured send to last measured end (or a sum of such walls)

    @property
    def good_share(self) -> float | None:
        return self.good / self.sent if self.sent else None

    @property
    def goodput_req_s(self) -> float | None:
        return self.good / self.wall_s if self.wall_s else None

    @property
    def goodput_tok_s(self) -> float | None:
        return self.good_tokens / self.wall_s if self.wall_s else None


@dataclass(frozen=True)
class LevelSlo(Goodput):
    """A level judged against an SLO: per request (good, goodput; its wall is the level's Wall(s))
    and as a whole (met)."""

    slo: Slo
    targets: tuple[TargetResult, ...] = ()

    @property
    def met(self) -> bool | None:
        """Every target met; None when the level measured nothing."""
        if not self.sent or any(t.met is None for t in self.targets):
            return None
        return all(t.met for t in self.targets)

    @property
    def failed_targets(self) -> tuple[TargetResult, ...]:
        return tuple(t for t in self.targets if t.met is False)

    @property
    def inside_noise(self) -> bool:
        """The level's verdict is not settled by its requests: a pass with some target inside the
        noise, or a failure whose every failing target is inside the noise."""
        if self.met is None:
            return False
        if self.met:
            return any(t.inside_noise for t in self.targets)
        return all(t.inside_noise for t in self.failed_targets)

    def to_json(self) -> dict[str, Any]:
        return {
            "slo": self.slo.text,
            "met": self.met,
            "inside_noise": self.inside_noise,
            "sent": self.sent,
            "good": self.good,
            "good_share": self.good_share,
            "good_tokens": self.good_tokens,
            "goodput_req_s": self.goodput_req_s,
            "goodput_tok_s": self.goodput_tok_s,
            "wall_s": self.wall_s,
            "targets": [t.to_json() for t in self.targets],
        }


Floats = npt.NDArray[np.float64]
_COLUMNS = ("ok", "t_send", "t_end", "tokens", "ttft", "tpot", "e2e")


def _count(x: float) -> int | float:
    """A sum of counts as the int it is (a float only when some count was not a whole number)."""
    return int(x) if float(x).is_integer() else float(x)


@dataclass
class SloTally:
    """One level's measured requests as the SLO needs them, as columns (``extend``: a level's
    columns, specload.analysis.columns.slo_tally, whether read from records.jsonl or gathered as
    records arrive during a sweep); ``result`` judges them, the one definition of every figure of
    docs/metrics.md "SLOs and goodput"."""

    slo: Slo
    first_send: float | None = None
    last_end: float | None = None
    itl: histogram.Hist = field(default_factory=dict)  # the OK requests' gaps, merged (the level's ITL)
    itl_requests: int = 0  # OK requests with gaps
    # the columns of each part added (numpy arrays; nan: no value)
    _parts: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def extend(
        self,
        *,
        ok: npt.NDArray[np.bool_],
        t_send: Floats,
        t_end: Floats,
        tokens: Floats,
        ttft: Floats,
        tpot: Floats,
        e2e: Floats,
        itl_values: dict[int, Floats],
        itl: histogram.Hist,
        itl_requests: int,
    ) -> None:
        """Many measured requests as columns (nan: no value); ``itl_values``: per ITL target (its
        index in the SLO), each request's own statistic of its gaps; ``itl``: the OK requests' gaps
        merged, ``itl_requests``: how many OK requests had gaps."""
        if not len(ok):
            return
        lo, hi = float(t_send.min()), float(t_end.max())
        self.first_send = lo if self.first_send is None else min(self.first_send, lo)
        self.last_end = hi if self.last_end is None else max(self.last_end, hi)
        part: dict[str, Any] = dict(zip(_COLUMNS, (ok, t_send, t_end, tokens, ttft, tpot, e2e), strict=True))
        part["itl_values"] = [itl_values[i] for i, t in enumerate(self.slo.targets) if t.metric == "itl"]
        self._parts.append(part)
        for b, c in itl.items():
            self.itl[b] = self.itl.get(b, 0) + c
        self.itl_requests += itl_requests

    def merge(self, other: SloTally) -> None:
        """Another group's requests into this one (a run.json level spread over several groups)."""
        if other.first_send is not None:
            self.first_send = (
                other.first_send if self.first_send is None else min(self.first_send, other.first_send)
            )
        if other.last_end is not None:
            self.last_end = other.last_end if self.last_end is None else max(self.last_end, other.last_end)
        self._parts.append(other._columns())
        for b, c in other.itl.items():
            self.itl[b] = self.itl.get(b, 0) + c
        self.itl_requests += other.itl_requests

    def _columns(self) -> dict[str, Any]:
        """Every request added so far as one set of columns (in the order they were added)."""
        n_itl = sum(t.metric == "itl" for t in self.slo.targets)
        parts = self._parts
        if len(parts) == 1:
            return parts[0]
        out: dict[str, Any] = {
            name: np.concatenate([p[name] for p in parts]) if parts else np.empty(0) for name in _COLUMNS
        }
        out["ok"] = out["ok"].astype(bool)
        out["itl_values"] = (
            [np.concatenate([p["itl_values"][j] for p in parts]) for j in range(n_itl)]
            if parts
            else [np.empty(0)] * n_itl
        )
        return out

    def _judged(self) -> tuple[dict[str, Any], list[Floats], list[int], npt.NDArray[np.bool_]]:
        """The columns; per target each request's value (+inf: failed, short or without one) and the
        OK requests without a value; which requests were good (OK and within every threshold)."""
        cols = self._columns()
        ok = cols["ok"]
        values, missing = [], []
        good = ok.copy()
        itl = iter(cols["itl_values"])
        for t in self.slo.targets:
            v = next(itl) if t.metric == "itl" else cols[t.metric]
            has = ok & ~np.isnan(v)
            values.append(np.where(has, v, math.inf))
            missing.append(int(np.count_nonzero(ok) - np.count_nonzero(has)))
            good &= has & (v <= t.threshold_s)
        return cols, values, missing, good

    @property
    def sent(self) -> int:
        return len(self._columns()["ok"])

    @property
    def values(self) -> list[array]:
        """Per target (in SLO order): each measured request's own value, +inf when failed, short or
        without one."""
        return [array("d", v.tolist()) for v in self._judged()[1]]

    def result(self) -> LevelSlo:
        cols, values, missing, good = self._judged()
        n = len(cols["ok"])
        bad = n - int(np.count_nonzero(cols["ok"]))
        good_tokens = _count(np.maximum(cols["tokens"][good], 0).sum())
        wall = None
        if self.first_send is not None and self.last_end is not None and self.last_end > self.first_send:
            wall = self.last_end - self.first_send
        targets = tuple(
            self._judge(t, n, bad, v, m) for t, v, m in zip(self.slo.targets, values, missing, strict=True)
        )
        return LevelSlo(n, int(np.count_nonzero(good)), good_tokens, wall, slo=self.slo, targets=targets)  # type: ignore[arg-type]

    def _judge(self, t: Target, n: int, bad: int, vals: Floats, missing: int) -> TargetResult:
        if n == 0:
            return TargetResult(t, None, None, 0, 0, False)
        if t.metric == "itl":
            return self._judge_itl(t, n, bad, vals, missing)
        over = int(np.count_nonzero(vals > t.threshold_s))
        if t.q is None:
            finite = vals[np.isfinite(vals)]
            value = math.inf if len(finite) < n else float(finite.sum()) / n
            noise = math.isfinite(value) and mean_inside_noise(finite, t.threshold_s)
        else:
            value = percentile(vals, t.q) or 0.0
            noise = count_inside_noise(over, n, t.q)
        return TargetResult(t, value, value <= t.threshold_s, over, n, noise, missing)

    def _judge_itl(self, t: Target, n: int, bad: int, vals: Floats, missing: int) -> TargetResult:
        """ITL: the level's pooled gaps (the report's ITL figure). A failed or short request has no
        gaps to pool, so it counts as a request over the threshold; the count over the threshold is
        the pooled share over it times the OK requests (gaps of one request are not independent:
        the requests are the sample), plus the failed and short ones."""
        gaps = histogram.count(self.itl)
        if gaps == 0:
            return TargetResult(t, math.inf, False, n, n, False, missing)
        share_over = sum(c for b, c in self.itl.items() if histogram.centre(b) > t.threshold_s) / gaps
        over = min(n, round(share_over * self.itl_requests) + bad + missing)
        if t.q is None:
            mean, _ = histogram.mean_std(self.itl)
            value = math.inf if bad or missing else (mean or 0.0)
            noise = math.isfinite(value) and mean_inside_noise(vals[np.isfinite(vals)], t.threshold_s)
        else:
            allowed = n * (1.0 - t.q / 100.0)
            value = math.inf if bad + missing > allowed else (histogram.quantile(self.itl, t.q) or 0.0)
            noise = count_inside_noise(over, n, t.q)
        return TargetResult(t, value, value <= t.threshold_s, over, n, noise, missing)
