"""The web UI in a real browser: headless Chromium driven by Playwright against `specload ui` and the
simulator, as a user would: log in with the printed URL, start from the form, watch the sweep, stop,
start again, give a bad value, read a finished run's report, compare two runs, and check Locust's
own pages against the run's records.

Needs Playwright (``pip install 'specload[browser]'``) and a Chromium: the system's (Debian's
``chromium``, or ``SPECLOAD_CHROMIUM=/path``) or Playwright's own (``playwright install chromium``);
skipped, saying which is missing, without them. Screenshots go to the pytest temporary folder (the
path is printed). ``SPECLOAD_DOCS_SCREENSHOT=1`` also writes the live sweep's to docs/webui-live.png.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from specload.analysis.comparison import build_comparison
from specload.core.records import read_records
from specload.present.compare import load_runs, table_columns, table_rows
from specload.present.compare import render_text as compare_text
from specload.sim.process import SimProcess, start_sim
from tests.conftest import REPO, Procs, free_port, launch_ui, specload_cmd

pytestmark = pytest.mark.slow  # make test-slow: a Chromium of its own, seconds per page on two cores

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="Playwright is not installed: pip install 'specload[browser]'"
)

# E2E about 50 + 47 x 25 ms = 1.2 s: levels last seconds, long enough to watch them.
SIM = ("--ttft-ms", "50", "--itl-ms", "25", "--model", "m")
OUT_TOKENS = "48"
LEVELS = "1,2,4,8"
PER_USER = "4"  # budgets 4, 8, 16, 32: four waves of requests per level, about 5 s each
T = 60_000  # ms: Playwright's waits
LIVE_CHARTS = {
    f"chart-{k}"
    for k in ("agg", "perreq", "ttft", "tpot", "itl", "e2e", "pareto", "errors", "series", "server")
}
FAULTY_SLO = "ttft_p99=2s"  # the faulty run's: the comparison of it has its "Capacity under the SLO"
PROBLEMS: list[str] = []  # errors in specload's page (script errors, failed requests)


def _chromium(pw: Any) -> str | None:
    """A Chromium to drive: the system's first (no download), else Playwright's own if installed."""
    for path in (
        os.environ.get("SPECLOAD_CHROMIUM"),
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
        "/usr/bin/chromium",
    ):
        if path and os.path.exists(path):
            return path
    own = pw.chromium.executable_path
    return own if own and os.path.exists(own) else None


@dataclass
class UI:
    base: str
    login_url: str
    out: Path
    sim: SimProcess
    faulty: SimProcess
    shots: Path
    procs: Procs
    proc: Any

    def log(self) -> str:
        return self.procs.log(self.proc)

    def runs(self) -> list[Path]:
        """The run directories, oldest first."""
        dirs = [p for p in self.out.iterdir() if (p / "run.json").exists()] if self.out.exists() else []
        return sorted(dirs, key=lambda p: json.loads((p / "run.json").read_text())["started_at"])


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UI]:
    procs, sims = Procs(), []
    try:
        sims = [
            start_sim(list(SIM)),
            start_sim([*SIM, "--fault-http-status", "500", "--fault-http-every", "3"]),
        ]
        root = tmp_path_factory.mktemp("webui-browser")
        shots = root / "screens"
        shots.mkdir()
        print(f"\nweb UI screenshots: {shots}")
        port = free_port()
        proc, login = launch_ui(procs, sims[0].url, port, root / "results", "--scenario", "smoke")
        base = f"http://127.0.0.1:{port}"
        yield UI(base, login, root / "results", sims[0], sims[1], shots, procs, proc)
    finally:
        procs.stop_all()
        for s in sims:
            s.stop()


@pytest.fixture(scope="module")
def browser(ui: UI) -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        path = _chromium(pw)
        if path is None:
            pytest.skip(
                "no Chromium: install Debian's chromium (or set SPECLOAD_CHROMIUM), or `playwright install chromium`"
            )
        b = pw.chromium.launch(executable_path=path)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def page(ui: UI, browser: Any) -> Iterator[Any]:
    # The harness's wait_for_function evaluates strings in the page, which the page's CSP forbids
    # (the page's own script never does): bypassed here, enforced in the script-injection test.
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, bypass_csp=True)
    p = context.new_page()
    p.on("pageerror", lambda e: PROBLEMS.append(f"page error: {e}"))
    p.on("console", lambda m: PROBLEMS.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    p.goto(ui.login_url)
    yield p
    context.close()


def shot(ui: UI, p: Any, name: str) -> Path:
    path = ui.shots / f"{name}.png"
    p.screenshot(path=str(path), full_page=True)
    return path


def state(p: Any) -> str:
    return p.text_content("#state") or ""


def wait_state(p: Any, *names: str, timeout: float = T) -> None:
    p.wait_for_function(
        f"{json.dumps(list(names))}.includes(document.querySelector('#state').textContent)", timeout=timeout
    )


def table(p: Any, selector: str) -> list[list[str]]:
    return p.eval_on_selector(
        selector, "t => [...t.rows].map(r => [...r.cells].map(c => c.innerText.trim()))"
    )


def fill_and_start(p: Any, **values: str) -> None:
    for name, value in values.items():
        p.fill(f"#f-{name}", value)
    p.click("#start")


def report_json(run_dir: Path, fmt: str = "json") -> str:
    out = subprocess.run(
        specload_cmd("report", str(run_dir), "--format", fmt, "--no-write"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def fmt1(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


# ---------------------------------------------------------------- the tests, in order (one UI, one browser)


def test_login_lands_on_specloads_page_with_the_form(ui: UI, page: Any) -> None:
    page.wait_for_selector("#start-form:not([hidden]) #f-levels")
    assert page.url == ui.base + "/specload/"
    labels = page.eval_on_selector_all("#fields-main label", "ls => ls.map(l => l.textContent)")
    assert labels[:4] == ["Host", "Levels", "Input Tokens", "Output Tokens"]  # what a sweep is, first
    assert not page.query_selector("#f-user_count") and not page.query_selector("#f-spawn_rate")
    assert (
        page.input_value("#f-levels") == "1,2,4" and page.input_value("#f-host") == ui.sim.url
    )  # from smoke.toml
    assert state(page) == "READY"
    shot(ui, page, "01-start-form")


def test_bad_values_are_refused_in_the_form_and_nothing_starts(ui: UI, page: Any) -> None:
    fill_and_start(page, levels="1,x")
    page.wait_for_selector("#form-error:not([hidden])")
    assert page.text_content("#form-error") == (
        "start form: field 'Levels': expected a comma-separated list of positive integers, got '1,x'"
    )
    shot(ui, page, "02-bad-levels")
    fill_and_start(page, levels=LEVELS, input_tokens="-5")
    page.wait_for_function("document.querySelector('#form-error').textContent.includes('Input Tokens')")
    assert "expected an integer >= 1, got -5" in page.text_content("#form-error")
    time.sleep(1.5)
    assert state(page) == "READY" and ui.runs() == []


def test_a_sweep_started_from_the_form_is_watched_live(ui: UI, page: Any) -> None:
    fill_and_start(
        page, levels=LEVELS, input_tokens="32", output_tokens=OUT_TOKENS, requests_per_user=PER_USER
    )
    page.wait_for_selector("#start-form", state="hidden")
    page.wait_for_selector("#current-level")
    assert re.match(r"Level 1/4 · C=1 · ", page.text_content("#current-level"))
    (run_dir,) = ui.runs()
    assert page.text_content("#run-dir") == str(run_dir) and page.text_content("#run-status") == "running"
    assert page.text_content("#run-scenario").startswith("smoke")
    page.wait_for_function("+document.querySelector('#in-flight').textContent >= 1", timeout=T)
    # The first level ends: its row has the report's figures, the charts against C their first points.
    page.wait_for_function(
        "document.querySelector('#levels-table tr[data-level=c001] td:nth-child(2)')"
        ".textContent === 'completed'",
        timeout=T,
    )
    assert page.query_selector_all("#chart-agg circle")
    # Level 4 (C=8): the live tok/s from streamed tokens, the tok/s-over-time chart with its points.
    page.wait_for_function(
        "document.querySelector('#current-level')?.textContent.startsWith('Level 4/4')", timeout=T
    )
    page.wait_for_function(
        "document.querySelectorAll('#chart-series circle').length >= 2 && "
        "document.querySelector('#levels-table tr.current td:nth-child(8)').textContent !== '-'",
        timeout=T,
    )
    assert re.fullmatch(r"\d+/32 requests", page.text_content("#progress-requests"))
    # every live chart docs/guide.md lists for the page (the simulator's /metrics: the server's gauges)
    page.wait_for_selector("#chart-server", timeout=T)
    ids = set(page.eval_on_selector_all("#charts figure", "fs => fs.map(f => f.id)"))
    assert ids >= LIVE_CHARTS, ids
    assert page.query_selector_all("#chart-pareto circle") and page.query_selector_all("#chart-itl circle")
    live = shot(ui, page, "03-live-sweep")
    if os.environ.get("SPECLOAD_DOCS_SCREENSHOT"):
        page.screenshot(path=str(REPO / "docs" / "webui-live.png"), full_page=True)
    print(f"live sweep: {live}")
    wait_state(page, "STOPPED")
    page.wait_for_function("document.querySelector('#run-status').textContent === 'completed'", timeout=T)
    page.wait_for_selector("#open-report")  # the run directory is complete (report.md written)
    shot(ui, page, "04-sweep-done")

    # Every figure the levels table shows is the report's: `specload report DIR --format json`.
    levels = json.loads(report_json(run_dir))
    rows = table(page, "#levels-table")
    head = rows[0]
    col = {name: head.index(name) for name in head}
    for lv, row in zip(levels, rows[1:], strict=True):
        assert row[col["C"]] == str(lv["concurrency"]) and row[col["Status"]] == "completed"
        assert row[col["Requests"]] == f"{lv['sent']}/{lv['sent']}" and row[col["Ok"]] == str(lv["ok"])
        for name, key in (
            ("Agg tok/s", "agg_tok_s"),
            ("Per-req tok/s", "per_req_tok_s"),
            ("TTFT p50 (ms)", "ttft_p50_ms"),
            ("TTFT p99 (ms)", "ttft_p99_ms"),
            ("TPOT p50 (ms)", "tpot_p50_ms"),
            ("TPOT p99 (ms)", "tpot_p99_ms"),
        ):
            assert row[col[name]] == fmt1(lv[key]), (name, row, lv[key])
    assert (run_dir / "report.md").exists() and (run_dir / "locust.json").exists()


def locust_status(p: Any, status: str, timeout: float = 30_000) -> None:
    """Wait until Locust's own page shows ``status`` in its header (it polls while a run goes on)."""
    p.wait_for_function(
        f"document.querySelector('header').innerText.toUpperCase().includes({json.dumps(status)})",
        timeout=timeout,
    )


