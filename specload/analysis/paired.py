"""Two replays of one trace, paired request by request: ``paired_comparison(base, new) -> PairedComparison``.

A trace replay sends the same requests (the same lengths, prefixes, text and due times) to each arm,
and every record keeps its row in the trace (``trace_index``). The same request's TTFT in two arms
differs by what the arms do, not by which request it was, so the per-request differences have far
less spread than the two arms' values: their median is known much more tightly than the difference
of the two arms' medians, and both are shown so that the gain from pairing is visible.
docs/metrics.md, "Paired comparison (trace replay)", defines every figure; this module is its one
implementation. Pure apart from ``ArmRecords.of_runs``, which reads the runs' records.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from specload.analysis.columns import LevelColumns, itl_qs, slo_tally
from specload.analysis.run import Run
from specload.core.records import OK, PHASE_MEASURE, RequestRecord
from specload.core.rundir import RECORDS
from specload.core.safeopen import open_regular
from specload.core.slo import Goodput, Slo

Floats = npt.NDArray[np.float64]

# The paired figures: (key, name, unit scale for text, lower is faster).
FIGURES: tuple[tuple[str, str, float, bool], ...] = (
    ("ttft", "TTFT (ms)", 1e3, True),
    ("tpot", "TPOT (ms)", 1e3, True),
    ("e2e", "E2E (ms)", 1e3, True),
    ("per_req_tok_s", "Per-req tok/s", 1.0, False),
)
_FIELD = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s", "per_req_tok_s": "per_request_tok_s"}
LEVEL = 0.95  # every interval here is a 95 % interval
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0  # a fixed seed: the same runs give the same unpaired interval every time
BUCKETS = 4  # length buckets per axis: the quartiles of the paired requests' lengths

# Why a request of the trace window is not paired (either arm's side), in the order reports list them.
MISSING_BASE = "not sent by the baseline"
MISSING_NEW = "not sent by the treatment"
NOT_OK_BASE = "failed or short in the baseline"
NOT_OK_NEW = "failed or short in the treatment"
REASONS = (NOT_OK_BASE, NOT_OK_NEW, MISSING_BASE, MISSING_NEW)


# ---------------------------------------------------------------- intervals


@dataclass(frozen=True)
class Interval:
    """A 95 % interval [lo, hi] of a median (or of a difference of medians)."""

    lo: float
    hi: float

    @property
    def width(self) -> float:
        return self.hi - self.lo


def median_rank(n: int, level: float = LEVEL) -> int | None:
    """The rank k (1-based) of the order-statistic interval [x_(k), x_(n+1-k)] of a median: the largest
    k with P(B <= k - 1) <= (1 - level) / 2 for B ~ Binomial(n, 1/2), so that the interval covers the
    true median with probability >= level whatever the distribution. None when even [x_(1), x_(n)]
    covers less (n <= 5 at 95 %)."""
    if n < 1:
        return None
    j = np.arange(n + 1, dtype=np.float64)
    log_pmf = (
        math.lgamma(n + 1)
        - np.array([math.lgamma(x + 1) + math.lgamma(n - x + 1) for x in j])
        - n * math.log(2.0)
    )
    cdf = np.cumsum(np.exp(log_pmf))
    below = np.flatnonzero(cdf <= (1.0 - level) / 2.0)  # j = k - 1 with P(B <= j) small enough
    if len(below) == 0:
        return None
    return int(below[-1]) + 1


def median_interval(values: Floats, level: float = LEVEL) -> Interval | None:
    """The distribution-free interval of the median of ``values`` (median_rank); None when too few."""
    n = len(values)
    k = median_rank(n, level)
    if k is None:
        return None
    xs = np.sort(values)
    return Interval(float(xs[k - 1]), float(xs[n - k]))


def bootstrap_median_difference(
    base: Floats,
    new: Floats,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = LEVEL,
) -> Interval | None:
    """The percentile bootstrap interval of median(new) − median(base), each arm resampled on its own
    (the arms taken as independent samples: what two unpaired sweeps would give). None when an arm
    has fewer than two values."""
    if len(base) < 2 or len(new) < 2:
        return None
    rng = np.random.default_rng(seed)
    diffs = np.empty(resamples)
    step = max(1, 2_000_000 // max(len(base), len(new)))  # rows per chunk: a few tens of MB at most
    for start in range(0, resamples, step):
        rows = min(step, resamples - start)
        mb = np.median(base[rng.integers(0, len(base), (rows, len(base)))], axis=1)
        mn = np.median(new[rng.integers(0, len(new), (rows, len(new)))], axis=1)
        diffs[start : start + rows] = mn - mb
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(diffs, [tail, 100.0 - tail])
    return Interval(float(lo), float(hi))


# ---------------------------------------------------------------- the records of one arm


@dataclass(frozen=True)
class ArmRecords:
    """One arm's measured trace records, per run (an experiment's repeats are several runs; a run's
    own ``--repeat`` repeats are in its list). Records without a ``trace_index`` are left out."""

    label: str
    runs: tuple[tuple[RequestRecord, ...], ...]

    @classmethod
    def of(cls, label: str, runs: Iterable[Iterable[RequestRecord]]) -> ArmRecords:
        return cls(
            label,
            tuple(
                tuple(r for r in recs if r.phase == PHASE_MEASURE and r.trace_index is not None)
                for recs in runs
            ),
        )

    @property
    def records(self) -> Iterable[RequestRecord]:
        return (r for recs in self.runs for r in recs)

    @property
    def repeats(self) -> int:
        """The most times one request of the trace was sent (its repeats: runs times each run's repeats)."""
        counts: dict[int, int] = {}
        for r in self.records:
            assert r.trace_index is not None
            counts[r.trace_index] = counts.get(r.trace_index, 0) + 1
        return max(counts.values(), default=0)


@dataclass(frozen=True)
class _Pooled:
    """One arm's per-request values: per trace row, each figure's mean over the request's OK records."""

    sent: frozenset[int]  # trace rows with a measured record (any outcome)
    ok: dict[
        int, dict[str, float | None]
    ]  # trace row -> figure -> mean over its OK records (None: none had it)
    prompt: dict[int, int]  # trace row -> requested prompt tokens (the trace's length)
    output: dict[int, int]  # trace row -> requested output tokens
    tokens: dict[int, float]  # trace row -> mean output tokens of its OK records


def _pool(arm: ArmRecords) -> _Pooled:
    sent: set[int] = set()
    sums: dict[int, dict[str, list[float]]] = {}
    prompt: dict[int, int] = {}
    output: dict[int, int] = {}
    tokens: dict[int, list[float]] = {}
    for r in arm.records:
        i = r.trace_index
        assert i is not None
        sent.add(i)
        if r.status != OK:
            continue
        prompt.setdefault(i, r.requested_prompt_tokens)
        output.setdefault(i, r.requested_output_tokens)
        tokens.setdefault(i, []).append(float(r.output_tokens))
        per = sums.setdefault(i, {k: [] for k in _FIELD})
        for key, attr in _FIELD.items():
            v = getattr(r, attr)
            if v is not None and math.isfinite(v):
                per[key].append(float(v))
    ok = {i: {k: (sum(vs) / len(vs) if vs else None) for k, vs in per.items()} for i, per in sums.items()}
    return _Pooled(frozenset(sent), ok, prompt, output, {i: sum(t) / len(t) for i, t in tokens.items()})


# ---------------------------------------------------------------- the figures


@dataclass(frozen=True)
class PairedFigure:
    """One figure (TTFT, TPOT, E2E, per-request tok/s) over the paired requests that have it on both sides.

    Differences are treatment − baseline, in the figure's unit (seconds, or tok/s)."""

    key: str  # ttft | tpot | e2e | per_req_tok_s
    n: int  # paired requests with the figure on both sides
    base_median: float | None
    new_median: float | None
    median_diff: float | None  # median of the per-request differences
    diff_ci: Interval | None  # its order-statistic 95 % interval (None: n <= 5)
    median_pct: float | None  # median of the per-request changes (new − base) / base × 100
    pct_ci: Interval | None
    faster_share: float | None  # share of the n requests strictly faster in the treatment
    unpaired_diff: float | None = None  # median(new) − median(base), the same requests as two samples
    unpaired_ci: Interval | None = None  # its bootstrap 95 % interval (each arm resampled on its own)

    @property
    def narrowing(self) -> float | None:
        """How many times narrower the paired interval is than the unpaired one."""
        if self.diff_ci is None or self.unpaired_ci is None or self.diff_ci.width <= 0:
            return None
        return self.unpaired_ci.width / self.diff_ci.width


def paired_figure(key: str, base: Floats, new: Floats, unpaired: bool = True) -> PairedFigure:
    """The figure's paired (and, with ``unpaired``, unpaired) statistics from aligned per-request values."""
    lower_faster = next(f[3] for f in FIGURES if f[0] == key)
    n = len(base)
    if n == 0:
        return PairedFigure(key, 0, None, None, None, None, None, None, None)
    d = new - base
    pos = base > 0
    pct = (new[pos] - base[pos]) / base[pos] * 100.0
    faster = int(np.count_nonzero(d < 0 if lower_faster else d > 0))
    return PairedFigure(
        key,
        n,
        float(np.median(base)),
        float(np.median(new)),
        float(np.median(d)),
        median_interval(d),
        float(np.median(pct)) if len(pct) else None,
        median_interval(pct),
        faster / n,
        float(np.median(new) - np.median(base)) if unpaired else None,
        bootstrap_median_difference(base, new) if unpaired else None,
    )


def _aligned(
    rows: Sequence[int], base: _Pooled, new: _Pooled, key: str
) -> tuple[Floats, Floats, npt.NDArray[np.int64]]:
    keep = [i for i in rows if base.ok[i][key] is not None and new.ok[i][key] is not None]
    b = np.array([base.ok[i][key] for i in keep], dtype=np.float64)
    n = np.array([new.ok[i][key] for i in keep], dtype=np.float64)
    return b, n, np.array(keep, dtype=np.int64)


@dataclass(frozen=True)
class Bucket:
    """The paired requests whose trace length (input or output tokens) lies in [lo, hi]."""

    lo: int
    hi: int
    n: int  # paired requests in the bucket
    figures: tuple[PairedFigure, ...]  # paired statistics only (no unpaired interval)

    def figure(self, key: str) -> PairedFigure:
        return next(f for f in self.figures if f.key == key)


def length_buckets(lengths: Sequence[int], buckets: int = BUCKETS) -> list[tuple[int, int]]:
    """[lo, hi] token ranges splitting ``lengths`` at their quantiles (i / buckets): buckets of about
    equal counts, fewer where many requests share a length; each length falls in exactly one."""
    if not lengths:
        return []
    xs = np.sort(np.asarray(lengths, dtype=np.int64))
    cuts = sorted({int(xs[min(len(xs) - 1, math.ceil(len(xs) * i / buckets))]) for i in range(1, buckets)})
    edges = [int(xs[0])] + [c for c in cuts if c > xs[0]]
    out = []
    for j, lo in enumerate(edges):
        below = edges[j + 1] if j + 1 < len(edges) else None
        inside = xs[(xs >= lo) & ((xs < below) if below is not None else True)]
        if len(inside):
            out.append((lo, int(inside.max())))
    return out


def _buckets(rows: Sequence[int], length: dict[int, int], base: _Pooled, new: _Pooled) -> tuple[Bucket, ...]:
    out = []
    for lo, hi in length_buckets([length[i] for i in rows]):
        inside = [i for i in rows if lo <= length[i] <= hi]
        figs = tuple(
            paired_figure(k, *_aligned(inside, base, new, k)[:2], unpaired=False) for k, *_ in FIGURES
        )
        out.append(Bucket(lo, hi, len(inside), figs))
    return tuple(out)


# ---------------------------------------------------------------- goodput over the same requests


@dataclass(frozen=True)
class ArmGoodput(Goodput):
    """One arm judged against the SLO over the requests both arms sent: every record of those
    requests (a request sent twice counts twice), each replay's wall time summed over the replays."""

    label: str

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "sent": self.sent,
            "good": self.good,
            "good_share": self.good_share,
            "good_tokens": self.good_tokens,
            "wall_s": self.wall_s,
            "goodput_req_s": self.goodput_req_s,
            "goodput_tok_s": self.goodput_tok_s,
        }


