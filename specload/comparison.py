"""Baseline vs treatments, computed: ``build_comparison(runs) -> Comparison``.

The first run is the baseline; every other run is compared with it at each concurrency level.
The figures per run are those of ``specload report`` (specload.metrics), repeats of a level
combined by ``metrics.repeats_at``. Everything here is pure (no I/O, no formatting choices beyond
the verdict's words), so the arithmetic can be tested on its own and every consumer (the
``specload compare`` text, its JSON, the plot) shows the same finished numbers instead of
recomputing them. docs/metrics.md defines the change, the interval, the crossover and the verdict.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from specload.metrics import RepeatedLevelStats, mean, repeats_at
from specload.output import MISSING, fmt_pct
from specload.run import Run
from specload.rundir import RUN_COMPLETED, RunMeta

NOISE_MARK = "~"
# A change smaller than this (in percent) is no direction: it neither makes nor breaks a crossover.
NEGLIGIBLE_PCT = 1.0

# Two-sided 95% quantiles of Student's t (t_{0.975, df}) for df = 1..30; above 30, the normal 1.96.
T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
Z_975 = 1.96


# ---------------------------------------------------------------- arithmetic


def change_pct(base: float | None, new: float | None) -> float | None:
    """(new − base) / base × 100; None when either is missing or base is not positive."""
    if base is None or new is None or base <= 0:
        return None
    return (new - base) / base * 100.0


def t_quantile_975(df: float) -> float:
    """t_{0.975} for ``df`` degrees of freedom: the table at floor(df) (conservative), 1.96 above 30."""
    df = math.floor(df + 1e-6)  # a df of 3.9999999 (float noise) is 4
    if df > len(T_975):
        return Z_975
    return T_975[max(1, df) - 1]


def ci_change(base: Sequence[float], new: Sequence[float]) -> tuple[float, float] | None:
    """(change %, 95% half-width %) of mean(new) vs mean(base), from repeat values; None if n < 2.

    Welch's t interval for mean(new) − mean(base), divided by mean(base): half-width =
    t_{0.975, df} × sqrt(s²_b/n_b + s²_n/n_n) / mean(base) × 100, with the Welch–Satterthwaite df
    (floored, see t_quantile_975). The baseline mean in the denominator is taken as exact.
    """
    if len(base) < 2 or len(new) < 2:
        return None
    mb = mean(base)
    pct = change_pct(mb, mean(new))
    if pct is None or mb is None:
        return None
    qb, qn = statistics.variance(base) / len(base), statistics.variance(new) / len(new)
    se2 = qb + qn
    if se2 <= 0:
        return pct, 0.0
    df = se2**2 / (qb**2 / (len(base) - 1) + qn**2 / (len(new) - 1))
    return pct, t_quantile_975(df) * math.sqrt(se2) / mb * 100.0


@dataclass(frozen=True)
class Crossover:
    """Where a change crosses zero between two measured levels (low < high)."""

    low: int  # the last level on the old side
    high: int  # the first level on the new side
    at: float  # interpolated concurrency, linear in log2(C)
    direction: str  # "down": gain turns into loss; "up": loss turns into gain


def crossover(levels: Sequence[int], changes: Sequence[float | None]) -> list[Crossover]:
    """Every sign change of ``changes`` (aligned with ascending ``levels``), in level order.

    Levels without a change (missing in a run) and exact zeros are skipped, so the two levels of a
    crossover are the nearest measured ones on either side. The crossover concurrency is linear
    interpolation in log2(C): log2(C*) = log2(Ca) + (log2(Cb) − log2(Ca)) × ya / (ya − yb).
    """
    if len(levels) != len(changes):
        raise ValueError("levels and changes must have the same length")
    pts = [(c, y) for c, y in zip(levels, changes, strict=True) if y is not None and y != 0 and c > 0]
    out: list[Crossover] = []
    for (ca, ya), (cb, yb) in zip(pts, pts[1:], strict=False):
        if (ya > 0) == (yb > 0):
            continue
        xa, xb = math.log2(ca), math.log2(cb)
        x = xa + (xb - xa) * ya / (ya - yb)
        out.append(Crossover(ca, cb, 2.0**x, "down" if ya > 0 else "up"))
    return out


@dataclass(frozen=True)
class Change:
    """A treatment figure vs the baseline's at one level."""

    pct: float | None  # change of the means, percent
    ci: float | None = None  # 95% half-width, percent (None without >= 2 repeats in both runs)

    def directional(self) -> float | None:
        """The change as a direction: 0 when it is inside the noise or under NEGLIGIBLE_PCT."""
        if self.pct is None:
            return None
        return 0.0 if self.noise or abs(self.pct) < NEGLIGIBLE_PCT else self.pct

    @property
    def noise(self) -> bool:
        """The confidence interval contains 0: the change is inside the repeats' noise."""
        return self.pct is not None and self.ci is not None and abs(self.pct) <= self.ci

    def to_dict(self) -> dict[str, Any]:
        return {"pct": self.pct, "ci_half_width_pct": self.ci, "noise": self.noise}


