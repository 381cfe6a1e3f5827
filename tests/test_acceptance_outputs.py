"""Every acceptance, reasoning and category figure in every output (issue 21's "done when").

One sweep against the simulator has them all: a categorised dataset (SPEED-Bench's rows) sent by
the chat backend to a speculative server (k = 3, per-request metrics at ``detailed``) that streams
reasoning first. The matrix below is figure x output (the report's markdown, CSV and JSON; the
comparison's markdown, CSV, JSON and HTML; the web page's Compare tab and its live acceptance card);
a figure missing from any output fails the test, naming both. ``compare`` is the run against itself, so every change exists (and is 0).
"""

from __future__ import annotations

import csv
import html
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specload.analysis.run import load_run
from specload.cli import main
from specload.present.acceptview import ALONG_HEADER, live_figures
from specload.present.webview import compare_bundle, report_bundle
from tests.conftest import SIM_START_TIMEOUT_S, start_sim
from tests.fixtures.sim_sweep import sim_sweep
from tests.test_acceptance_sim import K3
from tests.test_categories import FIXTURE

REASONING = 8


def _sweep(url: str, out: Path) -> Path:
    args = ["--backend", "chat", "--dataset", str(FIXTURE), "--levels", "1,2", "--requests-per-level", "6"]
    args += ["--warmup-requests", "0", "--output-tokens", "64", "--read-timeout", "30"]
    return sim_sweep(url, out, *args).run_dir


def _csv_header(text: str) -> list[str]:
    return next(csv.reader(io.StringIO(text)))


def _has_key(data: Any, path: str) -> bool:
    """``path`` (dotted; ``*`` any list item or dict value) leads to a value that is not None / empty."""
    head, _, rest = path.partition(".")
    if head == "*":
        items = data.values() if isinstance(data, dict) else data if isinstance(data, list) else []
        return any(_has_key(x, rest) if rest else x not in (None, [], {}) for x in items)
    if not isinstance(data, dict) or head not in data:
        return False
    return _has_key(data[head], rest) if rest else data[head] not in (None, [], {})


# The outputs: name -> (kind, how to get it from the run's outputs).
Outputs = dict[str, Any]
# figure -> output -> what the output must have: a column / heading in a text, a key path in JSON.
MATRIX: dict[str, dict[str, str]] = {
    "accept length": {
        "web compare": "Δ accept len",
        "web live": "*.acceptance.length",
        "report.md": "Accept len",
        "report csv": "Accept len",
        "report json": "*.acceptance.length",
        "comparison.md": "Δ accept len",
        "compare csv": "Δ accept len",
        "compare json": "levels.*.runs.*.acceptance.length",
        "compare json change": "levels.*.changes.*.acceptance.length",
        "comparison.html": "Δ accept len",
    },
    "accept rate": {
        "web compare": "Δ accept rate pp",
        "web live": "*.acceptance.rate",
        "report.md": "Accept rate %",
        "report csv": "Accept rate %",
        "report json": "*.acceptance.rate",
        "comparison.md": "Δ accept rate pp",
        "compare csv": "Δ accept rate pp",
        "compare json": "levels.*.runs.*.acceptance.rate",
        "compare json change": "levels.*.changes.*.acceptance.rate_pp",
        "comparison.html": "Δ accept rate pp",
    },
    "accept >=k per position": {
        "web compare": "Δ accept >=k pp",
        "web live": "*.acceptance.per_position",
        "report.md": "Accept >=k %",
        "report csv": "Accept >=k %",
        "report json": "*.acceptance.per_position",
        "comparison.md": "Δ accept >=k pp",
        "compare csv": "Δ accept >=k pp",
        "compare json": "levels.*.runs.*.acceptance.per_position",
        "compare json change": "levels.*.changes.*.acceptance.per_position_pp",
        "comparison.html": "Δ accept >=k pp",
    },
    "accept histogram": {
        "web compare": "Δ accept hist pp",
        "web live": "*.acceptance.histogram",
        "report.md": "Accept hist %",
        "report csv": "Accept hist %",
        "report json": "*.acceptance.histogram",
        "comparison.md": "Δ accept hist pp",
        "compare csv": "Δ accept hist pp",
        "compare json": "levels.*.runs.*.acceptance.histogram",
        "compare json change": "levels.*.changes.*.acceptance.histogram_pp",
        "comparison.html": "Δ accept hist pp",
    },
    "accept along the output": {
        "web compare": "Δ accept along",
        "web live": "*.acceptance.along",
        "report.md": ALONG_HEADER,
        "report csv": ALONG_HEADER,
        "report json": "*.acceptance.along",
        "comparison.md": "Δ accept along",
        "compare csv": "Δ accept along",
        "compare json": "levels.*.runs.*.acceptance.along",
        "compare json change": "levels.*.changes.*.acceptance.along",
        "comparison.html": "Δ accept along",
    },
    "acceptance sources": {
        "web compare notes": "from vLLM's per-request metrics.speculative_decoding",
        "web live": "*.acceptance.sources",
        "report.md": "from vLLM's per-request metrics.speculative_decoding",
        "report json": "*.acceptance.sources",
        "comparison.md": "from vLLM's per-request metrics.speculative_decoding",
        "compare json": "levels.*.runs.*.acceptance.sources",
        "comparison.html": "from vLLM's per-request metrics.speculative_decoding",
    },
    "time to first answer token": {
        "web compare": "First answer p50 (ms)",
        "web live": "*.reasoning.answer_ttft_p50_ms",
        "report.md": "First answer p50 (ms)",
        "report csv": "First answer p50 (ms)",
        "report json": "*.reasoning.answer_ttft_p50_ms",
        "comparison.md": "Δ first answer",
        "compare csv": "First answer p50 (ms)",
        "compare json": "levels.*.runs.*.answer_ttft_p50_ms",
        "compare json change": "levels.*.changes.*.reasoning.answer_ttft_p50_pct",
        "comparison.html": "First answer p50 (ms)",
    },
    "reasoning tokens": {
        "web compare": "Reasoning tokens",
        "web live": "*.reasoning.reasoning_tokens_mean",
        "report.md": "Reasoning tokens",
        "report csv": "Reasoning tokens",
        "report json": "*.reasoning.reasoning_tokens_mean",
        "comparison.md": "Reasoning tokens",
        "compare csv": "Reasoning tokens",
        "compare json": "levels.*.runs.*.reasoning_tokens_mean",
        "comparison.html": "Reasoning tokens",
    },
    "answer tok/s": {
        "web compare": "Answer tok/s",
        "web live": "*.reasoning.answer_tok_s_mean",
        "report.md": "Answer tok/s",
        "report csv": "Answer tok/s",
        "report json": "*.reasoning.answer_tok_s_mean",
        "comparison.md": "Δ answer tok/s",
        "compare csv": "Δ answer tok/s",
        "compare json": "levels.*.runs.*.answer_tok_s_mean",
        "compare json change": "levels.*.changes.*.reasoning.answer_tok_s_pct",
        "comparison.html": "Answer tok/s",
    },
    "accept length per category": {
        "web live": "*.categories.*.accept_length",
        "report.md": "## Prompt categories",
        "report json": "*.mix.categories.*.accept_length",
        "comparison.md": "## Per prompt category",
        "compare json": "categories.*.figures.*.*.accept_length",
        "comparison.html": "Per prompt category",
    },
}


