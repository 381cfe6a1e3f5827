"""The figure table (specload.analysis.figures): every entry reaches every surface its flags name,
a figure added as one entry (CONTRIBUTING.md, "Add a figure") is shown everywhere, and the prefix
cache hit rate, from the records' cached_tokens, is in the report, compare and the web page."""

from __future__ import annotations

import csv
import dataclasses
import html
import io
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from specload.analysis import figures
from specload.analysis.comparison import build_comparison
from specload.analysis.metrics import LevelStats, level_json
from specload.analysis.run import Run, load_run
from specload.core.records import OK, RequestRecord
from specload.core.rundir import SERVER_SAMPLES, RunMeta
from specload.present import webview
from specload.present.compare import table_columns, to_dict
from specload.present.htmlpage import report_page
from specload.present.liverow import live_columns, live_row
from specload.present.report import render_levels, render_report
from specload.present.webview import compare_bundle, report_bundle
from tests.test_report import T0, rec, sample_meta, write_run


def _run(label: str, levels: list[LevelStats]) -> Run:
    return Run(Path(label), {"label": label}, levels, info=RunMeta(label=label))


def _header(text: str) -> list[str]:
    """The first table's header cells in a markdown text."""
    line = next(ln for ln in text.splitlines() if ln.startswith("|"))
    return [c.strip() for c in line.strip("|").split("|")]


