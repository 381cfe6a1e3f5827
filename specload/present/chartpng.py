"""The HTML report's charts as one PNG (``specload report --plot``): the same list of charts
(specload.present.charts), drawn by matplotlib instead of as inline SVG, a grid of panels as
genai-bench's plots are, for a slide or a chat where an HTML file will not do.

Each panel draws a ``svg.Chart`` as it is: its lines, dashes, point labels and marks, a base-2 x axis
where the chart has one; nothing is computed here. matplotlib is the optional extra of
specload.present.plot (None, after its one-line notice, without it).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specload.present.plot import MISSING_NOTICE
from specload.present.svg import PALETTE, Chart

CHARTS_PNG = "charts.png"
COLUMNS = 3


def plot_charts(charts: Sequence[Chart], path: str | Path, *, title: str = "") -> list[str] | None:
    """Draw every chart with points into one PNG at ``path``; returns the keys drawn, in order
    (None without matplotlib)."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print(MISSING_NOTICE, file=sys.stderr)
        return None
    shown = [c for c in charts if c.has_points()]
    if not shown:
        return []
    rows = math.ceil(len(shown) / COLUMNS)
    fig = Figure(figsize=(5.2 * COLUMNS, 3.6 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, COLUMNS, squeeze=False).ravel()
    for ax, chart in zip(axes, shown, strict=False):
        _draw(ax, chart)
    for ax in axes[len(shown) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=90)
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
    for m in chart.marks:
        a.axvline(m.x, linestyle=":", color="grey", linewidth=1)
    if chart.log2_x:
        a.set_xscale("log", base=2)
    if chart.y_from_zero:
        a.set_ylim(bottom=0)
    a.set_title(chart.title, fontsize="medium")
    a.set_xlabel(chart.x_label, fontsize="small")
    a.set_ylabel(chart.y_label, fontsize="small")
    a.grid(True, alpha=0.3)
    if any(s.name for s in chart.series):
        a.legend(fontsize="x-small")