def test_stop_reaches_stopped_without_a_reload_and_a_new_run_starts(ui: UI, page: Any, browser: Any) -> None:
    locust = page.context.new_page()  # Locust's own page too: it must not freeze on CLEANUP
    page.click("#new-run")
    page.wait_for_selector("#start-form:not([hidden])")
    assert page.input_value("#f-levels") == LEVELS  # the last run's values
    fill_and_start(page, levels="2", requests_per_level="200")
    page.wait_for_function(
        "+document.querySelector('#levels-table tr.current td:nth-child(4)')?.textContent >= 2", timeout=T
    )
    locust.goto(ui.base + "/")  # (Locust's page learns of a run started elsewhere when it loads)
    locust_status(locust, "RUNNING")
    page.click("#stop")
    wait_state(page, "STOPPED", timeout=30_000)
    locust_status(locust, "STOPPED")  # no reload
    locust.get_by_role("button", name="New").wait_for()  # and it offers a new run
    locust.screenshot(path=str(ui.shots / "05-locust-after-stop.png"))
    assert "CLEANUP" not in locust.inner_text("header").upper()
    second = ui.runs()[-1]
    page.wait_for_function("document.querySelector('#run-status').textContent === 'interrupted'", timeout=T)
    page.wait_for_selector("#open-report")
    assert json.loads((second / "run.json").read_text())["status"] == "interrupted"
    # the level stopped before its budget is drawn as such
    assert "incomplete" in page.text_content("#levels-table tr.incomplete td:nth-child(2)")
    assert (second / "report.md").exists() and (second / "locust.json").exists()
    shot(ui, page, "06-stopped")

    # A new run, against another server (named in the form) that fails every third request.
    page.click("#new-run")
    page.wait_for_selector("#start-form:not([hidden])")
    fill_and_start(
        page,
        host=ui.faulty.url,
        levels="1,2",
        requests_per_level="10",
        output_tokens="16",
        label="faulty",
        slo=FAULTY_SLO,
    )
    wait_state(page, "RUNNING")
    locust.reload()
    locust_status(locust, "RUNNING")
    wait_state(page, "STOPPED")
    locust_status(locust, "STOPPED")  # the natural end: no reload either
    page.wait_for_selector("#open-report")
    third = ui.runs()[-1]
    assert (
        third.name.startswith("faulty-")
        and json.loads((third / "run.json").read_text())["status"] == "completed"
    )

    # Locust's own numbers are the run's requests: its Statistics rows and header failure share.
    records = read_records(str(third / "records.jsonl"))
    # specload's page names why requests failed, with their counts
    reasons = page.text_content("#failure-reasons") or ""
    assert "HTTP 500" in reasons and "×" in reasons, reasons
    locust.wait_for_selector("table")
    rows = table(locust, "table")
    col = {name.replace("\n", " "): i for i, name in enumerate(rows[0])}
    by_name = {r[col["Name"]].replace("\n", " "): r for r in rows[1:]}
    for level, c in ((0, 1), (1, 2)):
        mine = [r for r in records if r.level == level]
        assert by_name[f"c{c:03d} /v1/completions"][col["# Requests"]] == str(len(mine))
        assert by_name[f"c{c:03d} /v1/completions"][col["# Fails"]] == str(
            sum(r.status != "ok" for r in mine)
        )
    assert by_name["Aggregated"][col["# Requests"]] == str(len(records))
    failed = sum(r.status != "ok" for r in records)
    assert 0 < failed < len(records)
    header = locust.inner_text("header")
    assert re.search(rf"FAILURES\s+{round(100 * failed / len(records))}%", header, re.I), header
    locust.screenshot(path=str(ui.shots / "07-locust-statistics.png"))
    locust.close()


