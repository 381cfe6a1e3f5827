"""``--format html``: one self-contained file per report and comparison, with every section and chart.

The fast tests read the file as text; the browser test (make test-slow) opens both files in
headless Chromium with the network switched off and finds every section and every chart drawn.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from specload.cli import main
from specload.present import svg
from specload.present.htmlpage import markdown_html
from tests.fixtures.make_compare_runs import LEVELS, MTP_AGG, write_reference_pair

SAMPLE_RUN = Path(__file__).parent / "fixtures" / "sample_run"
LEVEL_CHARTS = {"agg_tok_s", "per_req_tok_s", "ttft", "tpot", "itl", "e2e", "pareto", "errors"}


def _sections(markdown: str) -> list[str]:
    return [line[3:].strip() for line in markdown.splitlines() if line.startswith("## ")]


def _charts(html: str) -> set[str]:
    return set(re.findall(r'data-chart="([^"]+)"', html))


def make_report(tmp_path: Path) -> tuple[Path, Path]:
    _base, mtp = write_reference_pair(tmp_path / "runs")
    assert main(["report", str(mtp), "--format", "html"]) == 0
    return mtp / "report.html", mtp / "report.md"


def make_comparison(tmp_path: Path) -> tuple[Path, Path]:
    base, mtp = write_reference_pair(tmp_path / "pair")
    out = tmp_path / "cmp"
    assert main(["compare", str(base), str(mtp), "--format", "html", "--out", str(out), "--no-plot"]) == 0
    return out / "comparison.html", out / "comparison.md"


def test_report_html_has_every_section_and_chart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page, md = make_report(tmp_path)
    text = page.read_text()
    captured = capsys.readouterr()
    assert f"wrote {page}" in captured.err and "| C " in captured.out  # the terminal still gets the table
    for title in _sections(md.read_text()):
        assert f"<h2>{markdown_html('## ' + title).split('<h2>')[1].split('</h2>')[0]}</h2>" in text, title
    assert _charts(text) == LEVEL_CHARTS | {"accept", "server", "tok_s_over_time"}
    # every level's aggregate tok/s is a point of the first chart, on the right scale
    agg = text.split('data-chart="agg_tok_s"')[1].split("</svg>")[0]
    assert agg.count("<circle") == len(LEVELS)
    assert f">{MTP_AGG[128]:.1f}<" in text  # and the table cell
    _self_contained(text)


def test_comparison_html_has_the_verdict_capacity_and_charts(tmp_path: Path) -> None:
    page, md = make_comparison(tmp_path)
    text = page.read_text()
    sections = _sections(md.read_text())
    assert "Verdict" in sections
    for title in sections:
        assert re.search(rf'<section id="[^"]+"><h2>{re.escape(title)}</h2>', text), title
    assert _charts(text) >= LEVEL_CHARTS | {"accept", "server"}
    assert "sign change C≈" in text  # the (single-run) crossover drawn on the aggregate chart
    agg = text.split('data-chart="agg_tok_s"')[1].split("</svg>")[0]
    assert 'data-name="baseline"' in agg and 'data-name="mtp"' in agg
    _self_contained(text)


def test_comparison_html_carries_the_capacity_section(tmp_path: Path) -> None:
    base, mtp = write_reference_pair(tmp_path / "pair")
    out = tmp_path / "cmp"
    args = ["compare", str(base), str(mtp), "--format", "html", "--out", str(out), "--no-plot"]
    assert main([*args, "--slo", "tpot_p50=20ms"]) == 0
    text = (out / "comparison.html").read_text()
    assert "<h2>Capacity under the SLO tpot_p50=20ms</h2>" in text
    assert "meets the SLO" in text.replace('<span class="met">meets</span>', "meets")


def _self_contained(text: str) -> None:
    assert "<script" not in text
    assert not re.search(r'(src|href)="(?!#)', text), "a file beside it or a URL"
    assert "@import" not in text and "url(" not in text


def test_markdown_subset() -> None:
    html = markdown_html(
        "# T\n\n- **SIMULATED** a `x<y`\n- b\n\n## S one\n\n| C | v |\n|---|---|\n| 1 | 2 |\n\ntext\n![p](p.png)\n"
    )
    assert "<h1>T</h1>" in html
    assert '<li class="simulated"><strong>SIMULATED</strong> a <code>x&lt;y</code></li>' in html
    assert '<section id="s-one"><h2>S one</h2>' in html
    assert "<tr><th>C</th><th>v</th></tr><tr><td>1</td><td>2</td></tr>" in html
    assert "<p>text</p>" in html and "p.png" not in html


def test_svg_chart_draws_its_points_and_gaps() -> None:
    chart = svg.Chart(
        "k",
        "T <&>",
        "C",
        "tok/s",
        [
            svg.Series("a", [1, 2, 4, 8], [10.0, None, 30.0, 40.0]),
            svg.Series("b", [1, 8], [5.0, 50.0], dashed=True),
        ],
        log2_x=True,
        marks=[svg.Mark(3.0, "x")],
    )
    out = svg.render(chart)
    assert out.startswith("<svg") and out.endswith("</svg>")
    assert "T &lt;&amp;&gt;" in out
    assert out.count("<circle") == 5  # the None is a gap, not a point
    assert out.count("<polyline") == 2  # a's points after the gap, and b ("a" before the gap is one point)
    assert 'class="mark"' in out and "stroke-dasharray" in out
    empty = svg.render(svg.Chart("e", "E", "x", "y", [svg.Series("a", [1], [None])]))
    assert "no values to draw" in empty


@pytest.mark.parametrize(("lo", "hi"), [(0, 1), (0, 2984.8), (3.7, 21.8), (0, 0)])
def test_ticks_cover_the_range(lo: float, hi: float) -> None:
    ticks = svg.nice_ticks(lo, hi)
    assert ticks[0] <= lo and ticks[-1] >= hi and len(ticks) <= 8


@pytest.mark.slow
def test_html_report_and_comparison_open_offline_in_chromium(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    from tests.test_webui_browser import _chromium

    report, report_md = make_report(tmp_path)
    comparison, comparison_md = make_comparison(tmp_path)
    with sync_api.sync_playwright() as pw:
        path = _chromium(pw)
        if path is None:
            pytest.skip("no Chromium (Debian: apt-get install chromium, or set SPECLOAD_CHROMIUM)")
        browser = pw.chromium.launch(executable_path=path)
        try:
            context = browser.new_context(offline=True)
            asked: list[str] = []
            context.on("request", lambda r: asked.append(r.url))
            page = context.new_page()
            for file, md, extra in (
                (report, report_md, {"tok_s_over_time"}),
                (comparison, comparison_md, set()),
            ):
                asked.clear()
                page.goto(file.as_uri())
                headings = page.locator("h2").all_inner_texts()
                for title in _sections(md.read_text()):
                    assert title in headings, (file.name, title, headings)
                assert "Charts" in headings
                keys = set(page.eval_on_selector_all("svg.chart", "els => els.map(e => e.dataset.chart)"))
                assert keys >= LEVEL_CHARTS | extra, keys
                drawn: Any = page.eval_on_selector_all(
                    "svg.chart",
                    "els => els.map(e => [e.dataset.chart, e.getBoundingClientRect().width, e.querySelectorAll('circle').length])",
                )
                for key, width, points in drawn:
                    # the fixture's records carry no ITL histograms: that chart says it has nothing to draw
                    assert width > 300 and (points > 0 or key == "itl"), (file.name, key, width, points)
                assert "no values to draw" in (page.locator('svg[data-chart="itl"]').text_content() or "")
                assert asked == [file.as_uri()], asked  # nothing fetched but the file itself
                page.screenshot(path=str(tmp_path / f"{file.stem}.png"), full_page=True)
        finally:
            browser.close()


def test_sample_run_report_html(tmp_path: Path) -> None:
    run = shutil.copytree(SAMPLE_RUN, tmp_path / "run")
    assert main(["report", str(run), "--format", "html", "--no-write"]) == 0
    text = (run / "report.html").read_text()
    assert _charts(text) >= LEVEL_CHARTS and "tok_s_over_time" in _charts(text)


def test_the_web_ui_offers_the_same_files(tmp_path: Path) -> None:
    """The web UI's report.html / compare.html downloads are these pages (specload.present.webview's bundles)."""
    from specload.present.webview import compare_bundle, report_bundle

    base, mtp = write_reference_pair(tmp_path / "runs")
    report = report_bundle(mtp)["html"]
    assert _charts(report) == LEVEL_CHARTS | {"accept", "server", "tok_s_over_time"}
    assert "<h2>Notes</h2>" in report
    comparison = compare_bundle([base, mtp], plot=False)["html"]
    assert "<h2>Verdict</h2>" in comparison and _charts(comparison) >= LEVEL_CHARTS
    _self_contained(report)
    _self_contained(comparison)


def test_a_stopped_level_is_drawn_as_such() -> None:
    from specload.analysis.metrics import LevelStats
    from specload.present.charts import RunLines, level_charts

    levels = [
        LevelStats(concurrency=1, repeat=0, label="c001", status="completed", agg_tok_s=100.0),
        LevelStats(concurrency=4, repeat=0, label="c004", status="incomplete", agg_tok_s=300.0),
    ]
    (agg,) = [c for c in level_charts([RunLines("r", levels)]) if c.key == "agg_tok_s"]
    assert list(agg.series[0].labels) == ["", "stopped"]
    assert ">stopped</text>" in svg.render(agg)
