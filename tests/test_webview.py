"""specload's web page, the pieces without Locust: the live figures (specload.analysis.live) are the report's
own, and the runs, reports and comparisons it serves (specload.present.webview) are `specload report` and
`specload compare` exactly. The page itself, in a real browser: tests/test_webui_browser.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from specload.analysis.comparison import build_comparison
from specload.analysis.live import MIN_RECOMPUTE_S, LiveRun
from specload.analysis.metrics import ServerSample, level_json
from specload.analysis.run import load_run
from specload.core.records import PHASE_WARMUP
from specload.core.rundir import RunMeta
from specload.present.compare import table_columns, table_rows
from specload.present.report import render_report
from specload.present.webview import (
    NoSuchRun,
    compare_bundle,
    list_runs,
    main,
    report_bundle,
    run_path,
    shown_path,
)
from specload.workload.recorded import recorded_scenario
from tests.conftest import specload_cmd
from tests.test_report import T0, rec, sample_meta, sample_records, write_run

# ---------------------------------------------------------------- live figures


def test_live_figures_are_the_reports_own(tmp_path: Path) -> None:
    records = sample_records()
    samples = [
        ServerSample(T0 + t, running=r, queued=q) for t, r, q in ((1.0, 1, 0), (11.0, 2, 1), (13.0, 2, 0))
    ]
    run_dir = write_run(tmp_path / "r", records, sample_meta())
    (run_dir / "server_samples.jsonl").write_text(
        "".join(json.dumps({"t": s.t, "running": s.running, "queued": s.queued}) + "\n" for s in samples)
    )
    live = LiveRun(3)
    for s in samples:
        live.add_sample(s)
    for r in records:
        live.add_record(r)
    report = load_run(run_dir).levels
    for i, (c, status) in enumerate(((1, "completed"), (2, "completed"))):
        s = live.stats(i, c, 0, status, final=True, now=T0)
        assert s is not None and level_json(s) == level_json(report[i])
    assert live.stats(1, 2, 0, "completed", True, T0).server_queued_max == 1  # the samples count too
    assert live.stats(2, 4, 0, "pending", False, T0) is None  # no record yet


def test_a_running_level_is_recomputed_at_most_once_a_second() -> None:
    live = LiveRun(1)
    live.add_record(rec(0, 1, 0, 0.0, 2.0))
    first = live.stats(0, 1, 0, "running", final=False, now=100.0)
    assert first is not None and first.sent == 1
    live.add_record(rec(0, 1, 1, 2.0, 4.0))
    assert live.stats(0, 1, 0, "running", False, 100.0 + MIN_RECOMPUTE_S / 2) is first  # not yet
    assert live.stats(0, 1, 0, "running", False, 100.0 + MIN_RECOMPUTE_S).sent == 2
    live.add_record(rec(0, 1, 2, 4.0, 6.0))
    assert live.stats(0, 1, 0, "completed", True, 100.0 + MIN_RECOMPUTE_S).sent == 3  # final: at once


def test_warmup_records_alone_give_no_figures_but_count() -> None:
    live = LiveRun(1)
    live.add_record(rec(0, 1, 0, 0.0, 1.0, phase=PHASE_WARMUP))
    s = live.stats(0, 1, 0, "running", False, 0.0)
    assert s is not None and (s.sent, s.warmup, s.agg_tok_s) == (0, 1, None)


def test_streamed_tokens_make_the_live_rate_and_the_series() -> None:
    live = LiveRun(2)
    assert live.streamed_rate(0) is None
    for t, a, b in ((0.0, 0, 0), (1.0, 50, 40), (2.0, 100, 90), (3.0, 150, 130)):
        live.set_streamed(0, "w1", a)
        live.set_streamed(0, "w2", b)
        live.sample_streamed(0, t)
    live.set_streamed(0, "w1", 10)  # an older report arriving late never lowers the count
    assert live.levels[0].streamed_total == 280
    assert live.levels[0].series == [(0.0, 0), (1.0, 90), (2.0, 190), (3.0, 280)]
    assert live.streamed_rate(0) == pytest.approx(280 / 3)  # the whole 5-s window
    assert live.streamed_rate(0, window_s=1.0) == pytest.approx(90.0)
    live.set_streamed(5, "w1", 1)  # a level the run does not have: ignored
    assert live.streamed_rate(1) is None


# ---------------------------------------------------------------- runs, reports, comparisons


@pytest.fixture
def results(tmp_path: Path) -> Path:
    out = tmp_path / "results"
    write_run(out / "baseline-1", sample_records(), sample_meta())
    later = sample_meta() | {"label": "mtp", "started_at": T0 + 100}
    write_run(out / "mtp-2", sample_records(), later)
    (out / "compare-x").mkdir()  # what `specload compare` writes: not a run
    (out / ".hidden").mkdir()
    return out


def test_list_runs_newest_first_from_run_json(results: Path) -> None:
    runs = list_runs(results)
    assert [r["name"] for r in runs] == ["mtp-2", "baseline-1"]
    assert runs[1]["label"] == "baseline" and runs[1]["status"] == "completed"
    assert runs[1]["levels"] == [1, 2, 4] and runs[1]["scenario"] == "smoke" and runs[1]["report"] is False
    # read as a Scenario (workload.recorded): a field the run.json left out is its default
    default = recorded_scenario(RunMeta(scenario={"name": "x"}))
    assert (
        default is not None and runs[1]["input_tokens"] == default.input_tokens and runs[1]["rates"] is None
    )
    assert list_runs(results / "nowhere") == []


@pytest.mark.parametrize(
    "name",
    [
        "",
        "..",
        "../results/baseline-1",
        "baseline-1/..",
        ".hidden",
        "compare-x",
        "nope",
        "/etc",
        "baseline-1\\..",
        "a/b",
    ],
)
def test_run_path_takes_only_run_names_from_the_folder(results: Path, name: str) -> None:
    with pytest.raises(NoSuchRun):
        run_path(results, name)


def test_run_path_refuses_a_link_out_of_the_folder(results: Path, tmp_path: Path) -> None:
    outside = write_run(tmp_path / "elsewhere", sample_records(), sample_meta())
    (results / "link").symlink_to(outside)
    with pytest.raises(NoSuchRun):
        run_path(results, "link")
    assert run_path(results, "baseline-1") == (results / "baseline-1").resolve()


def test_the_report_bundle_is_specload_report(results: Path) -> None:
    run_dir = results / "baseline-1"
    b = report_bundle(run_dir)
    run = load_run(run_dir)
    # as specload report prints it, the run directory named as shown_path names it (no absolute path)
    shown = {
        fmt: render_report(run, fmt).replace(str(run_dir), shown_path(run_dir)) for fmt in ("github", "csv")
    }
    assert str(run_dir) not in b["markdown"] and shown_path(run_dir) in b["markdown"]
    assert b["markdown"] == shown["github"] and b["csv"] == shown["csv"]
    printed = subprocess.run(
        specload_cmd("report", str(run_dir), "--format", "json", "--no-write"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert printed.returncode == 0 and b["json"] == printed.stdout
    assert b["levels"] == json.loads(printed.stdout)
    assert not (run_dir / "report.md").exists()  # nothing written into the run


def test_the_compare_bundle_is_specload_compare(results: Path) -> None:
    dirs = [results / "baseline-1", results / "mtp-2"]
    b = compare_bundle(dirs)
    comp = build_comparison([load_run(d) for d in dirs])
    assert b["runs"] == ["baseline", "mtp"]
    assert b["columns"] == table_columns(comp) and b["rows"] == table_rows(comp)
    assert b["sentences"] == comp.sentences and b["notes"] == comp.notes
    assert b["markdown"].startswith("# specload comparison: baseline vs mtp")
    pytest.importorskip("matplotlib")
    assert b["png"] and b["plot_note"] is None
    assert sorted(p.name for p in results.iterdir()) == [".hidden", "baseline-1", "compare-x", "mtp-2"]


def test_the_child_process_entry_point(results: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    assert main(["report", str(results / "baseline-1")]) == 0
    assert json.loads(capsysbinary.readouterr().out)["label"] == "baseline"
    assert main(["report", str(results / "compare-x")]) == 2
    assert "not a specload run directory" in json.loads(capsysbinary.readouterr().out)["error"]
    assert main(["compare", str(results / "baseline-1")]) == 2
    assert "usage" in json.loads(capsysbinary.readouterr().out)["error"]