def arm_goodput(arm: ArmRecords, rows: frozenset[int], slo: Slo) -> ArmGoodput:
    """``arm``'s goodput over its records of the trace rows ``rows``. Each replay (a run's level and
    repeat) has its wall, first send to last end of those records (slo_tally); the arm's is their sum,
    so the pauses between replays do not count."""
    sent = good = tokens = 0
    wall = 0.0
    for recs in arm.runs:
        replays: dict[tuple[int, int], LevelColumns] = {}
        for r in recs:
            if r.trace_index in rows:
                replays.setdefault((r.level, r.repeat), LevelColumns(itl_qs(slo))).add(r)
        for cols in replays.values():
            res = slo_tally(cols, slo).result()
            sent, good, tokens = sent + res.sent, good + res.good, tokens + res.good_tokens
            wall += res.wall_s or 0.0
    return ArmGoodput(sent, good, tokens, wall or None, label=arm.label)


# ---------------------------------------------------------------- the comparison


@dataclass(frozen=True)
class PairedComparison:
    """A treatment's replay of the trace against the baseline's, request by request."""

    base: str  # the baseline's label
    new: str  # the treatment's label
    window: int  # trace rows sent by either arm
    paired: int  # of them, OK in both arms
    unpaired: tuple[tuple[str, int], ...]  # (REASONS entry, count), counts > 0 only
    repeats: tuple[int, int]  # most records of one request in the baseline, in the treatment
    figures: tuple[PairedFigure, ...]  # FIGURES, in order
    by_input: tuple[Bucket, ...]  # by the trace's input length (requested prompt tokens)
    by_output: tuple[Bucket, ...]  # by the trace's output length (requested output tokens)
    slo: str | None = None  # the SLO's text (None: no SLO, no goodput)
    goodput: tuple[ArmGoodput, ...] = ()  # baseline, treatment
    output_differs: int = 0  # paired requests whose mean output tokens differ between the arms
    notes: tuple[str, ...] = field(default=())

    def figure(self, key: str) -> PairedFigure:
        return next(f for f in self.figures if f.key == key)

    def to_json(self) -> dict[str, Any]:
        """Every field by name (figures, buckets and intervals as their fields), the unpaired counts
        by reason, each arm's goodput with its figures."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        out["unpaired"] = dict(self.unpaired)
        out["goodput"] = [g.to_json() for g in self.goodput]
        return out


def _unpaired_counts(base: _Pooled, new: _Pooled) -> tuple[tuple[str, int], ...]:
    """Each unpaired trace row counted once, under the first reason that applies (REASONS order)."""
    counts = dict.fromkeys(REASONS, 0)
    for i in base.sent | new.sent:
        if i in base.ok and i in new.ok:
            continue
        if i in base.sent and i not in base.ok:
            counts[NOT_OK_BASE] += 1
        elif i in new.sent and i not in new.ok:
            counts[NOT_OK_NEW] += 1
        elif i not in base.sent:
            counts[MISSING_BASE] += 1
        else:
            counts[MISSING_NEW] += 1
    return tuple((k, v) for k, v in counts.items() if v)


def paired_comparison(base: ArmRecords, new: ArmRecords, slo: Slo | None = None) -> PairedComparison:
    """The treatment against the baseline over the trace rows both sent and both answered OK."""
    pb, pn = _pool(base), _pool(new)
    rows = sorted(set(pb.ok) & set(pn.ok))
    figures = tuple(paired_figure(k, *_aligned(rows, pb, pn, k)[:2]) for k, *_ in FIGURES)
    differs = sum(1 for i in rows if pb.tokens[i] != pn.tokens[i])
    goodput: tuple[ArmGoodput, ...] = ()
    if slo is not None:
        both = pb.sent & pn.sent
        goodput = (arm_goodput(base, both, slo), arm_goodput(new, both, slo))
    return PairedComparison(
        base.label,
        new.label,
        len(pb.sent | pn.sent),
        len(rows),
        _unpaired_counts(pb, pn),
        (base.repeats, new.repeats),
        figures,
        _buckets(rows, pb.prompt, pb, pn),
        _buckets(rows, pb.output, pb, pn),
        None if slo is None else slo.text,
        goodput,
        differs,
    )


def paired_comparisons(
    arms: Sequence[tuple[str, Sequence[Sequence[RequestRecord]]]],
    slo: Slo | None = None,
    unpairable: Callable[[int], str | None] | None = None,
) -> tuple[list[PairedComparison], list[str]]:
    """Each treatment (arms[1:]) against the baseline (arms[0]) where both replayed a trace, and the
    notes on those that could not be paired. ``unpairable(j)``: why arm j cannot be paired with the
    baseline (another trace, window or seed), None when it can."""
    if len(arms) < 2:
        return [], []
    base = ArmRecords.of(*arms[0])
    if not any(True for _ in base.records):
        return [], []
    out, notes = [], []
    for j, (label, runs) in enumerate(arms[1:], start=1):
        new = ArmRecords.of(label, runs)
        if not any(True for _ in new.records):
            notes.append(f"{label} did not replay a trace, the baseline did: no paired comparison")
            continue
        why = unpairable(j) if unpairable is not None else None
        if why is not None:
            notes.append(f"{label} is not paired with the baseline: {why}")
            continue
        out.append(paired_comparison(base, new, slo))
    return out, notes


# ---------------------------------------------------------------- from run directories (reads records)

_PEEK_BYTES = 1 << 16
# Besides the trace's own fields (trace, trace_format, its window and speed-up), what makes a replay's
# requests the same requests: the seed (which draws the prompts' units) and the prompt material.
_SAME_REQUESTS = ("seed", "prompts", "dataset", "token_id_range")


def replayed_trace(run: Run) -> bool:
    """The run replayed a trace: run.json's scenario names one, or (a run without run.json) its first
    records.jsonl bytes name ``trace_index`` (a line leaves a null field out, so only a trace replay's
    records have it). Reads no more than that, so a big run of another workload is not decoded to
    find out."""
    if (run.info.scenario or {}).get("trace"):
        return True
    path = run.run_dir / RECORDS
    try:
        with open_regular(path, None) as f:
            return b'"trace_index"' in f.read(_PEEK_BYTES)
    except OSError:
        return False


def trace_settings(run: Run) -> dict[str, Any]:
    """What makes two replays the same requests: the scenario's trace fields (the file, its window,
    its speed-up, its text) and the seed, as run.json recorded them."""
    sc = run.info.scenario or {}
    same = {k: v for k, v in sorted(sc.items()) if k.startswith("trace") or k in _SAME_REQUESTS}
    if isinstance(same.get("trace"), str):  # the file, wherever each run was started from
        same["trace"] = PurePath(same["trace"]).name
    return same


def _differs(base: Run, other: Run) -> str | None:
    a, b = trace_settings(base), trace_settings(other)
    diff = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    if not diff:
        return None
    return "it replayed other requests (" + "; ".join(f"{k} {a.get(k)!r} vs {b.get(k)!r}" for k in diff) + ")"


def paired_of_runs(
    arms: Sequence[tuple[str, Sequence[Run]]], slo: Slo | None = None
) -> tuple[list[PairedComparison], list[str]]:
    """paired_comparisons over run directories: each arm's label and its runs (an experiment's repeats),
    its records read only when the baseline's first run replayed a trace."""
    if len(arms) < 2 or not arms[0][1] or not replayed_trace(arms[0][1][0]):
        return [], []
    first = [runs[0] for _, runs in arms]
    return paired_comparisons(
        [(label, [r.records if replayed_trace(r) else [] for r in runs]) for label, runs in arms],
        slo,
        lambda j: _differs(first[0], first[j]),
    )