@pytest.mark.parametrize("entry", figures.FIGURES, ids=[f.key for f in figures.FIGURES])
def test_every_entry_reaches_every_surface_its_flags_name(
    entry: figures.Figure, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each entry alone beside the level axis, its value 0.25 at every level: the report's table (and
    so its CSV and HTML page), the JSON, compare's table and JSON and the web page's live table show
    it where its flags say, and every number is in every JSON whatever the flags."""
    one = dataclasses.replace(entry, value=lambda s: 0.25)
    monkeypatch.setattr(figures, "FIGURES", (figures.BY_KEY["c"], one))
    levels = [LevelStats(concurrency=c, repeat=0, label=f"c{c:03d}", sent=1) for c in (1, 2)]
    table = render_levels(levels)
    assert (entry.header in _header(table)) == entry.report
    csv_head = next(csv.reader(io.StringIO(render_levels(levels, "csv"))))
    assert (entry.header in csv_head) == entry.report
    page = re.sub(r"</?span[^>]*>", "", report_page(_run("a", levels), render_report(_run("a", levels))))
    assert (f"<th>{html.escape(entry.header)}</th>" in page) == entry.report
    comp = build_comparison([_run("a", levels), _run("b", levels)])
    assert (f"{entry.header} b" in table_columns(comp)) == entry.compare
    monkeypatch.setattr(webview, "load_runs", lambda dirs: [_run("a", levels), _run("b", levels)])
    web = compare_bundle(["a", "b"], plot=False)  # the web page's compare (and comparison.html, its page)
    assert (f"{entry.header} b" in web["columns"]) == entry.compare
    web_page = re.sub(r"</?span[^>]*>", "", web["html"])
    assert (f"<th>{html.escape(entry.header)} b</th>" in web_page) == entry.compare
    assert (entry.header in [c["header"] for c in live_columns()]) == entry.live
    if entry.numeric:
        assert level_json(levels[0])[entry.field] == 0.25
        assert to_dict(comp)["levels"][0]["runs"]["b"][entry.field] == 0.25
        assert json.loads(web["json"])["levels"][0]["runs"]["b"][entry.field] == 0.25
        assert live_row(levels[0])[entry.field] == round(0.25, entry.digits + round(math.log10(entry.scale)))
        cell = f"{0.25 * entry.scale:.{entry.digits}f}"
        assert not entry.report or cell in table.splitlines()[2]


def test_the_table_is_consistent() -> None:
    keys = [f.key for f in figures.FIGURES]
    fields = [f.field for f in figures.FIGURES]
    assert len(set(keys)) == len(keys) and len(set(fields)) == len(fields)
    ranks = [f.rank for f in figures.FIGURES if f.rank is not None]
    assert sorted(ranks) == list(range(len(ranks)))  # one place each in the priority
    assert all(set(f.sets) <= set(figures.SETS) for f in figures.FIGURES)
    assert all(f.combine in (figures.MEAN, figures.MAX, figures.SUM) for f in figures.FIGURES)
    assert all(f.show in (figures.ALWAYS, figures.IF_VALUE, figures.IF_COUNTED) for f in figures.FIGURES)
    plain = [
        f for f in figures.FIGURES if f.key not in figures._VALUES and f.compute is None and f.dist is None
    ]
    assert all(hasattr(LevelStats(1, 0, "c001"), f.field) for f in plain)  # it reads its LevelStats field


def test_repeats_combine_by_the_tables_rule() -> None:
    a = LevelStats(concurrency=4, repeat=0, label="c004", ok=3, server_queued_max=2.0, agg_tok_s=10.0)
    b = LevelStats(concurrency=4, repeat=1, label="c004.r1", ok=5, server_queued_max=6.0, agg_tok_s=14.0)
    got = figures.combined([a, b])
    assert (got["ok"], got["server_queued_max"], got["agg_tok_s"]) == (8.0, 6.0, 12.0)  # sum, max, mean
    assert got["ttft_p50_ms"] is None  # no repeat has one


# ---------------------------------------------------------------- adding a figure, on every surface


def _records(c: int, level: int, cached: list[int | None]) -> list[RequestRecord]:
    out = []
    for i, k in enumerate(cached):
        r = rec(level, c, i, 2.0 * i, 2.0 * i + 1.0 + 0.5 * i)
        r.cached_tokens = k
        out.append(r)
    return out


def _run_dir(d: Path, label: str, cached: dict[int, list[int | None]], **scenario: Any) -> Path:
    meta = sample_meta()
    meta["label"] = label
    meta["levels"] = [
        {"index": i, "concurrency": c, "repeat": 0, "status": "completed"} for i, c in enumerate(cached)
    ]
    meta["scenario"] = {**meta.get("scenario", {}), **scenario}
    records = [r for i, (c, ks) in enumerate(cached.items()) for r in _records(c, i, ks)]
    return write_run(d / label, records, meta)


def test_a_figure_added_as_one_entry_is_on_every_surface(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe: one entry with its computation over a level's columns and a mask; nothing else.
    It is in the report (markdown, CSV, JSON, HTML), compare (table, JSON, the web page's compare) and
    the web page's live table, with the value a hand computation gives (the longest E2E of the
    level's OK requests: 1.0 + 0.5 * (n - 1) s)."""

    def e2e_max(c: Any, mask: Any, server: figures.Server) -> float | None:
        xs = c.present("e2e", mask & c.is_label("status", OK))
        return float(xs.max()) if len(xs) else None

    entry = figures.Figure.of(
        "e2e_max", "e2e_max_s", "E2E max (s)", "s", 2, compute=e2e_max, compare=True, live=True
    )
    monkeypatch.setattr(figures, "FIGURES", (*figures.FIGURES, entry))
    monkeypatch.setattr(figures, "BY_KEY", {**figures.BY_KEY, entry.key: entry})  # as the module builds them
    monkeypatch.setattr(figures, "BY_FIELD", {**figures.BY_FIELD, entry.field: entry})
    a = _run_dir(tmp_path, "a", {1: [None, None], 2: [None] * 4})
    b = _run_dir(tmp_path, "b", {1: [None] * 3, 2: [None] * 4})
    want = {1: 1.0 + 0.5 * 2, 2: 1.0 + 0.5 * 3}
    bundle = report_bundle(a)
    assert "E2E max (s)" in _header(bundle["markdown"])
    assert re.search(r"\|\s*2\.50\s*\|", bundle["markdown"]) and "<th>E2E max (s)</th>" in bundle["html"]
    rows = list(csv.DictReader(io.StringIO(bundle["csv"])))
    assert [r["E2E max (s)"] for r in rows] == ["1.50", "2.50"]
    assert [lv["e2e_max_s"] for lv in json.loads(bundle["json"])] == [1.5, 2.5]
    web = compare_bundle([a, b], plot=False)
    assert web["columns"][-2:] == ["E2E max (s) a", "E2E max (s) b"]
    assert [row[-1] for row in web["rows"]] == [f"{want[1]:.2f}", f"{want[2]:.2f}"]
    levels = json.loads(web["json"])["levels"]
    assert [lv["runs"]["b"]["e2e_max_s"] for lv in levels] == [want[1], want[2]]
    assert "E2E max (s)" in [c["header"] for c in live_columns()]
    assert live_row(load_run(b).levels[1])["e2e_max_s"] == want[2]