def change_of(base: Sequence[float], new: Sequence[float], base_mean: float | None,
              new_mean: float | None) -> Change:  # fmt: skip
    """Change of the means, with a confidence interval when both sides have >= 2 repeat values."""
    ci = ci_change(base, new)
    if ci is not None:
        return Change(ci[0], ci[1])
    return Change(change_pct(base_mean, new_mean))


# ---------------------------------------------------------------- the verdict, in words


def _fmt_c(c: float) -> str:
    return f"{c:.0f}" if c >= 10 else f"{c:.1f}"


def _segments(levels: Sequence[int], changes: Sequence[float | None]) -> list[list[tuple[int, float]]]:
    """Measured (C, change) points grouped into runs of the same sign (exact zeros dropped)."""
    segs: list[list[tuple[int, float]]] = []
    for c, y in zip(levels, changes, strict=True):
        if y is None or y == 0:
            continue
        if segs and (segs[-1][-1][1] > 0) == (y > 0):
            segs[-1].append((c, y))
        else:
            segs.append([(c, y)])
    return segs


def _range(ys: Sequence[float]) -> str:
    lo, hi = fmt_pct(min(ys)), fmt_pct(max(ys))
    return lo if lo == hi else f"{lo} to {hi}"


def _where(xs: Sequence[Crossover]) -> str:
    parts = [f"C≈{_fmt_c(x.at)} (between C={x.low} and C={x.high})" for x in xs]
    if len(parts) == 1:
        return "crossover near " + parts[0]
    return "crossovers near " + ", ".join(parts[:-1]) + " and " + parts[-1]


@dataclass(frozen=True)
class _Wording:
    """How one figure's changes are told: never changed, one direction throughout, or crossing."""

    unchanged: str
    steady: Callable[[bool, list[tuple[int, float]]], str]  # (up, measured points) -> clause
    first: Callable[[bool], str]  # the opening of a crossing clause
    later: Callable[[bool], str]  # each later side of a crossing clause


def _raises(up: bool) -> str:
    return "raises" if up else "lowers"


def _higher(up: bool) -> str:
    return "higher" if up else "lower"


_AGG = _Wording(
    unchanged="leaves aggregate tok/s unchanged at every level measured",
    steady=lambda up, pts: f"{_raises(up)} aggregate tok/s at every level measured ({_range([y for _, y in pts])})",
    first=lambda up: f"{_raises(up)} aggregate tok/s",
    later=lambda up: f"{_raises(up)} it",
)
_PER_REQ = _Wording(
    unchanged="per-request speed is unchanged at every level",
    steady=lambda up, pts: f"per-request speed stays {_higher(up)} at every level ({fmt_pct(pts[-1][1])} at C={pts[-1][0]})",
    first=lambda up: f"per-request speed is {_higher(up)}",
    later=_higher,
)


def _direction_part(levels: Sequence[int], changes: Sequence[float | None], wording: _Wording) -> str | None:
    """One clause on where ``changes`` are up and where down, with the crossovers between."""
    present = [(c, y) for c, y in zip(levels, changes, strict=True) if y is not None]
    if not present:
        return None
    segs = _segments(levels, changes)
    if not segs:
        return wording.unchanged
    if len(segs) == 1:
        return wording.steady(segs[0][0][1] > 0, present)
    head = segs[0]
    parts = [f"{wording.first(head[0][1] > 0)} up to C={head[-1][0]} ({fmt_pct(head[-1][1])})"]
    for i, seg in enumerate(segs[1:]):
        again = " again" if i > 0 else ""
        parts.append(f"{wording.later(seg[0][1] > 0)}{again} from C={seg[0][0]} ({fmt_pct(seg[0][1])})")
    text = parts[0] + "".join(f", {p}" for p in parts[1:-1]) + f" and {parts[-1]}"
    return f"{text}, {_where(crossover(levels, changes))}"


