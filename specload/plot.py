"""The comparison as a picture: aggregate and per-request tok/s vs concurrency, one line per run.

matplotlib is an optional extra (``pip install 'specload[plot]'``); it is imported only when a plot
is drawn, and drawn with the non-interactive Agg canvas (no display, no global backend switch).
Without it the plot is skipped with a one-line notice and everything else carries on.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from specload.compare import Figures, change_pct, crossover, figures_at
from specload.metrics import LevelStats

MISSING_NOTICE = "plot skipped: matplotlib is not installed (pip install 'specload[plot]')"

RunLevels = tuple[str, Sequence[LevelStats]]  # (label, that run's LevelStats rows, repeats included)


def _series(levels: Sequence[LevelStats], cs: Sequence[int], attr: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for c in cs:
        v = getattr(figures_at(levels, c), attr)
        if v is not None:
            xs.append(c)
            ys.append(v)
    return xs, ys


def _figures(runs_levels: Sequence[RunLevels], cs: Sequence[int]) -> list[dict[int, Figures]]:
    return [{c: figures_at(levels, c) for c in cs} for _, levels in runs_levels]


def plot_comparison(
    runs_levels: Sequence[RunLevels], path: str | Path, *, simulated: bool = False, title: str | None = None
) -> Path | None:
    """Write one PNG with two panels (aggregate tok/s, per-request tok/s vs C) and return its path.

    ``runs_levels``: (label, levels) per run, the first being the baseline; repeats of a level are
    averaged. The x axis is log2 with the measured levels as ticks; each treatment's crossover with
    the baseline is a vertical dashed line. ``simulated`` puts SIMULATED in the title. Returns None
    (after printing one line to stderr) when matplotlib is not installed.
    """
    try:
        import matplotlib  # noqa: F401 - first, so a blocked/missing package fails here
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import NullLocator
    except ImportError:
        print(MISSING_NOTICE, file=sys.stderr)
        return None

    out = Path(path)
    cs = sorted({s.concurrency for _, levels in runs_levels for s in levels if s.concurrency > 0})
    figs = _figures(runs_levels, cs)
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    panels = (("agg_tok_s", "Aggregate tok/s"), ("per_req_tok_s", "Per-request tok/s"))
    axes = fig.subplots(1, 2)
    for ax, (attr, name) in zip(axes, panels, strict=True):
        for label, levels in runs_levels:
            xs, ys = _series(levels, cs, attr)
            if xs:
                ax.plot(xs, ys, marker="o", label=label)
        base = figs[0]
        for (label, _), other in zip(runs_levels[1:], figs[1:], strict=True):
            changes = [change_pct(getattr(base[c], attr), getattr(other[c], attr)) for c in cs]
            for x in crossover(cs, changes):
                ax.axvline(x.at, linestyle="--", color="grey", linewidth=1)
                ax.annotate(
                    f"{label} crossover\nC≈{x.at:.0f}",
                    xy=(x.at, 1.0),
                    xycoords=("data", "axes fraction"),
                    xytext=(4, -4),
                    textcoords="offset points",
                    va="top",
                    fontsize=8,
                    color="dimgrey",
                )
        if cs:
            ax.set_xscale("log", base=2)
            ax.set_xticks(cs, [str(c) for c in cs])
            ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("concurrency C (log2)")
        ax.set_ylabel(name)
        ax.set_title(f"{name} vs concurrency")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if runs_levels:
            ax.legend()
    heading = title or "specload: " + " vs ".join(label for label, _ in runs_levels)
    if simulated:
        heading += " (SIMULATED)"
    fig.suptitle(heading)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=100)
    return out
