"""Baseline vs speculative decoding, side by side: ``specload compare RUN_A RUN_B [RUN_C ...]``.

The numbers, crossovers and verdict come finished from specload.analysis.comparison; this module lays them
out (the side-by-side table in any --format, the markdown text, the JSON document), writes
comparison.md and the plot, and is the command line. Code that wants a comparison without argv
calls ``run_compare``; code that wants only the numbers calls ``comparison.build_comparison``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from specload.analysis import figures
from specload.analysis.comparison import (
    DRIFT_MARK,
    NOISE_MARK,
    NOT_COMPARABLE,
    SINGLE_MARK,
    CategoryComparison,
    Change,
    ComparedRun,
    Comparison,
    build_comparison,
    drifted,
)
from specload.analysis.figures import Figure
from specload.analysis.foreign import MARK, ForeignError, ForeignRun, load_foreign, mark_cells
from specload.analysis.metrics import RepeatedLevelStats, level_json
from specload.analysis.run import REREAD_HELP, RUN_SLO, NotARunDir, Run, default_processes, load_run
from specload.analysis.slo_compare import level_met
from specload.core.rundir import read_run_meta, safe_name
from specload.core.slo import Slo, SloError, parse_slo
from specload.core.text import MISSING, fmt_count, fmt_num, fmt_pct
from specload.present.acceptcompare import Group, accept_groups, change_json, run_json, source_lines
from specload.present.chartpng import plot_comparison, plot_pareto
from specload.present.colour import for_stream, is_terminal
from specload.present.output import fit_text, format_help, is_document, is_known_format, is_page, render_view
from specload.present.output import render_table as output_table
from specload.present.pairedview import paired_json, paired_lines, sentence
from specload.present.tableview import (
    SETTLE,
    SETTLE_HEADER,
    WHOLE,
    TableView,
    columns_help,
    terminal_width,
    view_for,
)
from specload.workload.recorded import recorded_scenario

COMPARISON_MD = "comparison.md"
COMPARISON_PNG = "comparison.png"
PARETO_PNG = "pareto.png"


# ---------------------------------------------------------------- table


def _fmt_half(hw: float) -> str:
    return f"±{hw:.1f}%" if hw < 1 else f"±{round(hw)}%"


def change_cell(ch: Change) -> str:
    """+12%, with the interval when there is one (+12% (±3%)) and NOISE_MARK when the change is
    inside the noise; NOT_COMPARABLE (n/c) where the runs are not comparable (the notes say why)."""
    if ch.pct is None:
        return MISSING
    if not ch.comparable:
        return NOT_COMPARABLE
    text = fmt_pct(ch.pct)
    if ch.ci is not None:
        text += f" ({_fmt_half(ch.ci)})"
    if ch.single:
        text += f" {SINGLE_MARK}"
    return text + (f" {NOISE_MARK}" if ch.noise else "")


def agg_cell(f: RepeatedLevelStats) -> str:
    """A run's aggregate tok/s, with DRIFT_MARK when its throughput drifted within the level."""
    return fmt_num(f.of("agg_tok_s"), 1) + (f" {DRIFT_MARK}" if drifted(f) else "")


def _met_cell(f: RepeatedLevelStats) -> str:
    """yes / no: every repeat of the level met the SLO; ``~`` when a repeat's verdict is inside the noise."""
    met = level_met(f)
    if met is None:
        return MISSING
    return ("yes" if met else "no") + (
        " ~" if any(s.slo is not None and s.slo.inside_noise for s in f.levels) else ""
    )


def plain_change_cell(ch: Change) -> str:
    """A change without its interval (a figure beside the verdict's two): +12%, or n/c where the
    level is not comparable (a chunk count skews TPOT too)."""
    return NOT_COMPARABLE if ch.pct is not None and not ch.comparable else fmt_pct(ch.pct)


def _server_cell(f: RepeatedLevelStats) -> str:
    run, queued = f.of("server_running_max"), f.of("server_queued_max")
    if run is None and queued is None:
        return MISSING
    return f"{fmt_count(run)} / {fmt_count(queued)}"


