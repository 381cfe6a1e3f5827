"""docs/guide.md's "Which chart is where" table, checked: every chart it says an output has, that
output has (the HTML report and comparison, the page's report and comparison, report --plot's PNG,
the live page's script; tests/test_webui_browser.py finds the live charts drawn in Chromium)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specload.analysis.run import load_run
from specload.core import histogram
from specload.present.htmlpage import report_charts
from specload.present.liverow import live_charts
from specload.present.webview import compare_bundle, report_bundle
from tests.conftest import REPO
from tests.fixtures.make_compare_runs import write_reference_pair

GUIDE = REPO / "docs" / "guide.md"
APP_JS = REPO / "specload" / "locust" / "webpage" / "app.js"
# each chart's figure id on the live page (app.js: levelCharts("chart", ...), serverCharts, renderCharts)
LIVE_IDS = {
    "agg_tok_s": "-agg",
    "per_req_tok_s": "-perreq",
    "ttft": "-ttft",
    "tpot": "-tpot",
    "itl": "-itl",
    "e2e": "-e2e",
    "pareto": "-pareto",
    "errors": "-errors",
    "accept": "-accept",
    "server": "chart-server",
    "accept_over_time": "chart-accept-time",
    "tok_s_over_time": "chart-series",
}


def claims() -> dict[str, dict[str, str]]:
    """key -> {column: cell} of the guide's table."""
    text = GUIDE.read_text()
    block = text.split("### Which chart is where", 1)[1]
    lines = block.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    out = {}
    for line in rows[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        key = re.search(r"\(`([a-z0-9_]+)`\)", cells[0])
        assert key, line
        out[key.group(1)] = dict(zip(head[1:], cells[1:], strict=True))
    return out


def _with_counters(run_dir: Path) -> None:
    """SGLang's verify-step and output-token counters in every server sample (2.5 tokens a step)."""
    path = run_dir / "server_samples.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    t0 = lines[0]["t"]
    for d in lines:
        d["generation_tokens"] = 100.0 * (d["t"] - t0)
        d["spec_verify_calls"] = 40.0 * (d["t"] - t0)
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))


def _with_itl(run_dir: Path) -> None:
    """Every record's gaps: 10 ms each (the reference pair's records carry none)."""
    path = run_dir / "records.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for d in recs:
        d["itl"], d["itl_unit"] = [[histogram.bin_of(0.010), d["output_tokens"] - 1]], "token"
    path.write_text("".join(json.dumps(d) + "\n" for d in recs))


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base, mtp = write_reference_pair(tmp_path_factory.mktemp("places"))
    _with_counters(mtp)
    for d in (base, mtp):
        _with_itl(d)
    return base, mtp


def test_the_table_names_every_chart_of_the_html_report(pair: tuple[Path, Path]) -> None:
    _, mtp = pair
    assert set(claims()) == {c.key for c in report_charts(load_run(mtp))}


def test_the_html_and_the_page_have_every_chart_they_claim(pair: tuple[Path, Path]) -> None:
    base, mtp = pair
    report = report_bundle(mtp)
    compare = compare_bundle([base, mtp], plot=False)
    html_report = set(re.findall(r'data-chart="([^"]+)"', report["html"]))
    html_compare = set(re.findall(r'data-chart="([^"]+)"', compare["html"]))
    for key, cells in claims().items():
        for column, page_report, page_compare in (
            ("HTML", html_report, html_compare),
            ("Page", set(report["charts"]), set(compare["charts"])),
        ):
            if cells[column] == "yes":
                assert key in page_report and key in page_compare, (column, key)
            elif cells[column] == "report":
                assert key in page_report, (column, key)
            # the page's own figures are the HTML's, with ids of their own
        assert f'id="run-chart-{key}"' in report["charts_html"] or cells["Page"] not in ("yes", "report")


def test_the_png_has_every_chart_it_claims(pair: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from specload.present.chartpng import plot_charts

    _, mtp = pair
    drawn = plot_charts(report_charts(load_run(mtp)), tmp_path / "charts.png")
    assert drawn is not None and (tmp_path / "charts.png").stat().st_size > 10_000
    for key, cells in claims().items():
        if cells["PNG"] == "yes":
            assert key in drawn, key


def test_the_live_page_draws_every_chart_it_claims() -> None:
    """The figure table's charts reach the page in the live payload (liverow.live_charts), drawn by
    one loop of app.js under their page ids; the others are app.js's own."""
    js = APP_JS.read_text()
    sent = {c["key"]: c["id"] for c in live_charts()}
    assert "`${prefix}-${c.id}`" in js and "d.charts" in js
    for key, cells in claims().items():
        if cells["Live"].startswith("yes"):
            ident = LIVE_IDS[key]
            if key in sent:
                assert "-" + sent[key] == ident, key
            else:
                assert (f"`${{prefix}}{ident}`" in js) if ident.startswith("-") else (f'"{ident}"' in js), key


def test_acceptance_over_time_is_the_counters_length_per_interval(pair: tuple[Path, Path]) -> None:
    _, mtp = pair
    (chart,) = [c for c in report_charts(load_run(mtp)) if c.key == "accept_over_time"]
    ys = [y for s in chart.series for y in s.ys if y is not None]
    assert ys and all(y == pytest.approx(2.5) for y in ys)
