"""Finished runs as specload's web page shows them: the results folder's runs, one run's report, and a
comparison of several, each as plain data (JSON) for the page.

Everything here is made by specload's own report and compare code (``render_report``,
``build_comparison``, ``plot_comparison``), so the page shows and offers for download exactly what
``specload report`` and ``specload compare`` print: the report's JSON is byte for byte what
``specload report DIR --format json`` writes. Nothing is written into the run directories.

The web UI runs the report and the comparison in a child Python (``python -m specload.present.webview
report DIR`` / ``compare DIR DIR ...``, one JSON document on stdout): reading a big run takes
seconds of CPU, which must not be taken from the Locust process while it drives a sweep. Listing
the runs reads only their run.json (specload.core.safeopen) and stays in the web UI's process, in a
native thread with a deadline (specload.locust.offhub), never on the hub that drives the sweep.
"""

from __future__ import annotations

import base64
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from specload.analysis.comparison import build_comparison
from specload.analysis.metrics import level_json
from specload.analysis.run import NotARunDir, load_run
from specload.core.rundir import REPORT_MD, RUN_JSON, read_run_meta
from specload.present.acceptcompare import source_lines
from specload.present.chartpng import MISSING_NOTICE, plot_comparison
from specload.present.compare import load_runs, table_columns, table_rows
from specload.present.compare import render_table as compare_table
from specload.present.compare import render_text as compare_text
from specload.present.report import render_report
from specload.workload.recorded import recorded_scenario


class NoSuchRun(ValueError):
    """A run name that is not a run directory directly inside the results folder."""


def run_path(results_dir: str | Path, name: str) -> Path:
    """The run directory ``name`` inside ``results_dir``: only a plain name (no path, not hidden) of a
    directory holding run.json. The page asks for runs by the names ``list_runs`` gave it."""
    if not name or name != Path(name).name or name.startswith(".") or "\\" in name:
        raise NoSuchRun(f"not a run name: {name[:100]!r}")
    base = Path(results_dir).resolve()
    path = (base / name).resolve()
    if path.parent != base or not (path / RUN_JSON).is_file():
        raise NoSuchRun(f"no run {name!r} in {results_dir}")
    return path


def list_runs(results_dir: str | Path) -> list[dict[str, Any]]:
    """Every run directory directly inside ``results_dir`` (newest first), from its run.json alone."""
    base = Path(results_dir)
    try:
        dirs = [d for d in base.iterdir() if d.is_dir() and not d.name.startswith(".")]
    except OSError:
        return []
    runs = []
    for d in dirs:
        try:
            meta = read_run_meta(d)
        except (OSError, ValueError):
            continue
        sc = recorded_scenario(meta)
        runs.append(
            {
                "name": d.name,
                "label": meta.label,
                "status": meta.status,
                "started_at": meta.started_at,
                "ended_at": meta.ended_at,
                "host": meta.host,
                "backend": meta.backend,
                "model": meta.model,
                "scenario": sc.name if sc else None,
                "scenario_file": meta.scenario_file,
                "levels": [lv.concurrency for lv in meta.levels],
                "rates": (sc.rates if sc else None) or None,
                "simulated": meta.simulated,
                "input_tokens": sc.input_tokens if sc else None,
                "output_tokens": sc.output_tokens if sc else None,
                "report": (d / REPORT_MD).is_file(),
            }
        )
    runs.sort(key=lambda r: (r["started_at"] or 0.0, r["name"]), reverse=True)
    return runs


def shown_path(path: str | Path) -> str:
    """A run directory as the page and its downloads name it: relative to where specload runs (the CLI
    prints it as typed), else its name alone; never an absolute path, which would carry the home
    directory of whoever ran it into a report attached to a ticket."""
    p = Path(path).resolve()
    try:
        return str(p.relative_to(Path.cwd().resolve()))
    except ValueError:
        return p.name