# A run's cell that is not its figure's combined number rounded (analysis.figures).
_CELLS: dict[str, Callable[[RepeatedLevelStats], str]] = {
    "agg": agg_cell,
    "srv_run_queue": _server_cell,
    "slo_met": _met_cell,
}
# The changes shown with their interval and marks: the two the verdict is about.
_WITH_INTERVAL = ("agg", "per_req")


def _change_cell(comp: Comparison, key: str, t: ComparedRun, i: int) -> str:
    ch = comp.changes[t.label][key][i]
    return change_cell(ch) if key in _WITH_INTERVAL else plain_change_cell(ch)


PER_REQ_HEADER = figures.BY_KEY["per_req"].header
# The acceptance details (present.acceptcompare) follow this figure's columns.
_DETAILS_AFTER = "accept_rate"
# The repeats to settle the signs of Δ agg and Δ per-req (the larger of the two) follow both changes,
# as a column of their own (tableview.SETTLE, ranked right after per-req tok/s).
_SETTLE_AFTER = "per_req"


def _figures(comp: Comparison) -> list[tuple[Figure, bool]]:
    """The figure table's compare figures, each with whether some run has it (Figure.show, over
    every repeat of every run)."""
    levels = [s for r in comp.runs for f in r.figures.values() for s in f.levels]
    return [(f, f.shown(levels)) for f in figures.FIGURES if f.compare]


def _run_cell(fig: Figure, f: RepeatedLevelStats) -> str:
    cell = _CELLS.get(fig.key)
    if cell is not None:
        return cell(f)
    v = f.of(fig.field)
    return fmt_num(None if v is None else v * fig.scale, fig.digits)


def _figure_cell(comp: Comparison, fig: Figure, r: ComparedRun, i: int) -> str:
    return _run_cell(fig, r.figures[comp.levels[i]])


def _has_spread(comp: Comparison) -> bool:
    """Some change has an interval (>= 2 repeats a side): the repeats-to-settle column is shown."""
    return any(ch.ci is not None for chs in (*comp.agg.values(), *comp.per_req.values()) for ch in chs)


def settle_cell(comp: Comparison, t: str, i: int) -> str:
    """Repeats per arm to settle the signs inside the noise at level ``i`` (the larger of agg's and
    per-request's, Change.settle_n: ~N); — where both are settled or there is no spread; - where
    there is no interval."""
    chs = [ch for ch in (comp.agg[t][i], comp.per_req[t][i]) if ch.usable and ch.ci is not None]
    ns = [ch.settle_n for ch in chs if ch.noise and ch.settle_n is not None]
    return f"~{max(ns)}" if ns else ("—" if chs else MISSING)


def _groups(comp: Comparison) -> list[Group]:
    """The table's column groups after the level axis, in order: per figure each run's value, then
    each treatment's change; the repeats to settle after the per-request change; the acceptance
    details after the acceptance rate."""
    groups: list[Group] = []
    for fig, shown in _figures(comp):
        if shown:
            groups.append(Group(fig.header, fig.key, run=partial(_figure_cell, comp, fig)))
        if shown and fig.delta:
            groups.append(Group(fig.delta, fig.key, change=partial(_change_cell, comp, fig.key)))
        if shown and fig.key == _SETTLE_AFTER and _has_spread(comp):
            groups.append(Group(SETTLE_HEADER, SETTLE, change=lambda t, i: settle_cell(comp, t.label, i)))
        if fig.key == _DETAILS_AFTER:
            groups += accept_groups(comp)
    return groups


def _axis_column(comp: Comparison) -> tuple[str, str]:
    return ("Req/s" if comp.axis.rate else "C", "c")


def _columns(comp: Comparison, groups: Sequence[Group] | None = None) -> list[tuple[str, str]]:
    """(header, key in tableview's ranking) of each column of the wide table, in order: the level
    axis, then per group a column per run (a figure) or per treatment (a change)."""
    cols = [_axis_column(comp)]
    for g in _groups(comp) if groups is None else groups:
        cols += [(f"{g.header} {r.label}", g.key) for r in (comp.runs if g.run else comp.treatments)]
    return cols


def table_columns(comp: Comparison) -> list[str]:
    return [name for name, _key in _columns(comp)]


