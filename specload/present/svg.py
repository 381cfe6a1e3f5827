"""Line charts as inline SVG text: the charts of the HTML report and comparison.

An HTML file that is attached to a ticket must open anywhere, offline and without scripts, so
its charts are SVG written here rather than PNGs beside it or a plotting library in the browser.
One kind of chart covers every figure a benchmarker looks for: lines of (x, y) points, a linear
or base-2 logarithmic x axis (concurrency levels 1, 4, 16, ... sit evenly on it), a y axis from
zero (or from the lowest value for a Pareto plot), gaps where a value is missing, optional labels
at points and dashed vertical marks (a crossover, a server's request cap). Pure functions of their
arguments, so a test can read every number a chart draws back out of its text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

# Colour-blind-safe (Okabe-Ito), in the order runs (or series without a run) get them; the first five
# have 3:1 contrast or more on white (WCAG 1.4.11), so a comparison of up to five runs uses only those.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#000000", "#E69F00", "#56B4E9", "#F0E442")


def colour_of(i: int) -> str:
    """The i-th run's colour, the same in every chart."""
    return PALETTE[i % len(PALETTE)]


WIDTH = 560
HEIGHT = 300
_LEFT, _RIGHT, _BOTTOM = 64, 16, 46


@dataclass(frozen=True)
class Series:
    """One line: ``ys[i]`` at ``xs[i]``; a None y leaves a gap. ``labels``: text beside each point."""

    name: str
    xs: Sequence[float]
    ys: Sequence[float | None]
    dashed: bool = False
    labels: Sequence[str] = ()
    colour: str | None = None  # its run's (colour_of); None: by its place among the chart's series


@dataclass(frozen=True)
class Mark:
    """A dashed vertical line at ``x`` with its text (a crossover, a cap)."""

    x: float
    text: str


@dataclass(frozen=True)
class Chart:
    """What one chart shows. ``key`` names it in the page (``data-chart``) for tests and links."""

    key: str
    title: str
    x_label: str
    y_label: str
    series: Sequence[Series]
    log2_x: bool = False
    y_from_zero: bool = True
    marks: Sequence[Mark] = field(default_factory=tuple)
    note: str | None = None  # one line under the chart (how the figure is made, when it matters)

    def has_points(self) -> bool:
        return any(y is not None and math.isfinite(y) for s in self.series for y in s.ys)


def nice_ticks(lo: float, hi: float, most: int = 6) -> list[float]:
    """Round tick values covering [lo, hi]: steps of 1, 2 or 5 times a power of ten."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, most - 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1.0, 2.0, 5.0, 10.0) if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    t = first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    if ticks[-1] < hi:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def number(v: float) -> str:
    """A tick's text: 1500 -> 1500, 0.25 -> 0.25, 12000 -> 12k, 2.5e6 -> 2.5M."""
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    return f"{v:.6g}"


def _log2_ticks(lo: float, hi: float) -> list[float]:
    first = math.floor(math.log2(lo))
    last = math.ceil(math.log2(hi))
    every = max(1, math.ceil((last - first + 1) / 9))
    return [2.0**e for e in range(first, last + 1, every)]


def _legend_rows(chart: Chart, width: int) -> int:
    """Extra legend rows beyond the first (the layout render draws)."""
    x, rows = float(_LEFT), 0
    for s in chart.series:
        w = 26 + 6.5 * len(s.name)
        if x + w > width - _RIGHT and x > _LEFT:
            x, rows = float(_LEFT), rows + 1
        x += w
    return rows


