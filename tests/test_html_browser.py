"""The findings of review 3a7af2e's webui.md in headless Chromium: the HTML comparison and report printed
(A4, as "save as PDF" does) keep every table column (N3); the charts give each run one colour and each
figure its own crossover (N1, N2); the live page's tick labels keep their digits (F9) and its levels
table keeps the verdict columns in view at 1400 px (N4).

The HTML files are made by ``specload compare``/``report --format html``; the live page is specload's own
(specload/locust/webpage) served from its files, with a /specload/live payload made by the same code the
web UI uses for a level's row (present.liverow), so that no sweep has to run. Needs Playwright and a
Chromium (skipped without, as tests/test_webui_browser.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specload.analysis.run import load_run
from specload.cli import main as cli_main
from specload.core.slo import parse_slo
from specload.present.acceptview import live_figures
from specload.present.liverow import live_charts, live_columns, live_row
from specload.present.svg import colour_of
from tests.fixtures.make_compare_runs import write_reference_pair, write_run

pytestmark = pytest.mark.slow

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="Playwright is not installed: pip install 'specload[browser]'"
)

WEBPAGE = Path(__file__).resolve().parent.parent / "specload" / "locust" / "webpage"
A4_LANDSCAPE = {"width": 1123, "height": 794}  # CSS px at 96 dpi, as Chromium lays out a printed page


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from tests.test_webui_browser import _chromium

    with sync_api.sync_playwright() as pw:
        path = _chromium(pw)
        if path is None:
            pytest.skip("no Chromium: install Debian's chromium (or set SPECLOAD_CHROMIUM)")
        b = pw.chromium.launch(executable_path=path)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("html-browser")
    base, mtp = write_reference_pair(root / "pair")
    third = write_run(root / "pair" / "k3", "mtp3", {1: 300.0, 4: 900.0}, {1: 300.0, 4: 240.0}, cap=48)
    out = root / "cmp"
    args = ["compare", str(base), str(mtp), str(third), "--format", "html", "--out", str(out), "--no-plot"]
    assert cli_main([*args, "--slo", "ttft_p99=100s"]) == 0
    assert cli_main(["report", str(mtp), "--format", "html", "--no-write"]) == 0
    return {"comparison": out / "comparison.html", "report": mtp / "report.html", "mtp": mtp}


def _printed(browser: Any, page_file: Path) -> Any:
    page = browser.new_page(viewport=A4_LANDSCAPE)
    page.emulate_media(media="print")
    page.goto(page_file.as_uri())
    return page


@pytest.mark.parametrize("which", ["comparison", "report"])
def test_printed_tables_keep_every_column(browser: Any, files: dict[str, Path], which: str) -> None:
    page = _printed(browser, files[which])
    try:
        tables = page.eval_on_selector_all(
            "table",
            """ts => ts.map(t => {
                const ths = [...t.querySelectorAll('th')];
                const last = ths[ths.length - 1].getBoundingClientRect();
                return {cols: ths.length, scroll: t.scrollWidth, client: t.clientWidth,
                        right: t.getBoundingClientRect().right, lastRight: last.right,
                        lastText: ths[ths.length - 1].textContent};
            })""",
        )
        width = page.evaluate("document.documentElement.clientWidth")
        assert tables
        for t in tables:
            # nothing scrolled away (a printed page cannot scroll), the last column inside the page
            assert t["scroll"] <= t["client"] + 1, t
            assert t["right"] <= width + 1 and t["lastRight"] <= width + 1, (t, width)
        widest = max(tables, key=lambda t: t["cols"])
        assert widest["cols"] >= (30 if which == "comparison" else 20), widest
        pdf = page.pdf(format="A4", landscape=True)
        assert pdf[:5] == b"%PDF-" and len(pdf) > 10_000
    finally:
        page.close()


def test_each_run_has_one_colour_and_each_figure_its_own_crossover(
    browser: Any, files: dict[str, Path]
) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(files["comparison"].as_uri())
        seen = page.eval_on_selector_all(
            "svg.chart g.series",
            """gs => gs.filter(g => g.querySelector('circle')).map(g => ({chart: g.closest('svg').dataset.chart,
                 name: g.dataset.name, stroke: getComputedStyle(g.querySelector('circle')).fill}))""",
        )
        expected = {"baseline": colour_of(0), "mtp": colour_of(1), "mtp3": colour_of(2)}

        def rgb(hex_colour: str) -> str:
            r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
            return f"rgb({r}, {g}, {b})"

        charts = set()
        for s in seen:
            run = s["name"].split(" ")[0]
            assert s["stroke"] == rgb(expected[run]), s
            charts.add(s["chart"])
        assert {"agg_tok_s", "per_req_tok_s", "ttft", "tpot", "e2e", "pareto", "server"} <= charts
        marks = {
            key: page.eval_on_selector_all(
                f'svg[data-chart="{key}"] line.mark + text', "ts => ts.map(t => t.textContent)"
            )
            for key in ("agg_tok_s", "per_req_tok_s")
        }
        assert any(t.startswith("mtp sign change C≈") for t in marks["agg_tok_s"]), marks  # single runs
        assert marks["per_req_tok_s"] == ["mtp: cap 48"], marks  # the cap, and no crossover of its own
    finally:
        page.close()


def _functions(names: list[str]) -> str:
    """app.js's own functions, as the page runs them (without the page's wiring)."""
    js = (WEBPAGE / "app.js").read_text()
    out = re.findall(r"^const COLORS = .*;$", js, re.M)
    for name in names:
        m = re.search(rf"^function {name}\(.*?^\}}$", js, re.S | re.M)
        assert m, name
        out.append(m.group(0))
    return "\n".join(out)


def test_live_tick_labels_keep_their_digits(browser: Any) -> None:
    page = browser.new_page()
    try:
        page.set_content("<html><body></body></html>")
        page.add_script_tag(content=_functions(["esc", "num", "niceTicks", "tickText", "chart"]))
        assert page.evaluate("[12.5, 7.5, 88.3, 0.25, 1500, 12500, 2500000].map(tickText)") == [
            "12.5",
            "7.5",
            "88.3",
            "0.25",
            "1500",
            "12.5k",
            "2.5M",
        ]
        # a TPOT chart whose p99 is 11.5 ms: its axis ends at 12.5 and says so (review: "13")
        svg = page.evaluate(
            "chart('c', 't', [{name: 'p99', points: [[1, 3], [4, 11.5]]}], {xlabel: 'C', ylabel: 'ms', xlog: true})"
        )
        labels = re.findall(r'text-anchor="end">([^<]+)<', svg)
        assert labels[-1] == "12.5" and "13" not in labels, labels
        # a Pareto x axis over 88.3..88.8 tok/s: distinct labels, not "88 88 89 89"
        svg = page.evaluate(
            "chart('p', 't', [{name: '', points: [[88.3, 100], [88.8, 200]]}], {xlabel: 'x', ylabel: 'y'})"
        )
        xs = re.findall(r'text-anchor="middle">([0-9.]+)<', svg)
        assert len(xs) >= 3 and len(set(xs)) == len(xs), xs
    finally:
        page.close()


def _live_payload(run_dir: Path) -> dict[str, Any]:
    """/specload/live after a finished run judged against an SLO, as webui.live_payload builds it."""
    run = load_run(run_dir, parse_slo("ttft_p99=100s,tpot_p50=1s"))
    rows = []
    for i, s in enumerate(run.levels):
        rows.append(
            {
                **live_row(s),
                "index": i,
                "label": s.label,
                "concurrency": s.concurrency,
                "rate": None,
                "repeat": 0,
                "status": "completed",
                "phase": "completed",
                "done": s.sent,
                "budget": s.sent,
                "granted": s.sent,
                "in_flight": 0,
                "ok": s.ok,
                "failed": s.failed,
                "short": s.short,
                "tokens": s.output_tokens,
                "live_tok_s": None,
                "client": "ok",
                "client_flag": None,
                "final": True,
                "reasons": [],
                **live_figures(s),
            }
        )
    return {
        "state": "stopped",
        "locust_state": "stopped",
        "active": False,
        "failure": None,
        "mode": "local",
        "workers": None,
        "start_blocked": None,
        "run": {
            "run_dir": "results/mtp-1",
            "name": "mtp-1",
            "label": "mtp",
            "status": "completed",
            "reason": None,
            "host": "http://127.0.0.1:30000",
            "backend": "sglang",
            "model": "m",
            "scenario": "smoke",
            "scenario_file": None,
            "input_tokens": 1000,
            "output_tokens": 1000,
            "levels": [s.concurrency for s in run.levels],
            "rates": None,
            "started_at": 0,
            "simulated": True,
            "report": False,
        },
        "current": None,
        "levels": rows,
        "server_now": None,
        "series": None,
        "columns": live_columns(),
        "charts": live_charts(),
    }


def test_the_live_tables_verdicts_are_in_view_at_1400_px(browser: Any, files: dict[str, Path]) -> None:
    payload = json.dumps(_live_payload(files["mtp"]))

    def serve(route: Any) -> None:
        path = route.request.url.split("://", 1)[1].split("/", 1)[1].split("?")[0]
        if path in ("specload/", "specload/index.html"):
            route.fulfill(body=(WEBPAGE / "index.html").read_text(), content_type="text/html")
        elif path.startswith("specload/static/"):
            name = path.rsplit("/", 1)[1]
            kind = "text/css" if name.endswith(".css") else "application/javascript"
            route.fulfill(body=(WEBPAGE / name).read_text(), content_type=kind)
        elif path == "specload/live":
            route.fulfill(body=payload, content_type="application/json")
        else:
            route.fulfill(status=404, body="{}", content_type="application/json")

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.route("http://specload.test/**", serve)
        page.goto("http://specload.test/specload/")
        page.wait_for_selector("#levels-table")
        heads = page.eval_on_selector_all(
            "#levels-table th",
            """ths => ths.map(th => {
                const r = th.getBoundingClientRect(), wrap = th.closest('.table-wrap').getBoundingClientRect();
                return {text: th.textContent, visible: r.left >= wrap.left - 1 && r.right <= wrap.right + 1};
            })""",
        )
        names = [h["text"] for h in heads]
        assert len(names) >= 16, names  # wider than the window: something is behind the scrollbar
        for verdict in ("SLO met", "Good %", "Client"):
            (h,) = [h for h in heads if h["text"] == verdict]
            assert h["visible"], (verdict, names)
        # the throughput first, as before: the verdicts right after it
        assert names[:2] == ["C", "Status"] and names.index("SLO met") > names.index("Agg tok/s")
    finally:
        page.close()
