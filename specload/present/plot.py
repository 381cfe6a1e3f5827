"""The comparison as pictures: aggregate and per-request tok/s vs concurrency, one line per run, and
the per-user vs aggregate trade-off (the Pareto picture).

It draws a finished ``Comparison`` (specload.analysis.comparison) and computes nothing itself, so the
lines, the crossovers and the verdict sentence always agree. matplotlib is an optional extra
(``pip install 'specload[plot]'``); it is imported only when a plot is drawn, and drawn with the
non-interactive Agg canvas (no display, no global backend switch). Without it the plot is skipped
with a one-line notice and everything else carries on.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specload.analysis import figures
from specload.analysis.comparison import CONCURRENCY, Axis, ComparedRun, Comparison, Crossover
from specload.analysis.metrics import SERIES_BUCKET_S, LevelStats

MISSING_NOTICE = "plot skipped: matplotlib is not installed (pip install 'specload[plot]')"

# The figure table's charts a comparison marks its crossovers on: one panel each, its figure's
# crossovers (Crossovers has a field per such figure key) drawn on it.
_PANELS = tuple(ch for ch in figures.CHARTS if ch.marks)


def _series(run: ComparedRun, cs: list[float], field: str) -> tuple[list[float], list[float]]:
    """The run's points of one figure (its JSON field), skipping levels it has no value for."""
    pts = [(c, run.figures[c].of(field)) for c in cs]
    return [c for c, v in pts if v is not None], [v for _, v in pts if v is not None]


def _save(fig: Any, out: Path, heading: str, comparison: Comparison) -> Path:
    """Title (marked SIMULATED when a run measured the simulator) and write the PNG."""
    fig.suptitle(heading + (" (SIMULATED)" if comparison.simulated else ""))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=100)
    return out


def _level_name(s: LevelStats) -> str:
    head = f"C={s.concurrency}" if s.rate is None else f"{s.rate:g} req/s"
    return head + (f" r{s.repeat}" if s.repeat else "")


def crossover_label(label: str, x: Crossover, axis: Axis = CONCURRENCY) -> str:
    """The plot's words for a crossover, as the verdict says it (about C=32 inside the noise; between
    single runs a sign change, which the verdict does not call a crossover either)."""
    word = "sign change" if x.single_runs else "crossover"
    if x.inside_noise:
        return f"{label} {word}\nabout {axis.at(x.at if axis.rate else round(x.at))}\n(inside the noise)"
    return f"{label} {word}\n{axis.near(x.at)}"


def _mark_crossover(ax: Any, label: str, x: Crossover, axis: Axis) -> None:
    """A dashed line at an interpolated crossover; a dotted one at a level inside the noise."""
    ax.axvline(x.at, linestyle=":" if x.inside_noise else "--", color="grey", linewidth=1)
    ax.annotate(
        crossover_label(label, x, axis),
        xy=(x.at, 1.0),
        xycoords=("data", "axes fraction"),
        xytext=(4, -4),
        textcoords="offset points",
        va="top",
        fontsize=8,
        color="dimgrey",
    )


def _panel(ax: Any, comp: Comparison, cs: list[float], chart: figures.ChartSpec) -> None:
    key, name = chart.lines[0][0], chart.title
    for run in comp.runs:
        xs, ys = _series(run, cs, figures.BY_KEY[key].field)
        if xs:
            ax.plot(xs, ys, marker="o", label=run.label)
    for t in comp.treatments:
        for x in getattr(comp.crossovers[t.label], key):
            _mark_crossover(ax, t.label, x, comp.axis)
    if cs:
        from matplotlib.ticker import NullLocator

        ax.set_xscale("log", base=2)
        ax.set_xticks(cs, [f"{c:g}" for c in cs])
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("request rate (req/s, log2)" if comp.axis.rate else "concurrency C (log2)")
    ax.set_ylabel(chart.y_label)
    ax.set_title(f"{name} vs {comp.axis.name}")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()


def plot_comparison(comparison: Comparison, path: str | Path, *, title: str | None = None) -> Path | None:
    """Write one PNG with a panel per chart of the figure table that marks crossovers (aggregate
    tok/s, per-request tok/s vs C) and return its path.

    Each run is a line through its figures per level (repeats averaged), on a log2 x axis with the
    measured levels as ticks; each treatment's crossovers with the baseline (comparison.crossover,
    the ones the verdict names) are vertical dashed lines, dotted and labelled "(inside the noise)"
    where the crossing is a level whose change is inside the noise. A simulated run puts SIMULATED
    in the title. Returns None (after printing one line to stderr) when matplotlib is not installed.
    """
    try:
        import matplotlib  # noqa: F401 - first, so a blocked/missing package fails here
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print(MISSING_NOTICE, file=sys.stderr)
        return None

    out = Path(path)
    cs = [c for c in comparison.levels if c > 0]
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(_PANELS))
    for ax, chart in zip(axes, _PANELS, strict=True):
        _panel(ax, comparison, cs, chart)
    return _save(fig, out, title or "specload: " + " vs ".join(r.label for r in comparison.runs), comparison)


