"""The charts as PNG files, drawn by matplotlib: ``specload report --plot`` (charts.png, every chart of
the HTML report in a grid of panels, as genai-bench's plots are, and tok_s_over_time.png) and
``specload compare`` (comparison.png, the throughput charts with their crossovers, and pareto.png),
for a slide or a chat where an HTML file will not do.

A ``svg.Chart`` (specload.present.charts) is drawn as it is: its lines, dashes, point labels and marks,
a base-2 x axis where the chart has one; nothing is computed here. The trade-off picture (pareto.png,
docs/metrics.md) is the one PNG with no chart of its own: it draws the comparison's SLO figures
(``Comparison.slo``). matplotlib is an optional extra (``pip install 'specload[plot]'``); it is
imported only when a plot is drawn, and drawn with the non-interactive Agg canvas (no display, no
global backend switch). Without it the plot is skipped with a one-line notice and everything else
carries on.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specload.analysis import figures
from specload.analysis.comparison import Axis, Comparison
from specload.analysis.metrics import SERIES_BUCKET_S, LevelStats
from specload.present.svg import PALETTE, Chart

MISSING_NOTICE = "plot skipped: matplotlib is not installed (pip install 'specload[plot]')"
CHARTS_PNG = "charts.png"
COLUMNS = 3


def _figure(width: float, height: float) -> Any:
    """A matplotlib Figure on its own Agg canvas, or None (after MISSING_NOTICE on stderr) without
    matplotlib."""
    try:
        import matplotlib  # noqa: F401 - first, so a blocked/missing package fails here
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print(MISSING_NOTICE, file=sys.stderr)
        return None
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: str | Path, title: str, simulated: bool = False, dpi: int = 100) -> Path:
    """Title (marked SIMULATED when a run measured the simulator) and write the PNG."""
    if title:
        fig.suptitle(title + (" (SIMULATED)" if simulated else ""))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=dpi)
    return out


def plot_charts(
    charts: Sequence[Chart], path: str | Path, *, title: str = "", simulated: bool = False, dpi: int = 90
) -> list[str] | None:
    """Draw every chart with points into one PNG at ``path``, up to COLUMNS panels a row; returns the
    keys drawn, in order (nothing written when no chart has points; None without matplotlib)."""
    shown = [c for c in charts if c.has_points()]
    columns, rows = min(COLUMNS, len(shown)), math.ceil(len(shown) / COLUMNS)
    fig = _figure(5.2 * columns, 3.6 * rows)
    if fig is None or not shown:
        return None if fig is None else []
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    for ax, chart in zip(axes, shown, strict=False):
        _draw(ax, chart)
    for ax in axes[len(shown) :]:
        ax.set_visible(False)
    _save(fig, path, title, simulated, dpi=dpi)
    return [c.key for c in shown]


def _draw(a: Any, chart: Chart) -> None:
    for i, s in enumerate(chart.series):
        pts = [
            (x, y, s.labels[k] if k < len(s.labels) else "")
            for k, (x, y) in enumerate(zip(s.xs, s.ys, strict=True))
            if y is not None and math.isfinite(y)
        ]
        if not pts:
            continue
        colour = s.colour or PALETTE[i % len(PALETTE)]  # its run's, as in the HTML (svg.Series)
        a.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            marker=".",
            linestyle="--" if s.dashed else "-",
            color=colour,
            label=s.name or None,
        )
        for x, y, text in pts:
            if text:
                a.annotate(text, (x, y), fontsize="x-small", xytext=(3, 3), textcoords="offset points")
    if chart.log2_x:
        a.set_xscale("log", base=2)
        a.xaxis.set_major_formatter("{x:g}")  # 16, as the SVG writes its powers of 2, not 2^4
    scale = math.log2 if chart.log2_x else float
    lo, hi = (scale(v) for v in a.get_xlim())
    for k, m in enumerate(chart.marks):
        if chart.log2_x and m.x <= 0:
            continue
        # each mark's text on a row of its own; on the right half it reads leftwards, as the SVG writes it
        right = scale(m.x) > (lo + hi) / 2
        a.axvline(m.x, linestyle=":", color="grey", linewidth=1)
        a.annotate(
            m.text,
            xy=(m.x, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(-3 if right else 3, -10 - 10 * k),
            textcoords="offset points",
            ha="right" if right else "left",
            fontsize="x-small",
            color="dimgrey",
        )
    if chart.y_from_zero:
        a.set_ylim(bottom=0)
    a.set_title(chart.title, fontsize="medium")
    a.set_xlabel(chart.x_label, fontsize="small")
    a.set_ylabel(chart.y_label, fontsize="small")
    a.grid(True, alpha=0.3)
    if any(s.name for s in chart.series):
        a.legend(fontsize="x-small")


def plot_comparison(comparison: Comparison, path: str | Path, *, title: str | None = None) -> Path | None:
    """comparison.png: the comparison's charts of the figures whose crossovers the verdict names
    (aggregate and per-request tok/s vs C, figures.CHARTS' ``marks``), as its HTML page draws them,
    each with its own figure's crossovers marked. Returns its path, or None (after one line on
    stderr) without matplotlib."""
    from specload.present.htmlpage import compare_charts  # (the page's module draws the runs' lines)

    keys = {ch.key for ch in figures.CHARTS if ch.marks}
    heading = title or "specload: " + " vs ".join(r.label for r in comparison.runs)
    drawn = plot_charts(
        [c for c in compare_charts(comparison) if c.key in keys],
        path,
        title=heading,
        simulated=comparison.simulated,
        dpi=125,  # (two panels, read on their own: the README shows this picture)
    )
    return Path(path) if drawn else None


def _level_name(s: LevelStats) -> str:
    head = f"C={s.concurrency}" if s.rate is None else f"{s.rate:g} req/s"
    return head + (f" r{s.repeat}" if s.repeat else "")


def plot_series(
    levels: Sequence[LevelStats],
    path: str | Path,
    *,
    title: str = "",
    simulated: bool = False,
    bucket_s: float = SERIES_BUCKET_S,
) -> Path | None:
    """Output tok/s over time, one line per level (``LevelStats.tok_s_series``), each from its own
    first send, its Steady tok/s dotted: where a level ramped, held and drained, and whether it ever
    held. Returns None (after one line on stderr) without matplotlib."""
    fig = _figure(9, 4.8)
    if fig is None:
        return None
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
    return _save(fig, path, title or "specload: output tok/s over time", simulated)


def _x_label(x: float, axis: Axis) -> str:
    return f"{x:g} req/s" if axis.rate else f"C={x:.0f}"


def plot_pareto(comparison: Comparison, path: str | Path, *, title: str | None = None) -> Path | None:
    """The trade-off picture: per-user decode tok/s (y) against aggregate tok/s (x), one point per
    level labelled with its C (or request rate), one curve per run; the SLO's per-user floor (1 / its TPOT threshold)
    as a dashed line. A filled point met the SLO, a hollow one did not. Up and to the right is
    better: a run whose curve lies above another's serves each user faster at the same aggregate
    throughput. Returns None (after one line on stderr) without matplotlib.
    """
    fig = _figure(8, 6)
    if fig is None:
        return None
    slo = comparison.slo
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
    return _save(fig, path, heading, comparison.simulated)