def test_a_finished_runs_report_in_the_browser(ui: UI, page: Any) -> None:
    first = ui.runs()[0]
    page.click("button[data-tab=runs]")
    page.wait_for_selector(f"#runs-table tr[data-run='{first.name}']")
    page.click(f"#runs-table tr[data-run='{first.name}'] button.open")
    page.wait_for_selector("#report-body table", timeout=T)
    shot(ui, page, "08-report")
    # the HTML report's charts on the page, tok/s over time from the streamed samples included
    drawn = set(page.eval_on_selector_all("#report-figures svg", "ss => ss.map(s => s.dataset.chart)"))
    assert {"agg_tok_s", "ttft", "tpot", "itl", "e2e", "pareto", "errors", "tok_s_over_time"} <= drawn, drawn
    levels = json.loads(report_json(first))
    rows = table(page, "#report-body table")  # the per-level table, as report.md has it
    head = rows[0]
    for lv, row in zip(levels, rows[1:], strict=True):
        cells = dict(zip(head, row, strict=True))
        assert cells["C"] == str(lv["concurrency"]) and cells["Ok"] == str(lv["ok"])
        assert cells["Agg tok/s"] == fmt1(lv["agg_tok_s"]) and cells["Per-req tok/s"] == fmt1(
            lv["per_req_tok_s"]
        )
        assert cells["TTFT p50 (ms)"] == fmt1(lv["ttft_p50_ms"]) and cells["TPOT p99 (ms)"] == fmt1(
            lv["tpot_p99_ms"]
        )
        assert cells["E2E p50 (s)"] == fmt1(lv["e2e_p50_s"], 2)
    # The downloads are `specload report`'s own outputs.
    for fmt, expected in (
        ("json", report_json(first)),
        ("csv", report_json(first, "csv")),
        ("md", (first / "report.md").read_text()),
    ):
        href = page.get_attribute(f"#report-{fmt}", "href")
        reply = page.request.get(f"{ui.base}/specload/{href}")
        # the run directory named relative (here, outside the UI's folder: its name), never absolute
        expected = expected.replace(str(first.resolve()), first.name).replace(str(first), first.name)
        assert reply.ok and reply.text() == expected, fmt
        assert str(first.parent) not in reply.text()
        assert "attachment" in reply.headers["content-disposition"]
    # and the self-contained HTML report, as `specload report --format html` writes it
    reply = page.request.get(f"{ui.base}/specload/{page.get_attribute('#report-html', 'href')}")
    assert reply.ok and reply.headers["content-type"].startswith("text/html")
    assert "attachment" in reply.headers["content-disposition"]
    html = reply.text()
    for line in (first / "report.md").read_text().splitlines():
        if line.startswith("## "):
            assert f"<h2>{line[3:].strip()}</h2>" in html.replace("&gt;", ">").replace("&lt;", "<"), line
    assert {"agg_tok_s", "ttft", "pareto", "errors", "tok_s_over_time"} <= set(
        re.findall(r'data-chart="([^"]+)"', html)
    )
    assert "<script" not in html


