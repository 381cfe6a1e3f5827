"""The web page's acceptance card in a real browser (headless Chromium, Playwright): a sweep started
from the form against a speculative simulator that streams reasoning, with a categorised dataset;
once it ends, the card's acceptance, reasoning and category tables show the report's own figures
(`specload report DIR --format json`). Skipped without Playwright or a Chromium, as
tests/test_webui_browser.py is."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specload.sim.process import start_sim
from tests.conftest import Procs, free_port, launch_ui
from tests.test_acceptance_sim import K3
from tests.test_categories import FIXTURE
from tests.test_webui_browser import T, _chromium, fmt1, report_json, table, wait_state

pytestmark = pytest.mark.slow

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="Playwright is not installed: pip install 'specload[browser]'"
)


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    procs = Procs()
    s = start_sim(
        [
            *K3,
            "--metrics-style",
            "vllm",
            "--per-request-spec-decode-metrics",
            "detailed",
            "--reasoning-tokens",
            "8",
        ]
    )
    try:
        root = tmp_path_factory.mktemp("webui-accept")
        port = free_port()
        _, login = launch_ui(
            procs,
            s.url,
            port,
            root / "results",
            "--backend",
            "chat",
            "--dataset",
            str(FIXTURE),
            "--output-tokens",
            "64",
        )
        yield login, root / "results"
    finally:
        procs.stop_all()
        s.stop()


@pytest.fixture(scope="module")
def page(ui: tuple[str, Path]) -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        path = _chromium(pw)
        if path is None:
            pytest.skip("no Chromium: install Debian's chromium (or set SPECLOAD_CHROMIUM)")
        b = pw.chromium.launch(executable_path=path)
        try:
            context = b.new_context(viewport={"width": 1400, "height": 1000}, bypass_csp=True)
            p = context.new_page()
            errors: list[str] = []
            p.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            p.goto(ui[0])
            yield p
            assert not errors, errors
        finally:
            b.close()


def test_the_acceptance_card_shows_the_reports_figures(ui: tuple[str, Path], page: Any) -> None:
    page.wait_for_selector("#start-form:not([hidden]) #f-levels")
    page.fill("#f-levels", "1,2")
    page.fill("#f-requests_per_user", "3")
    page.click("#start")
    page.wait_for_selector("#start-form", state="hidden")
    wait_state(page, "STOPPED")
    page.wait_for_function("document.querySelector('#run-status').textContent === 'completed'", timeout=T)
    page.wait_for_selector("#acceptance:not([hidden]) #accept-table")
    (run_dir,) = [d for d in ui[1].iterdir() if (d / "run.json").exists()]
    shot = ui[1].parent / "acceptance-card.png"
    page.locator("#acceptance").screenshot(path=str(shot))
    print(f"\nthe acceptance card: {shot}")
    levels = json.loads(report_json(run_dir))
    rows = table(page, "#accept-table")
    head = rows[0]
    assert head[:5] == ["Level", "Accept len", "Accept rate %", "Accept >=k %", "Steps by accepted drafts"]
    for lv, row in zip(levels, rows[1:], strict=True):
        a = lv["acceptance"]
        assert row[0] == f"C={lv['concurrency']}"
        assert row[1] == fmt1(a["length"], 2) and row[2] == fmt1(100 * a["rate"], 1)
        assert row[3] == "/".join(f"{100 * round(v, 3):.0f}" for v in a["per_position"])
        total = sum(a["histogram"])
        assert row[4] == " ".join(
            f"{j}:{100 * round(n / total, 3):.0f}%" for j, n in enumerate(a["histogram"])
        )
        assert row[5] == " ".join(fmt1(v, 2) for v in a["along"])
    assert len(page.query_selector_all("#accept-table svg.hist rect")) == 4 * len(levels)  # k = 3: 0..3
    (sources,) = page.eval_on_selector_all("#accept-sources li", "ls => ls.map(l => l.textContent)")
    assert sources == (
        "Accept len, Accept rate, Tok/pass, the histogram of accepted tokens per step, Accept >=k, "
        "the acceptance along the output from vLLM's per-request metrics.speculative_decoding"
    )
    rrows = table(page, "#reasoning-table")
    col = {name: i for i, name in enumerate(rrows[0])}
    for lv, row in zip(levels, rrows[1:], strict=True):
        r = lv["reasoning"]
        assert row[col["Reasoning reqs"]] == str(r["requests"])
        assert row[col["First answer p50 (ms)"]] == fmt1(r["answer_ttft_p50_ms"])
        assert row[col["Answer tok/s"]] == fmt1(r["answer_tok_s_mean"])
    crows = table(page, "#category-table")
    want = [
        [
            f"C={lv['concurrency']}",
            g["key"],
            str(g["sent"]),
            fmt1(100 * g["output_token_share"], 0),
            fmt1(g["per_req_tok_s"]),
            fmt1(g["accept_length"], 2),
        ]
        for lv in levels
        for g in lv["mix"]["categories"]
    ]
    assert crows[1:] == want
