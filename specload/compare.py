"""Baseline vs speculative decoding, side by side: ``specload compare RUN_A RUN_B [RUN_C ...]``.

The first run is the baseline; every other run is compared with it at each concurrency level. The
figures per run are those of ``specload report`` (specload.metrics), repeats of a level combined by
their mean. The arithmetic of the comparison (change, confidence interval, crossover, the verdict
sentence) lives in small pure functions so it can be tested on its own; docs/metrics.md defines it.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tabulate import tabulate, tabulate_formats

from specload.metrics import LevelStats
from specload.report import (
    EXTRA_FORMATS,
    MISSING,
    NotARunDir,
    Run,
    is_known_format,
    load_run,
    max_running_notes,
    max_running_requests,
    server_summary,
)

COMPARISON_MD = "comparison.md"
COMPARISON_PNG = "comparison.png"
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


# ---------------------------------------------------------------- pure arithmetic


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


def _var(xs: Sequence[float]) -> float:
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def ci_change(base: Sequence[float], new: Sequence[float]) -> tuple[float, float] | None:
    """(change %, 95% half-width %) of mean(new) vs mean(base), from repeat values; None if n < 2.

    Welch's t interval for mean(new) − mean(base), divided by mean(base): half-width =
    t_{0.975, df} × sqrt(s²_b/n_b + s²_n/n_n) / mean(base) × 100, with the Welch–Satterthwaite df
    (floored, see t_quantile_975). The baseline mean in the denominator is taken as exact.
    """
    if len(base) < 2 or len(new) < 2:
        return None
    mb, mn = sum(base) / len(base), sum(new) / len(new)
    pct = change_pct(mb, mn)
    if pct is None:
        return None
    qb, qn = _var(base) / len(base), _var(new) / len(new)
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


def fmt_pct(pct: float | None) -> str:
    """+12%, -32%, 0%; '-' when missing."""
    if pct is None:
        return MISSING
    r = round(pct)
    return "0%" if r == 0 else f"{r:+d}%"


def _fmt_half(hw: float) -> str:
    return f"±{hw:.1f}%" if hw < 1 else f"±{round(hw)}%"


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


def _crossing_text(
    levels: Sequence[int],
    changes: Sequence[float | None],
    segs: list[list[tuple[int, float]]],
    *,
    first: Callable[[bool], str],
    later: Callable[[bool], str],
) -> str:
    """'<first> up to C=a (x%), <later> from C=b (y%) …, crossover near …' for changes that change sign."""
    head = segs[0]
    parts = [f"{first(head[0][1] > 0)} up to C={head[-1][0]} ({fmt_pct(head[-1][1])})"]
    for i, seg in enumerate(segs[1:]):
        again = " again" if i > 0 else ""
        parts.append(f"{later(seg[0][1] > 0)}{again} from C={seg[0][0]} ({fmt_pct(seg[0][1])})")
    text = parts[0] + "".join(f", {p}" for p in parts[1:-1]) + f" and {parts[-1]}"
    return f"{text}, {_where(crossover(levels, changes))}"


def _agg_part(levels: Sequence[int], changes: Sequence[float | None]) -> str | None:
    present = [y for y in changes if y is not None]
    if not present:
        return None
    segs = _segments(levels, changes)
    if not segs:
        return "leaves aggregate tok/s unchanged at every level measured"
    if len(segs) == 1:
        verb = "raises" if segs[0][0][1] > 0 else "lowers"
        return f"{verb} aggregate tok/s at every level measured ({_range(present)})"
    return _crossing_text(
        levels, changes, segs,
        first=lambda up: f"{'raises' if up else 'lowers'} aggregate tok/s",
        later=lambda up: f"{'raises' if up else 'lowers'} it",
    )  # fmt: skip


def _per_req_part(levels: Sequence[int], changes: Sequence[float | None]) -> str | None:
    present = [(c, y) for c, y in zip(levels, changes, strict=True) if y is not None]
    if not present:
        return None
    segs = _segments(levels, changes)
    top_c, top_y = present[-1]
    if not segs:
        return "per-request speed is unchanged at every level"
    if len(segs) == 1:
        word = "higher" if segs[0][0][1] > 0 else "lower"
        return f"per-request speed stays {word} at every level ({fmt_pct(top_y)} at C={top_c})"
    return _crossing_text(
        levels, changes, segs,
        first=lambda up: f"per-request speed is {'higher' if up else 'lower'}",
        later=lambda up: "higher" if up else "lower",
    )  # fmt: skip


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
    agg = _agg_part(levels, agg_changes)
    per = _per_req_part(levels, per_req_changes)
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


# ---------------------------------------------------------------- one run, combined over repeats


def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def _max(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return max(vals) if vals else None


@dataclass
class Figures:
    """One run at one concurrency, its repeats combined: means, except the server maxima (max)."""

    concurrency: int
    repeats: int = 0  # level rows (repeats) the run has for this C; 0: not in the run at all
    measured: bool = False  # some repeat has measured requests
    agg_tok_s: float | None = None
    agg_values: list[float] = field(default_factory=list)  # per repeat
    per_req_tok_s: float | None = None
    per_req_values: list[float] = field(default_factory=list)  # per repeat
    ttft_p50_ms: float | None = None
    tpot_p50_ms: float | None = None
    accept_length: float | None = None
    server_running_max: float | None = None
    server_queued_max: float | None = None


def figures_at(levels: Sequence[LevelStats], concurrency: int) -> Figures:
    """Combine every repeat of ``concurrency`` in ``levels`` (absent: Figures with repeats=0)."""
    mine = [s for s in levels if s.concurrency == concurrency]
    agg = [s.agg_tok_s for s in mine if s.agg_tok_s is not None]
    per = [s.per_req_tok_s for s in mine if s.per_req_tok_s is not None]
    return Figures(
        concurrency=concurrency,
        repeats=len(mine),
        measured=any(s.sent > 0 for s in mine),
        agg_tok_s=_mean(agg),
        agg_values=agg,
        per_req_tok_s=_mean(per),
        per_req_values=per,
        ttft_p50_ms=_mean([s.ttft_p50_ms for s in mine]),
        tpot_p50_ms=_mean([s.tpot_p50_ms for s in mine]),
        accept_length=_mean([s.accept_length for s in mine]),
        server_running_max=_max([s.server_running_max for s in mine]),
        server_queued_max=_max([s.server_queued_max for s in mine]),
    )


@dataclass
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

    def cell(self) -> str:
        if self.pct is None:
            return MISSING
        text = fmt_pct(self.pct)
        if self.ci is not None:
            text += f" ({_fmt_half(self.ci)})"
        return text + (f" {NOISE_MARK}" if self.noise else "")

    def to_dict(self) -> dict[str, Any]:
        return {"pct": self.pct, "ci_half_width_pct": self.ci, "noise": self.noise}


def compare_figures(base: Sequence[float], new: Sequence[float], base_mean: float | None,
                    new_mean: float | None) -> Change:  # fmt: skip
    """Change of the means, with a confidence interval when both sides have >= 2 repeat values."""
    ci = ci_change(base, new)
    if ci is not None:
        return Change(ci[0], ci[1])
    return Change(change_pct(base_mean, new_mean))


# ---------------------------------------------------------------- the comparison


@dataclass
class CompareRun:
    label: str
    run: Run
    figures: dict[int, Figures]  # by concurrency, for every level of the comparison
    max_running: int | None  # server max_running_requests from run.json (effective one first)

    @property
    def simulated(self) -> bool:
        return bool(self.run.meta.get("simulated"))

    def queue_from(self) -> int | None:
        """First level where the server queued (sampled queue > 0, or C above max_running_requests)."""
        for c in sorted(self.figures):
            f = self.figures[c]
            if not f.measured:
                continue
            if (f.server_queued_max or 0) > 0 or (self.max_running is not None and c > self.max_running):
                return c
        return None


@dataclass
class Comparison:
    runs: list[CompareRun]  # runs[0] is the baseline
    levels: list[int]  # union of all runs' concurrencies, ascending
    agg: dict[str, list[Change]]  # treatment label -> change per level
    per_req: dict[str, list[Change]]
    sentences: list[str]
    notes: list[str]

    @property
    def baseline(self) -> CompareRun:
        return self.runs[0]

    @property
    def treatments(self) -> list[CompareRun]:
        return self.runs[1:]


def unique_labels(names: Sequence[str]) -> list[str]:
    """The names, with -2, -3, ... appended to repeats so that every label is distinct."""
    out: list[str] = []
    for name in names:
        label, k = name, 2
        while label in out:
            label, k = f"{name}-{k}", k + 1
        out.append(label)
    return out


def run_label(run: Run) -> str:
    return str(run.meta.get("label") or run.run_dir.resolve().name)


def build_comparison(runs: Sequence[Run]) -> Comparison:
    """Everything the table, the sentences and the plot show, from loaded run directories."""
    if len(runs) < 2:
        raise ValueError("a comparison needs at least two runs (the first is the baseline)")
    labels = unique_labels([run_label(r) for r in runs])
    levels = sorted({s.concurrency for r in runs for s in r.levels})
    cruns = [
        CompareRun(label, r, {c: figures_at(r.levels, c) for c in levels}, max_running_requests(r.meta))
        for label, r in zip(labels, runs, strict=True)
    ]
    base = cruns[0]
    agg: dict[str, list[Change]] = {}
    per: dict[str, list[Change]] = {}
    for t in cruns[1:]:
        agg[t.label], per[t.label] = [], []
        for c in levels:
            b, n = base.figures[c], t.figures[c]
            agg[t.label].append(compare_figures(b.agg_values, n.agg_values, b.agg_tok_s, n.agg_tok_s))
            per[t.label].append(compare_figures(b.per_req_values, n.per_req_values, b.per_req_tok_s,
                                                n.per_req_tok_s))  # fmt: skip
    sentences = []
    for t in cruns[1:]:
        text = crossover_sentence(
            t.label,
            levels,
            [ch.directional() for ch in agg[t.label]],
            [ch.directional() for ch in per[t.label]],
            queue_from=t.queue_from(),
            max_running=t.max_running,
            tpot_changes=[change_pct(base.figures[c].tpot_p50_ms, t.figures[c].tpot_p50_ms) for c in levels],
        )
        noisy = [c for c, a, p in zip(levels, agg[t.label], per[t.label], strict=True) if a.noise or p.noise]
        if noisy:
            where = ", ".join(f"C={c}" for c in noisy)
            text += f" The changes marked {NOISE_MARK} ({where}) are inside the noise of the repeats."
        sentences.append(text)
    comp = Comparison(cruns, levels, agg, per, sentences, [])
    comp.notes = _notes(comp)
    return comp


# ---------------------------------------------------------------- table


def _num(v: float | None, digits: int) -> str:
    return MISSING if v is None else f"{v:.{digits}f}"


def _count(v: float | None) -> str:
    if v is None:
        return MISSING
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}"


def _has(comp: Comparison, attr: str) -> bool:
    return any(getattr(f, attr) is not None for r in comp.runs for f in r.figures.values())


def table_columns(comp: Comparison) -> list[str]:
    cols = ["C"]
    cols += [f"Agg tok/s {r.label}" for r in comp.runs] + [f"Δ agg {t.label}" for t in comp.treatments]
    cols += [f"Per-req tok/s {r.label}" for r in comp.runs] + [f"Δ per-req {t.label}" for t in comp.treatments]
    cols += [f"TTFT p50 (ms) {r.label}" for r in comp.runs]
    cols += [f"TPOT p50 (ms) {r.label}" for r in comp.runs] + [f"Δ TPOT {t.label}" for t in comp.treatments]
    if _has(comp, "accept_length"):
        cols += [f"Accept len {r.label}" for r in comp.runs]
    if _has(comp, "server_running_max") or _has(comp, "server_queued_max"):
        cols += [f"Srv run/queue {r.label}" for r in comp.runs]
    return cols


def table_rows(comp: Comparison) -> list[list[str]]:
    """One row per level of the union; a level a run lacks shows '-' in that run's cells."""
    accept = _has(comp, "accept_length")
    server = _has(comp, "server_running_max") or _has(comp, "server_queued_max")
    rows: list[list[str]] = []
    for i, c in enumerate(comp.levels):
        figs = [r.figures[c] for r in comp.runs]
        row = [str(c)]
        row += [_num(f.agg_tok_s, 1) for f in figs] + [comp.agg[t.label][i].cell() for t in comp.treatments]
        row += [_num(f.per_req_tok_s, 1) for f in figs]
        row += [comp.per_req[t.label][i].cell() for t in comp.treatments]
        row += [_num(f.ttft_p50_ms, 1) for f in figs]
        row += [_num(f.tpot_p50_ms, 1) for f in figs]
        row += [fmt_pct(change_pct(figs[0].tpot_p50_ms, f.tpot_p50_ms)) for f in figs[1:]]
        if accept:
            row += [_num(f.accept_length, 2) for f in figs]
        if server:
            row += [
                MISSING
                if f.server_running_max is None and f.server_queued_max is None
                else f"{_count(f.server_running_max)} / {_count(f.server_queued_max)}"
                for f in figs
            ]
        rows.append(row)
    return rows