def render(chart: Chart, width: int = WIDTH, height: int = HEIGHT) -> str:
    """The chart as one ``<svg>`` element (no scripts, no external references)."""
    pts = [
        (x, y)
        for s in chart.series
        for x, y in zip(s.xs, s.ys, strict=True)
        if y is not None and math.isfinite(y) and math.isfinite(x) and (x > 0 or not chart.log2_x)
    ]
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-chart="{escape(chart.key)}" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">'
        f"<title>{escape(chart.title)}</title>"
        f'<rect width="{width}" height="{height}" fill="#fff"/>'
        f'<text x="{width / 2:.1f}" y="18" text-anchor="middle" font-size="14" font-weight="bold">'
        f"{escape(chart.title)}</text>"
    )
    if not pts:
        return (
            head + f'<text x="{width / 2:.1f}" y="{height / 2:.1f}" text-anchor="middle" fill="#666">'
            "no values to draw</text></svg>"
        )
    xs_all = [p[0] for p in pts] + [m.x for m in chart.marks if m.x > 0 or not chart.log2_x]
    x_lo, x_hi = min(xs_all), max(xs_all)
    if chart.log2_x:
        xticks = _log2_ticks(x_lo, x_hi)
        fx_lo, fx_hi = math.log2(min(xticks[0], x_lo)), math.log2(max(xticks[-1], x_hi))
    else:
        xticks = nice_ticks(x_lo, x_hi)
        fx_lo, fx_hi = xticks[0], xticks[-1]
    y_lo = 0.0 if chart.y_from_zero else min(p[1] for p in pts)
    y_hi = max(p[1] for p in pts)
    yticks = nice_ticks(min(0.0, y_lo) if chart.y_from_zero else y_lo, y_hi if y_hi > y_lo else y_lo + 1)
    fy_lo, fy_hi = yticks[0], yticks[-1]
    top = 42 + 13 * _legend_rows(chart, width)
    pw, ph = width - _LEFT - _RIGHT, height - top - _BOTTOM

    def sx(x: float) -> float:
        v = math.log2(x) if chart.log2_x else x
        return _LEFT + (v - fx_lo) / ((fx_hi - fx_lo) or 1.0) * pw

    def sy(y: float) -> float:
        return top + ph - (y - fy_lo) / ((fy_hi - fy_lo) or 1.0) * ph

    out = [head]
    for t in yticks:
        y = sy(t)
        out.append(
            f'<line x1="{_LEFT}" x2="{_LEFT + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>'
            f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{number(t)}</text>'
        )
    for t in xticks:
        x = sx(t)
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" stroke="#f0f0f0"/>'
            f'<text x="{x:.1f}" y="{top + ph + 16}" text-anchor="middle" font-size="11">{number(t)}</text>'
        )
    out.append(f'<rect x="{_LEFT}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>')
    out.append(
        f'<text x="{_LEFT + pw / 2:.1f}" y="{height - 8}" text-anchor="middle" font-size="12">'
        f"{escape(chart.x_label)}</text>"
        f'<text transform="translate(14 {top + ph / 2:.1f}) rotate(-90)" text-anchor="middle" '
        f'font-size="12">{escape(chart.y_label)}</text>'
    )
    for k, m in enumerate(chart.marks):
        if chart.log2_x and m.x <= 0:
            continue
        x = sx(m.x)
        # each mark's text on a row of its own; on the right half it reads leftwards from its line
        right = x > _LEFT + pw / 2
        tx, anchor = (x - 3, "end") if right else (x + 3, "start")
        out.append(
            f'<line class="mark" x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" stroke="#555" '
            f'stroke-dasharray="4 3"/><text x="{tx:.1f}" y="{top + 12 + 12 * k}" font-size="10" '
            f'fill="#333" text-anchor="{anchor}">{escape(m.text)}</text>'
        )
    for i, s in enumerate(chart.series):
        colour = s.colour or colour_of(i)
        dash = ' stroke-dasharray="6 3"' if s.dashed else ""
        runs: list[list[tuple[float, float]]] = [[]]
        for vx, vy in zip(s.xs, s.ys, strict=True):
            if vy is None or not math.isfinite(vy) or (chart.log2_x and vx <= 0):
                if runs[-1]:
                    runs.append([])
                continue
            runs[-1].append((sx(vx), sy(vy)))
        out.append(f'<g class="series" data-name="{escape(s.name)}" data-colour="{colour}">')
        for run in runs:
            if len(run) > 1:
                path = " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
                out.append(
                    f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>'
                )
            for x, y in run:
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}"/>')
        labelled = [
            (sx(x), sy(y), text)
            for x, y, text in zip(s.xs, s.ys, s.labels, strict=False)
            if y is not None and math.isfinite(y) and text and (x > 0 or not chart.log2_x)
        ]
        for x, y, text in labelled:
            out.append(
                f'<text x="{x + 4:.1f}" y="{y - 4:.1f}" font-size="9" fill="{colour}">{escape(text)}</text>'
            )
        out.append("</g>")
    # legend: one row (or more) between the title and the plot, so that it never hides a line
    x, y = float(_LEFT), 32.0
    for i, s in enumerate(chart.series):
        colour = s.colour or colour_of(i)
        dash = ' stroke-dasharray="6 3"' if s.dashed else ""
        w = 26 + 6.5 * len(s.name)
        if x + w > width - _RIGHT and x > _LEFT:
            x, y = float(_LEFT), y + 13
        out.append(
            f'<line x1="{x:.1f}" x2="{x + 18:.1f}" y1="{y - 4:.1f}" y2="{y - 4:.1f}" stroke="{colour}" '
            f'stroke-width="2"{dash}/><text x="{x + 22:.1f}" y="{y:.1f}" font-size="11">{escape(s.name)}</text>'
        )
        x += w
    out.append("</svg>")
    return "".join(out)