def table_rows(comp: Comparison, groups: Sequence[Group] | None = None) -> list[list[str]]:
    """One row per level of the union; a level a run lacks shows '-' in that run's cells."""
    groups = _groups(comp) if groups is None else groups
    rows: list[list[str]] = []
    for i, c in enumerate(comp.levels):
        row = [f"{c:g}"]
        for g in groups:
            if g.run is not None:
                row += [g.run(r, i) for r in comp.runs]
            elif g.change is not None:
                row += [g.change(t, i) for t in comp.treatments]
        rows.append(row)
    cols = _columns(comp, groups)
    return mark_cells(cols, [r.label for r in comp.runs], [r.run for r in comp.runs], rows, MISSING)


def long_table(comp: Comparison) -> tuple[list[tuple[str, str]], list[list[str]]]:
    """The table for a narrow terminal: a row per level and run (its level shown on its first row),
    a column per group (a change's cell on each treatment's row): as wide for five runs as for two.
    Returns its (header, key) columns and rows."""
    groups = _groups(comp)
    cols = [_axis_column(comp), ("Run", "c"), *((g.header, g.key) for g in groups)]
    marked = {r.label: r.run.marked for r in comp.runs if isinstance(r.run, ForeignRun) and r.run.marks}
    rows = []
    for i, c in enumerate(comp.levels):
        for j, r in enumerate(comp.runs):
            row = [f"{c:g}" if j == 0 else "", r.label]
            for g in groups:
                cell = g.run(r, i) if g.run else (g.change(r, i) if g.change and j else "")
                if g.key in marked.get(r.label, ()) and cell not in ("", MISSING) and not cell.endswith(MARK):
                    cell += MARK
                row.append(cell)
            rows.append(row)
    return cols, rows


def _marks_dict(r: ComparedRun) -> dict[str, dict[str, str]]:
    """The figures of another tool's run whose definition differs from docs/metrics.md: JSON key ->
    the table's mark, the tool and how it differs (what the table's † and its note say); {} for specload's."""
    run = r.run
    if not isinstance(run, ForeignRun):
        return {}
    return {figures.BY_KEY[m.figure].field: {"mark": MARK, "tool": run.tool, "how": m.how} for m in run.marks}


def _figures_dict(r: ComparedRun, c: float) -> dict[str, Any]:
    f = r.figures[c]
    return {
        "concurrency": f.concurrency,
        "rate": f.rate,
        "repeats": len(f.repeats),
        "measured": f.measured,
        **f.combined,  # every figure of the table, its repeats combined (analysis.figures.combine)
        "agg_values": f.values("agg_tok_s"),
        "per_req_values": f.values("per_req_tok_s"),
        "levels": [level_json(s) for s in f.levels],  # every figure of every repeat, distributions included
        "quality": asdict(r.quality[c]),
        "marks": _marks_dict(r),
    }


def _run_info(r: ComparedRun, baseline: bool) -> dict[str, Any]:
    m = r.run.info
    return {
        "label": r.label,
        "baseline": baseline,
        "run_dir": str(r.run.run_dir),
        "host": m.host,
        "backend": m.backend,
        "model": m.model,
        "status": m.status,
        "simulated": r.simulated,
        "speculative_algorithm": m.server.speculative_algorithm,
        "max_running_requests": r.cap_value,
        "running_cap": r.cap.to_json() if r.cap is not None else None,
    }


def _changes_dict(comp: Comparison, t: ComparedRun, i: int) -> dict[str, Any]:
    k = comp.checks[t.label][i]
    tpot = comp.tpot[t.label][i]
    return {
        "agg": comp.agg[t.label][i].to_dict(),
        "per_req": comp.per_req[t.label][i].to_dict(),
        "tpot_pct": tpot if k.comparable else None,
        "tpot_raw_pct": tpot,
        "comparable": k.comparable,
        "not_comparable": list(k.reasons),
        "remarks": list(k.remarks),
        # the changes computed from a marked figure of this run (the table marks its Δ cells too)
        "marks": sorted(k for k in ("agg", "per_req") if figures.BY_KEY[k].field in _marks_dict(t)),
    }