def test_two_runs_compared_in_the_browser(ui: UI, page: Any) -> None:
    first, third = ui.runs()[0], ui.runs()[-1]
    page.click("#refresh-runs")
    for run in (first, third):  # the first ticked is the baseline
        page.check(f"#runs-table input.pick[data-run='{run.name}']")
    page.click("#compare-selected")
    page.wait_for_selector("#compare-table", timeout=T)
    page.wait_for_function(
        "document.querySelector('#compare-plot')?.complete && "
        "document.querySelector('#compare-plot').naturalWidth > 0",
        timeout=T,
    )
    shot(ui, page, "09-compare")
    comp = build_comparison(load_runs([first, third]))
    rows = table(page, "#compare-table")
    assert rows[0] == table_columns(comp) and rows[1:] == table_rows(comp)
    verdict = page.eval_on_selector_all("#verdict li", "ls => ls.map(l => l.innerText)")
    assert verdict == [s.replace("**", "").replace("`", "") for s in comp.sentences]
    assert page.text_content("#compare-title").startswith("Comparison: smoke vs faulty")
    # every section of comparison.md, the capacity under the SLO included, with its text
    markdown = compare_text(comp, "github")
    headings = [line[3:].strip() for line in markdown.splitlines() if line.startswith("## ")]
    assert f"Capacity under the SLO {FAULTY_SLO}" in headings, headings
    shown = page.eval_on_selector_all("#compare-body h4", "hs => hs.map(h => h.innerText)")
    assert shown == [h.replace("`", "") for h in headings], (shown, headings)
    body = page.inner_text("#compare-body")
    for s in comp.slo.sentences:
        assert s.replace("**", "").replace("`", "") in body, s
    # and every chart of the HTML comparison: the Pareto plot, TTFT/TPOT/ITL/E2E p50 and p99 against C
    drawn = set(page.eval_on_selector_all("#compare-figures svg", "ss => ss.map(s => s.dataset.chart)"))
    assert {"agg_tok_s", "per_req_tok_s", "ttft", "tpot", "itl", "e2e", "pareto", "errors"} <= drawn, drawn
    pareto = page.inner_text("#compare-chart-pareto")
    assert "Per-user vs aggregate tok/s" in pareto and "C=1" in pareto, pareto
    reply = page.request.get(f"{ui.base}/specload/{page.get_attribute('#compare-html', 'href')}")
    assert reply.ok and reply.headers["content-type"].startswith("text/html")
    html = reply.text()
    assert "<h2>Verdict</h2>" in html and "<script" not in html
    assert {"agg_tok_s", "per_req_tok_s", "ttft", "tpot", "pareto", "errors"} <= set(
        re.findall(r'data-chart="([^"]+)"', html)
    )