def _render_csv(comp: Comparison) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(table_columns(comp))
    for row in table_rows(comp):
        w.writerow(["" if c == MISSING else c for c in row])
    return buf.getvalue()


def _run_info(r: CompareRun) -> dict[str, Any]:
    m = r.run.meta
    server = m.get("server") if isinstance(m.get("server"), dict) else {}
    return {
        "label": r.label,
        "baseline": False,
        "run_dir": str(r.run.run_dir),
        "host": m.get("host"),
        "backend": m.get("backend"),
        "model": m.get("model"),
        "status": m.get("status"),
        "simulated": r.simulated,
        "speculative_algorithm": server.get("speculative_algorithm"),
        "max_running_requests": r.max_running,
    }


def to_dict(comp: Comparison) -> dict[str, Any]:
    """The comparison as plain data, unrounded (what --format json prints)."""
    runs = [_run_info(r) for r in comp.runs]
    runs[0]["baseline"] = True
    levels = []
    for i, c in enumerate(comp.levels):
        levels.append(
            {
                "concurrency": c,
                "runs": {r.label: asdict(r.figures[c]) for r in comp.runs},
                "changes": {
                    t.label: {"agg": comp.agg[t.label][i].to_dict(), "per_req": comp.per_req[t.label][i].to_dict()}
                    for t in comp.treatments
                },
            }
        )
    crossovers = {
        t.label: {
            "agg": [asdict(x) for x in crossover(comp.levels, [ch.directional() for ch in comp.agg[t.label]])],
            "per_req": [asdict(x) for x in crossover(comp.levels, [ch.directional() for ch in comp.per_req[t.label]])],
        }
        for t in comp.treatments
    }
    return {"runs": runs, "levels": levels, "crossovers": crossovers, "sentences": comp.sentences,
            "notes": comp.notes}  # fmt: skip


