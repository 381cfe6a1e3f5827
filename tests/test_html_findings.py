"""The HTML report and comparison as review 3a7af2e (webui.md) found them, fixed: one colour per run
in every chart (N2), each crossover mark on its own figure's chart (N1), each run's token counts and
specload's version on the page (N6, F12), no absolute run directory in the page's downloads (N6).
The browser's view of the same files: tests/test_html_browser.py."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from specload.analysis.comparison import build_comparison
from specload.analysis.run import load_run
from specload.present.htmlpage import compare_page, report_page
from specload.present.svg import colour_of
from specload.present.webview import compare_bundle, report_bundle, shown_path
from tests.fixtures.make_compare_runs import TOKENS, write_reference_pair, write_run

SERIES = re.compile(r'<g class="series" data-name="([^"]*)" data-colour="([^"]*)">')


def _charts(html: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r'data-chart="([^"]+)"(.*?)</svg>', html, re.S)}


def _three(tmp_path: Path) -> str:
    base, mtp = write_reference_pair(tmp_path / "pair")
    third = write_run(tmp_path / "pair" / "k3", "mtp3", {1: 300.0, 4: 900.0}, {1: 300.0, 4: 240.0}, cap=48)
    comp = build_comparison([load_run(base), load_run(mtp), load_run(third)])
    return compare_page(comp, "# specload comparison\n")


def test_one_colour_per_run_in_every_chart(tmp_path: Path) -> None:
    html = _three(tmp_path)
    runs = {"baseline": colour_of(0), "mtp": colour_of(1), "mtp3": colour_of(2)}
    seen: dict[str, set[str]] = {}
    for key, svg in _charts(html).items():
        for name, colour in SERIES.findall(svg):
            run = name.split(" ")[0]
            assert colour == runs[run], (key, name, colour)
            seen.setdefault(run, set()).add(key)
    # the latency charts (p50 solid, p99 dashed in the run's colour), the server's (running solid,
    # queued dashed), the acceptance over time (only the runs with samples: still their colours)
    assert {"ttft", "tpot", "e2e", "server", "pareto", "agg_tok_s"} <= seen["mtp"], seen
    assert len(set(runs.values())) == 3


def test_each_crossover_is_marked_on_its_own_figures_chart(tmp_path: Path) -> None:
    base, mtp = write_reference_pair(tmp_path / "pair")
    comp = build_comparison([load_run(base), load_run(mtp)])
    (agg,) = comp.crossovers["mtp"].agg
    assert comp.crossovers["mtp"].per_req == []  # the reference pair's per-request changes keep their sign
    charts = _charts(compare_page(comp, "# c\n"))
    # single runs: a sign change, as the verdict says (it calls no single-run sign change a crossover)
    assert agg.single_runs and f"mtp sign change C≈{round(agg.at)}" in charts["agg_tok_s"]
    assert "sign change" not in charts["per_req_tok_s"]  # the aggregate's mark was drawn here too
    assert "crossover" not in charts["per_req_tok_s"]


def test_token_counts_and_version_on_the_pages(tmp_path: Path) -> None:
    base, mtp = write_reference_pair(tmp_path / "pair")
    run = load_run(mtp)
    page = report_page(run, "# specload report: mtp\n\n## Levels\n")
    line = f"mtp: 1000 input and {TOKENS} output tokens per request, "
    assert line in page and "measured requests per level, specload 0.1.0" in page
    assert page.index(line) < page.index("<h2>Levels</h2>")  # right under the title
    assert "written by specload 0.1.0" in page
    comp = build_comparison([load_run(base), run])
    both = compare_page(comp, "# c\n")
    assert "baseline: 1000 input and" in both and line in both


def test_the_pages_downloads_name_no_absolute_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, mtp = write_reference_pair(tmp_path / "results")
    monkeypatch.chdir(tmp_path)
    assert shown_path(mtp) == str(Path("results") / mtp.name)
    for bundle in (report_bundle(mtp.resolve()), compare_bundle([base.resolve(), mtp.resolve()], plot=False)):
        text = orjson.dumps(bundle).decode()
        assert str(tmp_path) not in text
    assert f"results/{mtp.name}" in report_bundle(mtp.resolve())["markdown"]
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # the results outside where specload runs: the name alone
    assert shown_path(mtp) == mtp.name