def _tpot_part(levels: Sequence[int], changes: Sequence[float | None]) -> str | None:
    """How the time between tokens of running requests changed: speculation's per-step gain,
    which queueing (in E2E, hence in Per-req tok/s) can hide at high concurrency."""
    pts = [(c, y) for c, y in zip(levels, changes, strict=False) if y is not None]
    if not pts:
        return None
    top_c, top_y = pts[-1]
    faster = [c for c, y in pts if y <= -NEGLIGIBLE_PCT]
    slower = [c for c, y in pts if y >= NEGLIGIBLE_PCT]
    if len(faster) == len(pts):
        return f"Running requests decode faster at every level (TPOT {fmt_pct(top_y)} at C={top_c})"
    if len(slower) == len(pts):
        return f"Running requests decode slower at every level (TPOT {fmt_pct(top_y)} at C={top_c})"
    if faster and slower:
        return (f"Running requests decode faster at C={', '.join(map(str, faster))} and slower at "
                f"C={', '.join(map(str, slower))} (TPOT {fmt_pct(top_y)} at C={top_c})")  # fmt: skip
    return None


def crossover_sentence(
    label: str,
    levels: Sequence[int],
    agg_changes: Sequence[float | None],
    per_req_changes: Sequence[float | None],
    *,
    queue_from: int | None = None,
    max_running: int | None = None,
    tpot_changes: Sequence[float | None] = (),
) -> str:
    """The verdict for one treatment run vs the baseline, in plain words.

    ``levels`` ascending; the changes (percent, None where a run lacks the level) aligned with it.
    ``queue_from``: the first level at which the treatment's server queued requests (None: never or
    unknown); ``max_running``: its max_running_requests, when known.
    """
    agg = _direction_part(levels, agg_changes, _AGG)
    per = _direction_part(levels, per_req_changes, _PER_REQ)
    if agg is None and per is None:
        text = f"{label}: no level was measured in both runs, so there is nothing to compare."
    elif agg is None:
        text = f"{label}: no aggregate tok/s to compare; {per}."
    else:
        text = f"{label} {agg}" + (f"; {per}." if per else ".")
    decode = _tpot_part(levels, tpot_changes)
    if decode:
        text += f" {decode}."
    if queue_from is not None:
        text += f" At C>={queue_from} the server queued requests"
        if max_running is not None and queue_from > max_running:
            text += f": its max_running_requests is {max_running}."
        elif max_running is not None:
            text += f" (its max_running_requests is {max_running})."
        else:
            text += "."
    return text


# ---------------------------------------------------------------- the comparison


@dataclass
class ComparedRun:
    """One run of a comparison, its figures lined up on the comparison's levels."""

    label: str  # unique within the comparison
    run: Run
    figures: dict[int, RepeatedLevelStats]  # by concurrency, for every level of the comparison
    max_running: int | None  # server max_running_requests from run.json (effective one first)

    @property
    def simulated(self) -> bool:
        return self.run.info.simulated

    def queue_from(self) -> int | None:
        """First level where the server queued (sampled queue > 0, or C above max_running_requests)."""
        for c in sorted(self.figures):
            f = self.figures[c]
            if not f.measured:
                continue
            if (f.server_queued_max or 0) > 0 or (self.max_running is not None and c > self.max_running):
                return c
        return None


@dataclass(frozen=True)
class Crossovers:
    """Where one treatment's changes cross zero (changes inside the noise or negligible do not count)."""

    agg: list[Crossover]
    per_req: list[Crossover]


@dataclass
class Comparison:
    """The finished comparison: every number, crossover and sentence its consumers show."""

    runs: list[ComparedRun]  # runs[0] is the baseline
    levels: list[int]  # union of all runs' concurrencies, ascending
    agg: dict[str, list[Change]]  # treatment label -> change per level
    per_req: dict[str, list[Change]]
    tpot: dict[str, list[float | None]]  # treatment label -> TPOT p50 change per level (no interval)
    crossovers: dict[str, Crossovers]  # treatment label -> crossovers of its directional changes
    sentences: list[str]  # the verdict, one per treatment
    notes: list[str]

    @property
    def baseline(self) -> ComparedRun:
        return self.runs[0]

    @property
    def treatments(self) -> list[ComparedRun]:
        return self.runs[1:]

    @property
    def simulated(self) -> bool:
        """Some run measured the built-in simulator (said in every header and title)."""
        return any(r.simulated for r in self.runs)


def unique_labels(names: Sequence[str]) -> list[str]:
    """The names, with -2, -3, ... appended to repeats so that every label is distinct."""
    out: list[str] = []
    for name in names:
        label, k = name, 2
        while label in out:
            label, k = f"{name}-{k}", k + 1
        out.append(label)
    return out