def _relative(value: Any, dirs: Sequence[str | Path]) -> Any:
    """``value`` (a bundle) with each run directory's absolute path, at any depth, replaced by shown_path."""
    pairs = sorted(
        {(str(Path(d).resolve()), shown_path(d)) for d in dirs}
        | {(str(Path(d)), shown_path(d)) for d in dirs},
        key=lambda kv: -len(kv[0]),
    )
    pairs = [(a, b) for a, b in pairs if Path(a).is_absolute()]

    def fix(v: Any) -> Any:
        if isinstance(v, str):
            for a, b in pairs:
                v = v.replace(a, b)
            return v
        if isinstance(v, list):
            return [fix(x) for x in v]
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        return v

    return fix(value)


def report_bundle(run_dir: str | Path) -> dict[str, Any]:
    """One run's report: the markdown (report.md's text), the json and csv ``specload report`` prints,
    and every level's figures (the json's data, for the page's charts)."""
    from specload.present.htmlpage import figures_html, report_charts, report_page

    run = load_run(run_dir)
    as_json = render_report(run, "json")
    charts = report_charts(run)
    markdown = render_report(run, "github")
    return _relative(
        {
            "run_dir": str(run.run_dir),
            "label": run.label,
            "status": run.info.status,
            "simulated": run.info.simulated,
            "markdown": markdown,
            "html": report_page(run, markdown),  # report.html, the self-contained page (--format html)
            "json": as_json,
            "csv": render_report(run, "csv"),
            "levels": [level_json(s) for s in run.levels],
            # the HTML report's charts (inline SVG, specload.present.charts), drawn on the page as they are
            "charts_html": figures_html(charts, "run-"),
            "charts": [c.key for c in charts if c.has_points()],
        },
        [run_dir],
    )


def compare_bundle(run_dirs: Sequence[str | Path], plot: bool = True) -> dict[str, Any]:
    """``specload compare`` of the run directories (the first is the baseline): its text, table,
    verdict and notes, json and csv, and the plot as a base64 PNG (None without matplotlib)."""
    if len(run_dirs) < 2:
        raise ValueError("choose at least two runs (the first is the baseline)")
    comp = build_comparison(load_runs(run_dirs))  # as `specload compare` reads them (one SLO)
    png = None
    plot_note = None
    if plot:
        with tempfile.TemporaryDirectory(prefix="specload-compare-") as tmp:
            path = plot_comparison(comp, Path(tmp) / "comparison.png")
            if path is None:
                plot_note = MISSING_NOTICE
            else:
                png = base64.b64encode(path.read_bytes()).decode()
    from specload.present.htmlpage import compare_charts, compare_page, figures_html

    markdown = compare_text(comp, "github")
    charts = compare_charts(comp)
    return _relative(
        {
            "runs": [r.label for r in comp.runs],
            "markdown": markdown,
            "html": compare_page(comp, markdown),  # comparison.html (--format html)
            "columns": table_columns(comp),
            "rows": table_rows(comp),
            "sentences": comp.sentences,
            "notes": comp.notes + source_lines(comp),  # (+ where each run's acceptance came from)
            "json": compare_table(comp, "json"),
            "csv": compare_table(comp, "csv"),
            "png": png,
            "plot_note": plot_note,
            # the HTML comparison's charts (inline SVG, specload.present.charts), drawn on the page as they are
            "charts_html": figures_html(charts, "compare-"),
            "charts": [c.key for c in charts if c.has_points()],
        },
        run_dirs,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``report DIR`` or ``compare DIR DIR [...]``: the bundle as one JSON document on stdout; an
    error as ``{"error": ...}`` with exit code 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if len(args) == 2 and args[0] == "report":
            out = report_bundle(args[1])
        elif len(args) >= 3 and args[0] == "compare":
            out = compare_bundle(args[1:])
        else:
            raise ValueError("usage: python -m specload.present.webview report DIR | compare DIR DIR [...]")
    except (NotARunDir, ValueError, OSError) as e:
        sys.stdout.buffer.write(orjson.dumps({"error": str(e)}))
        return 2
    sys.stdout.buffer.write(orjson.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
