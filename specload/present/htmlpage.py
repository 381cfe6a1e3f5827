"""``--format html``: a report or a comparison as one self-contained HTML file.

A file to attach to a ticket or open on an offline machine: no script, no stylesheet or image
beside it, every chart inline SVG (specload.present.svg). The words and tables are those of
report.md and comparison.md, the same text turned into HTML here (only the markdown that
specload itself writes: headings, lists, pipe tables, bold and code spans), so the page has
every section the markdown has, the verdict and the capacity sentence included, and no figure
that the text does not have. The charts follow (specload.present.charts).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from html import escape
from pathlib import Path

from specload import __version__
from specload.analysis.comparison import CONCURRENCY, Axis, Comparison, Crossover
from specload.analysis.run import Run
from specload.analysis.tracereplay import run_trace_replay
from specload.present import charts as chartlist
from specload.present import svg
from specload.present.traceview import trace_charts
from specload.workload.recorded import recorded_scenario

REPORT_HTML = "report.html"
COMPARISON_HTML = "comparison.html"

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1200px;
padding:0 1em;color:#222;line-height:1.4}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0;display:block;overflow-x:auto}
th,td{border:1px solid #ccc;padding:.2em .5em;text-align:right;white-space:nowrap}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
code{background:#f3f3f3;padding:0 .2em}
.charts{display:flex;flex-wrap:wrap;gap:1em}.charts figure{margin:0}
figcaption{font-size:.8em;color:#555;max-width:560px}
.met{color:#11772b;font-weight:bold}.missed{color:#b00020;font-weight:bold}.flagged{color:#9a6700;font-weight:bold}
.simulated{background:#fff3cd;padding:.3em .6em}
.workload{font-size:.9em;color:#333}
@page{size:A4 landscape;margin:8mm}
@media print{
body{max-width:none;margin:0;padding:0;font-size:9pt}
table{display:table;overflow:visible;width:100%;table-layout:auto;font-size:6pt}
th,td{white-space:normal;padding:.1em .15em}th{overflow-wrap:anywhere}
td:first-child,th:first-child{white-space:nowrap}
h2{break-after:avoid}.charts figure,tr{break-inside:avoid}
svg{max-width:100%;height:auto}
}
"""

_VERDICT = re.compile(r"\b(met|missed|meets|flagged)\b")


def _inline(text: str) -> str:
    """One line of specload's markdown as HTML: escaped, then **bold** and `code`."""
    out = escape(text, quote=False)
    out = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return out


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _table(lines: Sequence[str]) -> str:
    head = _cells(lines[0])
    body = (
        [_cells(line) for line in lines[2:]]
        if len(lines) > 1 and set(lines[1]) <= set("|-: ")
        else [_cells(line) for line in lines[1:]]
    )
    rows = ["<tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr>"]
    rows += ["<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body]
    return "<table>" + "".join(rows) + "</table>"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def markdown_html(text: str) -> str:
    """specload's markdown (report.md, comparison.md) as HTML; images are left out (the page draws
    its charts itself). Each ``##`` section is a ``<section id=...>``."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    in_list = False
    in_section = False
    while i < len(lines):
        line = lines[i]
        if not line.startswith("- ") and in_list:
            out.append("</ul>")
            in_list = False
        if line.startswith("|"):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            out.append(_table(lines[i:j]))
            i = j
            continue
        if line.startswith("## "):
            if in_section:
                out.append("</section>")
            title = line[3:].strip()
            out.append(f'<section id="{_slug(title)}"><h2>{_inline(title)}</h2>')
            in_section = True
        elif line.startswith("# "):
            out.append(f"<h1>{_inline(line[2:].strip())}</h1>")
        elif line.startswith("- "):
            if not in_list:
                out.append("<ul>")
                in_list = True
            item = _inline(line[2:])
            cls = ' class="simulated"' if "SIMULATED" in line else ""
            out.append(f"<li{cls}>{item}</li>")
        elif line.startswith("!["):
            pass
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    if in_list:
        out.append("</ul>")
    if in_section:
        out.append("</section>")
    return "\n".join(out)


def _mark_verdicts(html: str) -> str:
    """The verdict words in colour, in the text between tags only."""
    parts = re.split(r"(<[^>]+>)", html)
    for k, part in enumerate(parts):
        if part and not part.startswith("<"):
            parts[k] = _VERDICT.sub(
                lambda m: (
                    f'<span class="{"met" if m.group(1) in ("met", "meets") else m.group(1)}">{m.group(1)}</span>'
                ),
                part,
            )
    return "".join(parts)


def figures_html(list_: Sequence[svg.Chart], prefix: str = "") -> str:
    """The charts as one section of figures; the web UI's page shows the same (specload.present.webview),
    its ids under ``prefix`` (its live charts have ids of their own)."""
    out = [f'<section id="{prefix}charts"><h2>Charts</h2><div class="charts">']
    for c in list_:
        note = f"<figcaption>{escape(c.note)}</figcaption>" if c.note else ""
        out.append(f'<figure id="{prefix}chart-{c.key}">{svg.render(c)}{note}</figure>')
    out.append("</div></section>")
    return "\n".join(out)


def workload_line(run: Run) -> str:
    """What a run sent and which specload measured it: 'mtp: 1000 input and 128 output tokens per
    request, 4-128 requests per level, specload 0.1.0' (run.json; report.md's header has no token counts)."""
    m = run.info
    sc = recorded_scenario(m)
    parts = []
    if sc is not None:
        if sc.dataset and sc.dataset_lengths != "fixed":
            parts.append(f"prompts and output lengths from the dataset {sc.dataset}")
        else:
            parts.append(f"{sc.input_tokens} input and {sc.output_tokens} output tokens per request")
    budgets = sorted({lv.budget for lv in m.levels if lv.budget is not None})
    if budgets:
        shown = str(budgets[0]) if len(budgets) == 1 else f"{budgets[0]}-{budgets[-1]}"
        parts.append(f"{shown} measured requests per level")
    parts.append(f"specload {m.specload_version or 'version not recorded'}")
    return f"{run.label}: {', '.join(parts)}"


def _workload_html(runs: Sequence[Run]) -> str:
    items = "".join(f"<li>{escape(workload_line(r))}</li>" for r in runs)
    return f'<section id="workload" class="workload"><ul>{items}</ul></section>'


def page(title: str, body_markdown: str, figures: Sequence[svg.Chart], runs: Sequence[Run] = ()) -> str:
    """The whole file: the markdown's sections (after its title, each run's workload and specload
    version), then the charts."""
    body = _mark_verdicts(markdown_html(body_markdown))
    if runs:
        about = _workload_html(runs)
        body = body.replace("</h1>", "</h1>" + about, 1) if "</h1>" in body else about + body
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head>\n<body>\n"
        f"{body}\n{figures_html(figures)}\n"
        f"<footer><p><small>written by specload {escape(__version__)}; every figure is defined in "
        "docs/metrics.md</small></p></footer>\n"
        "</body></html>\n"
    )


def run_lines(run: Run) -> chartlist.RunLines:
    """A run's lines on the charts, with its cap (Run.cap: declared, else inferred from the gauges)."""
    cap = run.cap
    return chartlist.RunLines(run.label, run.levels, run.samples, cap.value if cap is not None else None)