def to_dict(comp: Comparison) -> dict[str, Any]:
    """The comparison as plain data, unrounded (what --format json prints)."""
    levels = [
        {
            ("rate" if comp.axis.rate else "concurrency"): c,
            "runs": {r.label: {**_figures_dict(r, c), **run_json(r, c, comp)} for r in comp.runs},
            "changes": {
                t.label: {**_changes_dict(comp, t, i), **change_json(comp, t, c)} for t in comp.treatments
            },
        }
        for i, c in enumerate(comp.levels)
    ]
    crossovers = {
        label: {"agg": [asdict(x) for x in xs.agg], "per_req": [asdict(x) for x in xs.per_req]}
        for label, xs in comp.crossovers.items()
    }
    return {
        "runs": [_run_info(r, i == 0) for i, r in enumerate(comp.runs)],
        "levels": levels,
        "crossovers": crossovers,
        "sentences": comp.sentences,
        "notes": comp.notes,
        "slo": comp.slo.to_json(),
        "categories": [_category_dict(comp, cc) for cc in comp.categories],
        "paired": paired_json(comp.paired),
    }


def _part_dict(f: RepeatedLevelStats) -> dict[str, Any]:
    """A part of a level (a category) over its repeats: its requests and every figure of the table."""
    return {
        "sent": sum(s.sent for s in f.levels),
        **f.combined,
        "agg_values": f.values("agg_tok_s"),
        "per_req_values": f.values("per_req_tok_s"),
    }


def _category_dict(comp: Comparison, cc: CategoryComparison) -> dict[str, Any]:
    """One prompt category of the comparison as plain data (Comparison.categories)."""
    return {
        "category": cc.category,
        "figures": {label: [_part_dict(f) for f in fs] for label, fs in cc.figures.items()},
        "changes": {t: {"per_req": [ch.to_dict() for ch in chs]} for t, chs in cc.per_req.items()},
        "crossovers": {t: {"per_req": [asdict(x) for x in xs]} for t, xs in cc.crossovers_per_req.items()},
        "sentences": cc.sentences,
    }


def category_lines(comp: Comparison, fmt: str = "github") -> list[str]:
    """The per-category table and verdict (a categorised dataset's runs); [] without categories."""
    ccs = comp.categories
    if not ccs:
        return []
    parts = [s for cc in ccs for fs in cc.figures.values() for f in fs for s in f.levels]
    cols = [
        f for f in figures.FIGURES if f.category and f.shown(parts)
    ]  # the figure table's category columns
    headers = ["Category", comp.axis.name.capitalize(), "Run", "Sent"]
    for fig in cols:
        headers += [fig.header, *([fig.delta] if fig.key == "per_req" else [])]
    rows = []
    for cc in ccs:
        for i, c in enumerate(comp.levels):
            for r in comp.runs:
                f = cc.figures[r.label][i]
                if not (sent := sum(s.sent for s in f.levels)):
                    continue
                per = cc.per_req.get(r.label)
                row = [cc.category, f"{c:g}", r.label, str(sent)]
                for fig in cols:
                    row += [
                        _run_cell(fig, f),
                        *([change_cell(per[i]) if per else ""] if fig.key == "per_req" else []),
                    ]
                rows.append(row)
    lines = ["", "## Per prompt category (Δ: against the baseline's same category)", ""]
    lines.append(output_table(headers, rows, fmt, align_right=False))
    return lines + [""] + [f"- {s}" for cc in ccs for s in cc.sentences]


def render_table(comp: Comparison, fmt: str = "github", view: TableView = WHOLE) -> str:
    """The side-by-side table; csv has the same cells, json the full data (see to_dict).

    ``view``: the columns a terminal shows (default: all, as comparison.md has them)."""
    cols = _columns(comp)
    text = render_view(
        [name for name, _ in cols],
        [key for _, key in cols],
        table_rows(comp),
        fmt,
        view,
        COMPARISON_MD,
        json_data=lambda: to_dict(comp),
    )
    table = text.split("\n\n")[0]  # (without the line naming the hidden columns)
    narrow = view.width is not None and view.keys is None and not is_document(fmt)
    if narrow and any(key == "per_req" for _, key in cols) and PER_REQ_HEADER not in table:
        # too narrow for each run's per-request tok/s beside its aggregate: a row per run instead
        cols, rows = long_table(comp)
        return render_view([n for n, _ in cols], [k for _, k in cols], rows, fmt, view, COMPARISON_MD)
    return text