def test_a_figure_read_from_the_servers_samples_is_one_entry_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A figure the server's /metrics samples give (the peak of its running gauge over the level's
    window, a Sourced value) is also one entry: on every surface, and the report's note names its
    source. By hand: C=1's requests span [T0, T0 + 3.5] s (run b's, T0 + 6) and the samples inside read 3 and 5 (the
    one at T0 + 50 is between the levels): 5; C=2's span [T0 + 100, T0 + 108.5] s and read 7: 7."""

    def run_peak(c: Any, mask: Any, server: figures.Server) -> figures.Sourced:
        xs = [x.running for x in server.within() if x.running is not None]
        return figures.Sourced(max(xs) if xs else None, "gauge")

    entry = figures.Figure.of(
        "run_peak",
        "running_peak",
        "Run peak",
        "requests",
        0,
        compute=run_peak,
        compare=True,
        live=True,
        sources={"gauge": "the server's running gauge (its peak over the level's samples)"},
    )
    monkeypatch.setattr(figures, "FIGURES", (*figures.FIGURES, entry))
    monkeypatch.setattr(figures, "BY_KEY", {**figures.BY_KEY, entry.key: entry})
    monkeypatch.setattr(figures, "BY_FIELD", {**figures.BY_FIELD, entry.field: entry})
    samples = [(0.5, 3), (3.0, 5), (50.0, 99), (101.0, 7)]
    dirs = []
    for label, n in (("a", 2), ("b", 3)):
        meta = sample_meta()
        meta["label"] = label
        meta["levels"] = [
            {"index": i, "concurrency": c, "repeat": 0, "status": "completed"} for i, c in enumerate((1, 2))
        ]
        records = [rec(0, 1, i, 2.0 * i, 2.0 * i + 1.0 + 0.5 * i) for i in range(n)]
        records += [rec(1, 2, i, 100.0 + 2.0 * i, 100.0 + 2.0 * i + 1.0 + 0.5 * i) for i in range(4)]
        d = write_run(tmp_path / label, records, meta)
        lines = [json.dumps({"t": T0 + t, "running": v}) for t, v in samples]
        (d / SERVER_SAMPLES).write_text("\n".join(lines) + "\n")
        dirs.append(d)
    a, b = dirs
    run = load_run(a)
    assert [s.extra["running_peak"] for s in run.levels] == [5, 7]
    assert [s.sources["running_peak"] for s in run.levels] == ["gauge", "gauge"]
    bundle = report_bundle(a)
    assert "Run peak" in _header(bundle["markdown"]) and "<th>Run peak</th>" in bundle["html"]
    assert (
        "Run peak from the server's running gauge (its peak over the level's samples)" in bundle["markdown"]
    )
    assert [r["Run peak"] for r in csv.DictReader(io.StringIO(bundle["csv"]))] == ["5", "7"]
    assert [lv["running_peak"] for lv in json.loads(bundle["json"])] == [5, 7]
    web = compare_bundle([a, b], plot=False)
    assert web["columns"][-2:] == ["Run peak a", "Run peak b"]
    assert [row[-2:] for row in web["rows"]] == [["5", "5"], ["7", "7"]]
    assert [lv["runs"]["b"]["running_peak"] for lv in json.loads(web["json"])["levels"]] == [5, 7]
    assert "Run peak" in [c["header"] for c in live_columns()]
    assert live_row(load_run(b).levels[1])["running_peak"] == 7


# ---------------------------------------------------------------- the prefix cache hit rate


def test_the_prefix_cache_hit_rate_is_on_every_surface_and_named_where_no_prefix_was_asked(
    tmp_path: Path,
) -> None:
    """Cached prompt tokens / prompt tokens from the records (100 prompt tokens each): C=1 with 50 and
    0 cached is 25%, C=2 none. A scenario without a shared prefix gets a note beside TTFT; one
    with a shared prefix does not."""
    a = _run_dir(tmp_path, "a", {1: [50, 0], 2: [0, 0, 0, 0]})
    b = _run_dir(tmp_path, "b", {1: [0, 0, 0], 2: [0, 0, 0, 0]}, shared_prefix_tokens=64)
    run = load_run(a)
    assert [s.extra["prefix_cache_hit_rate"] for s in run.levels] == [0.25, 0.0]
    text = render_report(run)
    assert "Prefix hit %" in _header(text) and re.search(r"\|\s*25\.0\s*\|", text)
    assert (
        "c001: the server's prefix cache served 25.0% of its prompt tokens though the scenario asked" in text
    )
    assert "c002: the server's prefix cache" not in text
    assert "though the scenario asked for no shared prefix" not in render_report(load_run(b))
    rows = list(csv.DictReader(io.StringIO(render_report(run, "csv"))))
    assert [r["Prefix hit %"] for r in rows] == ["25.0", "0.0"]
    web = compare_bundle([a, b], plot=False)
    assert "Prefix hit % a" in web["columns"]
    assert json.loads(web["json"])["levels"][0]["runs"]["a"]["prefix_cache_hit_rate"] == 0.25
    assert live_row(run.levels[0])["prefix_cache_hit_rate"] == 0.25
    assert "Prefix hit %" in [c["header"] for c in live_columns()]
    assert level_json(run.levels[0])["prefix_cache_hit_rate"] == 0.25