def report_page(run: Run, markdown: str) -> str:
    """The HTML report of ``run``; ``markdown``: its report.md text."""
    return page(f"specload report: {run.label}", markdown, report_charts(run), [run])


def crossover_label(label: str, x: Crossover, axis: Axis = CONCURRENCY) -> str:
    """A crossover's mark in the verdict's words (about C=32 inside the noise; between single runs a
    sign change, which the verdict does not call a crossover either)."""
    word = "sign change" if x.single_runs else "crossover"
    if x.inside_noise:
        return f"{label} {word} about {axis.at(x.at if axis.rate else round(x.at))} (inside the noise)"
    return f"{label} {word} {axis.near(x.at)}"


def _crossover_marks(comp: Comparison) -> dict[str, list[svg.Mark]]:
    """Each figure's crossovers (Crossovers has a field per figure key: agg, per_req), to be drawn on
    that figure's chart alone, in the verdict's words (near C≈44)."""
    marks: dict[str, list[svg.Mark]] = {}
    for key in ("agg", "per_req"):
        for label, xs in comp.crossovers.items():
            for x in getattr(xs, key):
                marks.setdefault(key, []).append(svg.Mark(x.at, crossover_label(label, x, comp.axis)))
    return marks


def report_charts(run: Run) -> list[svg.Chart]:
    """The charts of a report: the HTML's and the page's."""
    return chartlist.level_charts([run_lines(run)]) + trace_charts(run_trace_replay(run))


def compare_charts(comp: Comparison) -> list[svg.Chart]:
    """The charts of a comparison, one line per run: the HTML's and the page's."""
    lines = [replace(run_lines(r.run), label=r.label) for r in comp.runs]  # (a run's label in the comparison)
    return chartlist.level_charts(lines, _crossover_marks(comp))


def compare_page(comp: Comparison, markdown: str) -> str:
    """The HTML comparison; ``markdown``: its comparison.md text."""
    title = "specload comparison: " + " vs ".join(r.label for r in comp.runs)
    return page(title, markdown, compare_charts(comp), [r.run for r in comp.runs])


def write_report_page(run: Run, markdown: str, path: str | Path | None = None) -> Path:
    target = Path(path) if path else run.run_dir / REPORT_HTML
    target.write_text(report_page(run, markdown), encoding="utf-8")
    return target


def write_compare_page(comp: Comparison, markdown: str, path: str | Path) -> Path:
    target = Path(path)
    target.write_text(compare_page(comp, markdown), encoding="utf-8")
    return target