# ---------------------------------------------------------------- header, text


def _run_line(r: ComparedRun, baseline: bool) -> str:
    m = r.run.info
    parts = [f"**{r.label}**" + (" (baseline)" if baseline else "")]
    if r.simulated:
        parts.append("**SIMULATED**")
    for key, value in (("host", m.host), ("backend", m.backend), ("model", m.model), ("status", m.status)):
        if value:
            parts.append(f"{key} {value}")
    server = m.server.summary()
    if server:
        parts.append(f"server: {server}")
    parts.append(f"run dir {r.run.run_dir}")
    return "- " + "; ".join(parts)


def header_lines(comp: Comparison) -> list[str]:
    title = " vs ".join(r.label for r in comp.runs)
    lines = [f"# specload comparison: {title}", ""]
    if comp.simulated:
        lines.append(
            "- **SIMULATED**: at least one run measured the built-in simulator, not an inference server"
        )
    lines += [_run_line(r, i == 0) for i, r in enumerate(comp.runs)]
    return lines


def render_text(
    comp: Comparison,
    fmt: str = "github",
    plot_name: str | None = None,
    view: TableView = WHOLE,
    pareto_name: str | None = None,
) -> str:
    """Header, table, verdict and notes as one text (markdown when fmt is github)."""
    lines = header_lines(comp) + ["", render_table(comp, fmt, view)]
    lines += ["", "## Verdict", ""] + [f"- {s}" for s in comp.sentences]
    lines += category_lines(comp, fmt)
    lines += paired_lines(comp.paired, fmt)
    if sources := source_lines(comp):  # where each run's acceptance figures came from
        lines += ["", "## Acceptance sources", ""] + [f"- {s}" for s in sources]
    if comp.slo.slo is not None:
        lines += ["", f"## Capacity under the SLO {comp.slo.slo.text}", ""]
        lines += [f"- {s}" for s in comp.slo.sentences] or [
            f"- {label}: no level with an SLO verdict"
            for label, c in comp.slo.capacities.items()
            if c is None
        ]
    if comp.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in comp.notes]
    if plot_name:
        lines += ["", f"![aggregate and per-request tok/s vs concurrency]({plot_name})"]
    if pareto_name:
        lines += ["", f"![per-user vs aggregate tok/s, one point per level]({pareto_name})"]
    return "\n".join(lines) + "\n"


def side_text(comp: Comparison) -> str:
    """What a csv/json comparison prints on stderr: its stdout holds only the data, so it parses."""
    return "\n".join(
        header_lines(comp)
        + ["", *comp.sentences, *(s for cc in comp.categories for s in cc.sentences)]
        + [sentence(pc) for pc in comp.paired]
        + [*comp.slo.sentences, *[f"- {n}" for n in comp.notes], *[f"- {s}" for s in source_lines(comp)]]
    )


# ---------------------------------------------------------------- output directory, files


def default_out_dir(comp: Comparison, now: datetime | None = None) -> Path:
    """compare-<A>-vs-<B>[-vs-...]-<UTC time>/ next to the baseline run (results/ in the usual layout)."""
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    name = "compare-" + "-vs-".join(safe_name(r.label) for r in comp.runs) + f"-{stamp}"
    return comp.baseline.run.run_dir.resolve().parent / name


class CompareError(ValueError):
    """The comparison cannot be made from what was given (the CLI exits 2 with this message)."""


@dataclass(frozen=True)
class ComparisonResult:
    """A comparison made and written: what ``specload compare`` prints and the files it wrote."""

    comparison: Comparison
    fmt: str
    text: str  # stdout: the whole text, or only the data for csv/json
    side: str | None  # stderr for csv/json: header, verdict and notes; None otherwise
    markdown: Path  # comparison.md
    plot: Path | None  # the PNG; None with no plot or without matplotlib
    pareto: Path | None = None  # pareto.png next to it (per-user vs aggregate tok/s)
    page: Path | None = None  # comparison.html (--format html), next to comparison.md

    @property
    def sentences(self) -> list[str]:
        """The verdict, one sentence per treatment."""
        return self.comparison.sentences

    @property
    def written(self) -> list[Path]:
        return [self.markdown] + [p for p in (self.plot, self.pareto, self.page) if p is not None]