def _check(kind: str, output: Any, want: str) -> bool:
    if kind == "csv":  # compare's columns end in the run's label
        return any(h == want or h.startswith(want + " ") for h in _csv_header(output))
    if kind == "json":
        return _has_key(output, want)
    if kind == "columns":
        return any(h == want or h.startswith(want + " ") for h in output)
    if kind == "lines":
        return any(want in line for line in output)
    return want in output


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[str, Any]]]:
    tmp = tmp_path_factory.mktemp("outputs")
    args = [*K3, "--metrics-style", "vllm", "--per-request-spec-decode-metrics", "detailed"]
    s = start_sim([*args, "--reasoning-tokens", str(REASONING)], SIM_START_TIMEOUT_S)
    try:
        run = _sweep(s.url, tmp / "runs")
    finally:
        s.stop()
    rep = report_bundle(run)
    out = tmp / "cmp"
    assert main(["compare", str(run), str(run), "--out", str(out), "--no-plot", "--format", "html"]) == 0
    cmp = compare_bundle([run, run], plot=False)
    yield {
        "report.md": ("text", rep["markdown"]),
        "report csv": ("csv", rep["csv"]),
        "report json": ("json", json.loads(rep["json"])),
        "comparison.md": ("text", (out / "comparison.md").read_text()),
        "compare csv": ("csv", cmp["csv"]),
        "compare json": ("json", json.loads(cmp["json"])),
        "compare json change": ("json", json.loads(cmp["json"])),
        "comparison.html": ("text", html.unescape((out / "comparison.html").read_text())),
        "web compare": ("columns", cmp["columns"]),  # the page's Compare tab: the table's columns
        "web compare notes": ("lines", cmp["notes"]),
        "web live": ("json", [live_figures(s) for s in load_run(run).levels]),  # the page's acceptance card
    }


@pytest.mark.parametrize("figure", sorted(MATRIX))
def test_every_figure_in_every_output(outputs: dict[str, tuple[str, Any]], figure: str) -> None:
    missing = [name for name, want in MATRIX[figure].items() if not _check(*outputs[name], want)]
    assert not missing, f"{figure} missing from {missing}"


def test_the_changes_of_a_run_against_itself_are_zero(outputs: dict[str, tuple[str, Any]]) -> None:
    data = outputs["compare json"][1]
    for lv in data["levels"]:
        (change,) = lv["changes"].values()
        a = change["acceptance"]
        assert a["length"] == 0 and a["rate_pp"] == 0
        assert a["per_position_pp"] == [0, 0, 0] and a["histogram_pp"] == [0, 0, 0, 0]
        assert all(v == 0 for v in a["along"])
        (run,) = {json.dumps(r["acceptance"], sort_keys=True) for r in lv["runs"].values()}
        fig = json.loads(run)
        assert fig["rate"] == pytest.approx(47 / 48) and fig["per_position"] == pytest.approx(
            [1.0, 1.0, 15 / 16]
        )
        assert fig["histogram"] == pytest.approx([0, 0, 1 / 16, 15 / 16])
        r = next(iter(lv["runs"].values()))  # (the reasoning figures are the table's, beside the others)
        first = r["levels"][0]["reasoning"]["ttft_p50_ms"]  # the first token of the reasoning streams
        # Exactly the reasoning asked for: a verify step's chunk across its end is split there. The
        # answer comes after the first token, or with it when a reader late by a few steps (a loaded
        # machine) gets the reasoning's end and the answer's start in its first event.
        assert r["reasoning_tokens_mean"] == REASONING and r["answer_ttft_p50_ms"] >= first