def plot_series(
    levels: Sequence[LevelStats],
    path: str | Path,
    *,
    title: str = "",
    simulated: bool = False,
    bucket_s: float = SERIES_BUCKET_S,
) -> Path | None:
    """Output tok/s over time, one line per level (``LevelStats.tok_s_series``), each from its own
    first send: where a level ramped, held and drained, and whether it ever held. Returns None
    (after one line on stderr) without matplotlib."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print(MISSING_NOTICE, file=sys.stderr)
        return None
    out = Path(path)
    fig = Figure(figsize=(9, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for s in levels:
        if s.tok_s_series:
            xs = [(i + 0.5) * bucket_s for i in range(len(s.tok_s_series))]
            line = ax.plot(xs, s.tok_s_series, marker=".", label=_level_name(s))
            if s.steady_tok_s is not None:
                ax.axhline(s.steady_tok_s, color=line[0].get_color(), linestyle=":", linewidth=1)
    ax.set_xlabel(f"seconds since the level's first request ({bucket_s:g} s buckets)")
    ax.set_ylabel("output tok/s")
    ax.grid(True, alpha=0.3)
    ax.legend(title="level (dotted: Steady tok/s)", fontsize="small")
    fig.suptitle((title or "specload: output tok/s over time") + (" (SIMULATED)" if simulated else ""))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=100)
    return out


def _x_label(x: float, axis: Axis) -> str:
    return f"{x:g} req/s" if axis.rate else f"C={x:.0f}"


def plot_pareto(comparison: Comparison, path: str | Path, *, title: str | None = None) -> Path | None:
    """The trade-off picture: per-user decode tok/s (y) against aggregate tok/s (x), one point per
    level labelled with its C (or request rate), one curve per run; the SLO's per-user floor (1 / its TPOT threshold)
    as a dashed line. A filled point met the SLO, a hollow one did not. Up and to the right is
    better: a run whose curve lies above another's serves each user faster at the same aggregate
    throughput. Returns None (after one line on stderr) without matplotlib.
    """
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print(MISSING_NOTICE, file=sys.stderr)
        return None
    slo = comparison.slo
    out = Path(path)
    fig = Figure(figsize=(8, 6), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    placed: list[tuple[float, float]] = []  # labels so far, to stack the labels of points that coincide
    span_x = max((p.agg_tok_s for pts in slo.pareto.values() for p in pts), default=1.0) or 1.0
    span_y = max((p.user_tok_s for pts in slo.pareto.values() for p in pts), default=1.0) or 1.0
    for run in comparison.runs:
        pts = sorted(slo.pareto.get(run.label, []), key=lambda p: p.x)
        if not pts:
            continue
        (line,) = ax.plot([p.agg_tok_s for p in pts], [p.user_tok_s for p in pts], marker="", label=run.label)
        color = line.get_color()
        for p in pts:
            hollow = p.met is False
            ax.plot(
                [p.agg_tok_s],
                [p.user_tok_s],
                marker="o",
                linestyle="",
                color=color,
                markerfacecolor="white" if hollow else color,
            )
            near = sum(
                1
                for x, y in placed
                if abs(x - p.agg_tok_s) < 0.03 * span_x and abs(y - p.user_tok_s) < 0.03 * span_y
            )
            placed.append((p.agg_tok_s, p.user_tok_s))
            ax.annotate(
                _x_label(p.x, comparison.axis),
                xy=(p.agg_tok_s, p.user_tok_s),
                xytext=(4, 4 + 10 * near),
                textcoords="offset points",
                fontsize=8,
                color=color,
            )
    if slo.floor_tok_s is not None and slo.slo is not None:
        target = slo.slo.target("tpot")
        ax.axhline(slo.floor_tok_s, linestyle="--", color="grey", linewidth=1)
        ax.annotate(
            f"SLO floor: {slo.floor_tok_s:.3g} tok/s per user ({target.text if target else ''})",
            xy=(0.0, slo.floor_tok_s),
            xycoords=("axes fraction", "data"),
            xytext=(4, 4),
            textcoords="offset points",
            fontsize=8,
            color="dimgrey",
        )
    ax.set_xlabel("aggregate output tok/s")
    ax.set_ylabel(f"per-user tok/s while decoding (1 / {slo.user_stat})")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(title="filled: met the SLO" if slo.slo is not None else None, fontsize="small")
    heading = title or "specload: per-user vs aggregate tok/s, " + " vs ".join(
        r.label for r in comparison.runs
    )
    return _save(fig, out, heading, comparison)