def _one_slo(run_dirs: Sequence[str | Path]) -> Slo | None:
    """The SLO the runs were made with when they agree (runs without one are judged against it
    too); None when none has one. Runs with different SLOs are each judged against their own, and
    the comparison says it cannot compare their capacities."""
    texts = set()
    for d in run_dirs:
        try:
            text = sc.slo if (sc := recorded_scenario(read_run_meta(d))) else None
        except (OSError, ValueError):
            continue
        if text:
            texts.add(str(text))
    if len(texts) != 1:
        return None
    try:
        return parse_slo(texts.pop())
    except SloError:
        return None


def _load(
    run_dirs: Sequence[str | Path], slo: Slo | None = None, processes: int = 1, reread: bool = False
) -> list[Run]:
    """The runs, read one after the other (each run's columns are dropped once its figures are made)."""
    runs: list[Run] = []
    try:  # other tools' results (specload.analysis.foreign), read as they are
        foreign: dict[int, ForeignRun | None] = {i: load_foreign(d) for i, d in enumerate(run_dirs)}
    except (ForeignError, ValueError) as e:
        raise CompareError(str(e)) from None
    for i, d in enumerate(run_dirs):
        if not Path(d).is_dir() and foreign[i] is None:
            raise CompareError(
                f"{d}: not a directory (expected a specload run directory or another tool's result)"
            )
    chosen = slo if slo is not None else _one_slo(run_dirs)
    for i, d in enumerate(run_dirs):
        if (f := foreign[i]) is not None:
            runs.append(f)
            continue
        try:
            runs.append(load_run(d, chosen if chosen is not None else RUN_SLO, processes, reread))
        except NotARunDir as e:
            raise CompareError(str(e)) from None
    return runs


def load_runs(run_dirs: Sequence[str | Path], slo: Slo | None = None) -> list[Run]:
    """The runs as ``specload compare`` reads them (one SLO for all where they agree, other tools'
    results too): what the web UI's comparison reads, so that it is the command's."""
    return _load(run_dirs, slo)


def _plot_ref(plot_path: Path, out: Path) -> str:
    """The plot as comparison.md links it: relative when it lies inside ``out``."""
    try:
        return str(plot_path.resolve().relative_to(out.resolve()))
    except ValueError:
        return str(plot_path.resolve())


def run_compare(
    run_dirs: Sequence[str | Path],
    *,
    out: str | Path | None = None,
    fmt: str = "github",
    plot: bool = True,
    plot_path: str | Path | None = None,
    view: TableView = WHOLE,
    slo: str | Slo | None = None,
    processes: int = 1,
    reread: bool = False,
) -> ComparisonResult:
    """Compare run directories (the first is the baseline): write comparison.md and the plot.

    ``out``: directory for comparison.md (default: compare-<A>-vs-<B>-<UTC time>/ next to the
    baseline); ``plot_path``: where the PNG goes (default: OUT/comparison.png; the Pareto picture,
    pareto.png, goes next to it); ``view``: the table's columns in ``text`` (comparison.md has them
    all); ``slo``: judge every run against it (default: the runs' own, when they agree);
    ``processes``, ``reread``: see ``load_run`` (the runs are read one after the other). Prints nothing but
    matplotlib's absence; the caller prints ``text`` (see print_result). Raises CompareError.
    """
    if len(run_dirs) < 2:
        raise CompareError("give at least two run directories (the first is the baseline)")
    if not is_known_format(fmt):
        raise CompareError(f"unknown format {fmt!r}")
    try:
        chosen = parse_slo(slo) if isinstance(slo, str) else slo
    except SloError as e:
        raise CompareError(f"--slo: {e}") from None
    try:
        comp = build_comparison(_load(run_dirs, chosen, processes, reread))
    except ValueError as e:  # runs that cannot stand side by side (rate levels with concurrency levels)
        raise CompareError(str(e)) from None
    out_dir = Path(out) if out else default_out_dir(comp)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CompareError(f"cannot create {out_dir}: {e}") from None
    return write_comparison(comp, out_dir, fmt, view, plot, plot_path)