def render_table(comp: Comparison, fmt: str = "github") -> str:
    """The side-by-side table; csv has the same cells, json the full data (see to_dict)."""
    if fmt == "csv":
        return _render_csv(comp)
    if fmt == "json":
        return json.dumps(to_dict(comp), indent=2) + "\n"
    if fmt not in tabulate_formats:
        raise ValueError(f"unknown format {fmt!r}; use csv, json or one of: {', '.join(tabulate_formats)}")
    cols = table_columns(comp)
    return tabulate(
        table_rows(comp), headers=cols, tablefmt=fmt, disable_numparse=True, colalign=["right"] * len(cols)
    )


# ---------------------------------------------------------------- header, notes, text


def _run_line(r: CompareRun, baseline: bool) -> str:
    m = r.run.meta
    parts = [f"**{r.label}**" + (" (baseline)" if baseline else "")]
    if r.simulated:
        parts.append("**SIMULATED**")
    for key in ("host", "backend", "model", "status"):
        if m.get(key):
            parts.append(f"{key} {m[key]}")
    server = server_summary(m)
    if server:
        parts.append(f"server: {server}")
    parts.append(f"run dir {r.run.run_dir}")
    return "- " + "; ".join(parts)


def header_lines(comp: Comparison) -> list[str]:
    title = " vs ".join(r.label for r in comp.runs)
    lines = [f"# specload comparison: {title}", ""]
    if any(r.simulated for r in comp.runs):
        lines.append("- **SIMULATED**: at least one run measured the built-in simulator, not an inference server")
    lines += [_run_line(r, i == 0) for i, r in enumerate(comp.runs)]
    return lines