def test_a_script_in_a_link_from_another_site_runs_nothing(ui: UI, browser: Any) -> None:
    """A hostile page sends the logged-in operator to a run name that is a script: an error page
    that echoed it as HTML would run it in the UI's origin, where it could start a sweep with the
    key. It must arrive as data. The page itself runs under its Content-Security-Policy unharmed."""
    context = browser.new_context()  # the policy enforced
    seen: list[str] = []
    try:
        p = context.new_page()
        p.on("console", lambda m: seen.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        p.on("pageerror", lambda e: seen.append(f"page error: {e}"))
        p.goto(ui.login_url)  # logged in, on specload's page
        p.wait_for_selector("#state:text-matches('^(READY|RUNNING|STOPPING|STOPPED)$')")  # its script ran
        p.wait_for_timeout(500)
        assert seen == [], seen  # nothing of the page's own is refused by its policy
        p.on("dialog", lambda d: (seen.append(f"dialog {d.message}"), d.dismiss()))
        p.on("request", lambda r: seen.append(f"{r.method} {r.url}") if r.method != "GET" else None)
        # The review's attack: the name loads the script that the fragment carries (no slash in the name).
        name = quote("<img src=x onerror=eval(decodeURIComponent(location.hash.slice(1)))>", safe="")
        code = quote(
            "fetch('/swarm',{method:'POST',body:'host=http://evil'});alert(document.domain)", safe=""
        )
        reply = p.goto(f"{ui.base}/specload/runs/{name}/report#{code}")
        p.wait_for_timeout(1500)
        assert [s for s in seen if "404" not in s] == [], seen  # no alert, no POST: nothing ran
        assert reply is not None and reply.status == 404
        assert reply.headers["content-type"].startswith("application/json")
        assert p.evaluate("document.images.length") == 0
    finally:
        context.close()


def test_no_errors_in_the_page(page: Any) -> None:
    assert PROBLEMS == []