def write_comparison(
    comp: Comparison,
    out_dir: Path,
    fmt: str = "github",
    view: TableView = WHOLE,
    plot: bool = True,
    plot_path: str | Path | None = None,
) -> ComparisonResult:
    """comparison.md (+ comparison.png, pareto.png next to it; + comparison.html when ``fmt`` is html)
    in ``out_dir``, and the text to print laid out for ``fmt``."""
    png = pareto = None
    if plot:
        png = plot_comparison(comp, Path(plot_path) if plot_path else out_dir / COMPARISON_PNG)
        pareto = (
            plot_pareto(comp, (Path(plot_path).parent if plot_path else out_dir) / PARETO_PNG)
            if png
            else None
        )
    md = out_dir / COMPARISON_MD
    md.write_text(
        render_text(
            comp,
            "github",
            None if png is None else _plot_ref(png, out_dir),
            pareto_name=None if pareto is None else _plot_ref(pareto, out_dir),
        )
    )
    page = None
    if is_page(fmt):  # the page file, then the usual text on the terminal
        from specload.present.htmlpage import COMPARISON_HTML, write_compare_page

        page = write_compare_page(comp, render_text(comp, "github"), out_dir / COMPARISON_HTML)
        fmt = "github"
    if is_document(fmt):
        return ComparisonResult(comp, fmt, render_table(comp, fmt), side_text(comp), md, png, pareto)
    return ComparisonResult(comp, fmt, render_text(comp, fmt, view=view), None, md, png, pareto, page)


def print_result(result: ComparisonResult, out: TextIO | None = None, err: TextIO | None = None) -> None:
    """Print a comparison as ``specload compare`` does: the text, then which files were written."""
    out = out or sys.stdout
    err = err or sys.stderr
    text = result.text
    if result.fmt == "github" and is_terminal(out):  # every table and line fitted to its width
        text = fit_text(text, terminal_width(), COMPARISON_MD)
    out.write(for_stream(text, out))
    if result.side is not None:
        print(result.side, file=err)
    for path in result.written:
        print(f"wrote {path}", file=err)


# ---------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specload compare",
        description="Side-by-side table of two or more run directories; the first one is the baseline.",
    )
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_DIR",
        help="results/<label>-<timestamp>/ directories, or other tools' results: vllm bench serve JSON, "
        "SGLang bench_serving JSONL, GuideLLM JSON, a genai-bench experiment folder (docs/metrics.md)",
    )
    p.add_argument("--format", default="github", help=format_help())
    g = p.add_mutually_exclusive_group()
    g.add_argument("--plot", metavar="PATH", help=f"write the plot here (default: OUT/{COMPARISON_PNG})")
    g.add_argument("--no-plot", action="store_true", help="do not draw the plot")
    p.add_argument(
        "--out",
        metavar="DIR",
        help=f"directory for {COMPARISON_MD} (default: compare-<A>-vs-<B>-<UTC time>/ "
        "next to the baseline run)",
    )
    p.add_argument("--columns", default=None, metavar="SETS", help=columns_help())
    p.add_argument(
        "--slo",
        default=None,
        help="judge every run against this SLO (e.g. ttft_p99=2s,tpot_p50=50ms) "
        "and compare their capacities (default: the SLO the runs were made with, when they agree)",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=default_processes(),
        metavar="N",
        help="processes reading each run (1 or 2; default: 2 on a machine with 2 cores or more)",
    )
    p.add_argument("--reread", action="store_true", help=REREAD_HELP)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Print the comparison and write comparison.md (+ plot); csv/json print only the data."""
    args = _parser().parse_args(argv)
    try:
        view = view_for(args.columns)
    except ValueError as e:
        print(f"specload compare: {e}", file=sys.stderr)
        return 2
    try:
        result = run_compare(
            args.runs,
            out=args.out,
            fmt=args.format,
            plot=not args.no_plot,
            plot_path=args.plot,
            view=view,
            slo=args.slo,
            processes=args.processes,
            reread=args.reread,
        )
    except CompareError as e:
        print(f"specload compare: {e}", file=sys.stderr)
        return 2
    print_result(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