# Run-level settings that should match between the runs for the comparison to be fair.
_SAME_KEYS: tuple[tuple[str, str], ...] = (
    ("model", "model"),
    ("backend", "backend"),
    ("scenario.input_tokens", "input tokens"),
    ("scenario.output_tokens", "output tokens"),
    ("server.engine", "server engine"),
    ("server.version", "server version"),
    ("server.tp_size", "server tp_size"),
)


def _dig(meta: dict[str, Any], dotted: str) -> Any:
    cur: Any = meta
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def _notes(comp: Comparison) -> list[str]:
    notes: list[str] = []
    for r in comp.runs:
        notes += [f"{r.label}: {n}" for n in r.run.notices]
        status = r.run.meta.get("status")
        if status not in (None, "completed"):
            notes.append(f"{r.label}: run status is {status}: the last levels may be partial")
    for c in comp.levels:
        lacking = [r.label for r in comp.runs if not r.figures[c].measured]
        if lacking:
            notes.append(f"C={c}: no measured requests in {', '.join(lacking)}; shown as {MISSING}")
    for key, name in _SAME_KEYS:
        values = [_dig(r.run.meta, key) for r in comp.runs]
        if len({json.dumps(v, sort_keys=True, default=str) for v in values if v is not None}) > 1:
            shown = ", ".join(f"{r.label} {v}" for r, v in zip(comp.runs, values, strict=True))
            notes.append(f"the runs differ in {name} ({shown}): the comparison is not like for like")
    reps = [
        f"C={c} " + "/".join(str(r.figures[c].repeats) for r in comp.runs)
        for c in comp.levels
        if any(r.figures[c].repeats > 1 for r in comp.runs)
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
        notes += [f"{r.label}: {n}" for n in max_running_notes(r.run.meta, r.run.levels)]
    return notes


def render_text(comp: Comparison, fmt: str = "github", plot_name: str | None = None) -> str:
    """Header, table, verdict and notes as one text (markdown when fmt is github)."""
    lines = header_lines(comp) + ["", render_table(comp, fmt)]
    lines += ["", "## Verdict", ""] + [f"- {s}" for s in comp.sentences]
    if comp.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in comp.notes]
    if plot_name:
        lines += ["", f"![aggregate and per-request tok/s vs concurrency]({plot_name})"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- output directory and plot


def _safe(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-") or "run"


def default_out_dir(comp: Comparison, now: datetime | None = None) -> Path:
    """compare-<A>-vs-<B>[-vs-...]-<UTC time>/ next to the baseline run (results/ in the usual layout)."""
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    name = "compare-" + "-vs-".join(_safe(r.label) for r in comp.runs) + f"-{stamp}"
    return comp.baseline.run.run_dir.resolve().parent / name


def plot(comp: Comparison, path: Path) -> Path | None:
    from specload.plot import plot_comparison

    return plot_comparison(
        [(r.label, r.run.levels) for r in comp.runs], path, simulated=any(r.simulated for r in comp.runs)
    )


# ---------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specload compare",
        description="Side-by-side table of two or more run directories; the first one is the baseline.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="results/<label>-<timestamp>/ directories")
    p.add_argument("--format", default="github", help="github (default), plain, any tabulate format, csv or json")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--plot", metavar="PATH", help=f"write the plot here (default: OUT/{COMPARISON_PNG})")
    g.add_argument("--no-plot", action="store_true", help="do not draw the plot")
    p.add_argument(
        "--out", metavar="DIR", help=f"directory for {COMPARISON_MD} (default: compare-<A>-vs-<B>-<UTC time>/ "
        "next to the baseline run)",
    )  # fmt: skip
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Print the comparison and write comparison.md (+ plot); csv/json print only the data."""
    args = _parser().parse_args(argv)
    if len(args.runs) < 2:
        print("specload compare: give at least two run directories (the first is the baseline)", file=sys.stderr)
        return 2
    if not is_known_format(args.format):
        print(f"specload compare: unknown format {args.format!r}", file=sys.stderr)
        return 2
    runs: list[Run] = []
    for d in args.runs:
        if not Path(d).is_dir():
            print(f"specload compare: {d}: not a directory (expected a specload run directory)", file=sys.stderr)
            return 2
        try:
            runs.append(load_run(d))
        except NotARunDir as e:
            print(f"specload compare: {e}", file=sys.stderr)
            return 2
    comp = build_comparison(runs)
    out = Path(args.out) if args.out else default_out_dir(comp)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"specload compare: cannot create {out}: {e}", file=sys.stderr)
        return 2
    plot_path: Path | None = None
    if not args.no_plot:
        plot_path = plot(comp, Path(args.plot) if args.plot else out / COMPARISON_PNG)
    md = out / COMPARISON_MD
    plot_ref = None
    if plot_path is not None:
        try:
            plot_ref = str(plot_path.resolve().relative_to(out.resolve()))
        except ValueError:
            plot_ref = str(plot_path.resolve())
    md.write_text(render_text(comp, "github", plot_ref))
    if args.format in EXTRA_FORMATS:
        sys.stdout.write(render_table(comp, args.format))
        side = header_lines(comp) + ["", *comp.sentences, *[f"- {n}" for n in comp.notes]]
        print("\n".join(side), file=sys.stderr)
    else:
        sys.stdout.write(render_text(comp, args.format))
    print(f"wrote {md}", file=sys.stderr)
    if plot_path is not None:
        print(f"wrote {plot_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