def _sentence(comp: Comparison, t: ComparedRun) -> str:
    agg, per = comp.agg[t.label], comp.per_req[t.label]
    text = crossover_sentence(
        t.label,
        comp.levels,
        [ch.directional() for ch in agg],
        [ch.directional() for ch in per],
        queue_from=t.queue_from(),
        max_running=t.max_running,
        tpot_changes=comp.tpot[t.label],
    )
    noisy = [c for c, a, p in zip(comp.levels, agg, per, strict=True) if a.noise or p.noise]
    if noisy:
        where = ", ".join(f"C={c}" for c in noisy)
        text += f" The changes marked {NOISE_MARK} ({where}) are inside the noise of the repeats."
    return text


def build_comparison(runs: Sequence[Run]) -> Comparison:
    """Everything the table, the sentences and the plot show, from loaded run directories."""
    if len(runs) < 2:
        raise ValueError("a comparison needs at least two runs (the first is the baseline)")
    labels = unique_labels([r.label for r in runs])
    levels = sorted({s.concurrency for r in runs for s in r.levels})
    cruns = [
        ComparedRun(label, r, {c: repeats_at(r.levels, c) for c in levels}, r.info.server.max_running)
        for label, r in zip(labels, runs, strict=True)
    ]
    base = cruns[0]
    comp = Comparison(cruns, levels, {}, {}, {}, {}, [], [])
    for t in cruns[1:]:
        pairs = [(base.figures[c], t.figures[c]) for c in levels]
        agg = [change_of(b.agg_tok_s_values, n.agg_tok_s_values, b.agg_tok_s_mean, n.agg_tok_s_mean) for b, n in pairs]
        per = [change_of(b.per_req_tok_s_values, n.per_req_tok_s_values, b.per_req_tok_s_mean,
                         n.per_req_tok_s_mean) for b, n in pairs]  # fmt: skip
        comp.agg[t.label], comp.per_req[t.label] = agg, per
        comp.tpot[t.label] = [change_pct(b.tpot_p50_ms_mean, n.tpot_p50_ms_mean) for b, n in pairs]
        comp.crossovers[t.label] = Crossovers(
            crossover(levels, [ch.directional() for ch in agg]), crossover(levels, [ch.directional() for ch in per])
        )
    comp.sentences = [_sentence(comp, t) for t in comp.treatments]
    comp.notes = _notes(comp)
    return comp


# ---------------------------------------------------------------- notes

# Run-level settings that should match between the runs for the comparison to be fair.
_SAME: tuple[tuple[str, Callable[[RunMeta], Any]], ...] = (
    ("model", lambda m: m.model),
    ("backend", lambda m: m.backend),
    ("input tokens", lambda m: m.scenario.get("input_tokens")),
    ("output tokens", lambda m: m.scenario.get("output_tokens")),
    ("server engine", lambda m: m.server.get("engine")),
    ("server version", lambda m: m.server.get("version")),
    ("server tp_size", lambda m: m.server.get("tp_size")),
)


def _notes(comp: Comparison) -> list[str]:
    notes: list[str] = []
    for r in comp.runs:
        notes += [f"{r.label}: {n}" for n in r.run.notices]
        status = r.run.info.status
        if status not in (None, RUN_COMPLETED):
            notes.append(f"{r.label}: run status is {status}: the last levels may be partial")
    for c in comp.levels:
        lacking = [r.label for r in comp.runs if not r.figures[c].measured]
        if lacking:
            notes.append(f"C={c}: no measured requests in {', '.join(lacking)}; shown as {MISSING}")
    for name, value_of in _SAME:
        values = [value_of(r.run.info) for r in comp.runs]
        if len({json.dumps(v, sort_keys=True, default=str) for v in values if v is not None}) > 1:
            shown = ", ".join(f"{r.label} {v}" for r, v in zip(comp.runs, values, strict=True))
            notes.append(f"the runs differ in {name} ({shown}): the comparison is not like for like")
    reps = [
        f"C={c} " + "/".join(str(len(r.figures[c].repeats)) for r in comp.runs)
        for c in comp.levels
        if any(len(r.figures[c].repeats) > 1 for r in comp.runs)
    ]
    if reps:
        notes.append(
            "repeats combined by their mean (server maxima: the max); repeats per run "
            f"({'/'.join(r.label for r in comp.runs)}): {', '.join(reps)}"
        )
    if any(ch.ci is not None for chs in (*comp.agg.values(), *comp.per_req.values()) for ch in chs):
        notes.append(
            "(±x%) is the 95% confidence interval of the change (Welch's t over the repeats, relative to "
            f"the baseline mean); {NOISE_MARK} means the interval contains 0: the change is inside the noise"
        )
    for r in comp.runs:
        notes += [f"{r.label}: {n}" for n in r.run.max_running_notes()]
    return notes
