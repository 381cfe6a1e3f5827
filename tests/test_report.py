"""specload.present.report against hand-written run directories (no server, no Locust run)."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from specload.analysis.metrics import LevelStats, level_json
from specload.analysis.run import NotARunDir, load_run, read_server_samples
from specload.core.records import (
    FAILED,
    OK,
    PHASE_MEASURE,
    PHASE_WARMUP,
    SHORT,
    SRC_USAGE,
    RequestRecord,
    make_record,
)
from specload.core.rundir import ServerInfo
from specload.present.report import (
    COLUMNS,
    level_columns,
    main,
    print_report,
    render_levels,
    render_report,
    side_text,
    write_report_md,
)
from specload.present.tableview import view_for

T0 = 1_764_475_200.0  # 2025-11-30T04:00:00Z
FIXTURES = Path(__file__).parent / "fixtures"


def rec(
    level: int,
    c: int,
    seq: int,
    t_send: float,
    t_end: float,
    *,
    tokens: int = 10,
    status: str = OK,
    phase: str = PHASE_MEASURE,
    reason: str | None = None,
    verify: int | None = None,
) -> RequestRecord:
    return make_record(
        t_send=T0 + t_send,
        t_first=T0 + t_send + 0.5,
        t_last=T0 + t_end,
        t_end=T0 + t_end,
        output_tokens=tokens,
        level=level,
        concurrency=c,
        phase=phase,
        seq=seq,
        backend="openai",
        status=status,
        reason=reason,
        http_status=200,
        output_tokens_source=SRC_USAGE,
        prompt_tokens=100,
        requested_output_tokens=10,
        requested_prompt_tokens=100,
        chunks=tokens,
        itl_max_s=None,
        spec_verify_ct=verify,
        worker="local",
    )


def sample_records() -> list[RequestRecord]:
    """C=1: warmup + 2 requests; C=2: 4 requests, one short and one failed."""
    return [
        rec(0, 1, 0, -2.0, -1.0, tokens=3, phase=PHASE_WARMUP),
        rec(0, 1, 0, 0.0, 2.0),
        rec(0, 1, 1, 2.0, 4.0),
        rec(1, 2, 0, 10.0, 12.0),
        rec(1, 2, 1, 10.0, 13.0),
        rec(1, 2, 2, 12.0, 14.0, tokens=4, status=SHORT, reason="stream ended without terminator"),
        rec(1, 2, 3, 13.0, 13.5, tokens=0, status=FAILED, reason="HTTP 503: " + "x" * 300),
    ]


def sample_meta() -> dict[str, Any]:
    return {
        "specload_version": "0.1.0",
        "locust_version": "2.47.0",
        "label": "baseline",
        "host": "http://127.0.0.1:30000",
        "backend": "openai",
        "model": "m",
        "scenario_file": "scenarios/smoke.toml",
        "scenario": {"name": "smoke"},
        "started_at": T0,
        "ended_at": T0 + 20,
        "status": "completed",
        "levels": [
            {"index": 0, "concurrency": 1, "repeat": 0, "budget": 2, "warmup": 1, "status": "completed"},
            {"index": 1, "concurrency": 2, "repeat": 0, "budget": 4, "warmup": 0, "status": "completed"},
            {
                "index": 2,
                "concurrency": 4,
                "repeat": 0,
                "budget": 8,
                "warmup": 0,
                "status": "incomplete",
                "granted": 0,
                "received": 0,
            },
        ],
        "server": {},
        "simulated": True,
    }


def locust_entries(c1: int = 2, c2: int = 4) -> list[dict[str, Any]]:
    return [
        {"name": "c001 warmup /v1/completions", "method": "POST", "num_requests": 1, "num_failures": 0},
        {"name": "c001 /v1/completions", "method": "POST", "num_requests": c1, "num_failures": 0},
        {"name": "c002 /v1/completions", "method": "POST", "num_requests": c2, "num_failures": 1},
    ]


def write_run(
    d: Path,
    records: list[RequestRecord] | None = None,
    meta: dict[str, Any] | None = None,
    locust_json: list[dict[str, Any]] | None = None,
    locust_csv: list[dict[str, Any]] | None = None,
) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    if meta is not None:
        (d / "run.json").write_text(json.dumps(meta))
    if records is not None:
        (d / "records.jsonl").write_bytes(b"".join(r.to_json() + b"\n" for r in records))
    if locust_json is not None:
        (d / "locust.json").write_text(json.dumps(locust_json))
    if locust_csv is not None:
        with (d / "locust_stats.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["Type", "Name", "Request Count", "Failure Count", "Median Response Time"])
            for e in locust_csv:
                w.writerow([e["method"], e["name"], e["num_requests"], e["num_failures"], 100])
            w.writerow(["", "Aggregated", 99, 1, 100])
    return d


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_run(tmp_path / "run", sample_records(), sample_meta(), locust_json=locust_entries())


# ---------------------------------------------------------------- load_run


def test_load_run(run_dir: Path) -> None:
    run = load_run(run_dir)
    assert run.meta["label"] == "baseline"
    assert len(run.records) == 7
    assert [(s.label, s.sent, s.ok, s.short, s.failed, s.warmup) for s in run.levels] == [
        ("c001", 2, 2, 0, 0, 1),
        ("c002", 4, 2, 1, 1, 0),
        ("c004", 0, 0, 0, 0, 0),
    ]
    c1 = run.levels[0]
    assert c1.output_tokens == 20 and c1.wall_s == pytest.approx(4.0) and c1.agg_tok_s == pytest.approx(5.0)
    assert run.crosscheck == []  # locust.json agrees (warmup rows ignored)
    assert run.notices == []


def test_crosscheck_note_when_counts_differ(tmp_path: Path) -> None:
    d = write_run(tmp_path / "r", sample_records(), sample_meta(), locust_json=locust_entries(c2=3))
    assert load_run(d).crosscheck == [
        "c002: records 4 requests, Locust counted 3 (records are authoritative)"
    ]


def test_crosscheck_reads_an_older_run_with_metric_rows(tmp_path: Path) -> None:
    """Until 0.1.0 TTFT, TPOT and tok/s were Locust METRIC rows: such run directories still check out."""
    old = [
        *locust_entries(),
        {"name": "c001 ttft", "method": "METRIC", "num_requests": 2, "num_failures": 0},
        {"name": "c002 tok/s", "method": "METRIC", "num_requests": 2, "num_failures": 0},
    ]
    d = write_run(tmp_path / "r", sample_records(), sample_meta(), locust_json=old)
    assert load_run(d).crosscheck == []


def test_crosscheck_falls_back_to_csv(tmp_path: Path) -> None:
    same = write_run(tmp_path / "same", sample_records(), sample_meta(), locust_csv=locust_entries())
    assert load_run(same).crosscheck == []
    off = write_run(tmp_path / "off", sample_records(), sample_meta(), locust_csv=locust_entries(c1=1))
    assert load_run(off).crosscheck == [
        "c001: records 2 requests, Locust counted 1 "
        "(Locust's _stats.csv can miss the last second; records are authoritative)"
    ]


def test_crosscheck_skipped_without_locust_files(tmp_path: Path) -> None:
    d = write_run(tmp_path / "r", sample_records(), sample_meta())
    (note,) = load_run(d).crosscheck
    assert "skipped" in note


def test_crosscheck_unreadable_json_uses_csv(tmp_path: Path) -> None:
    d = write_run(tmp_path / "r", sample_records(), sample_meta(), locust_csv=locust_entries())
    (d / "locust.json").write_text("[{not json")
    notes = load_run(d).crosscheck
    assert len(notes) == 1 and notes[0].startswith("could not read locust.json")


# ---------------------------------------------------------------- formats


def test_github_table_columns_and_rounding(run_dir: Path) -> None:
    text = render_levels(load_run(run_dir).levels, "github")
    header = [c.strip() for c in text.splitlines()[0].strip("|").split("|")]
    assert header == list(COLUMNS)
    row1 = [c.strip() for c in text.splitlines()[2].strip("|").split("|")]
    # C=1: 20 tokens / 4 s; per-req 10/2; TTFT 0.5 s; TPOT 1.5/9 s; e2e 2 s; steady window [0.5, 4]
    # (from the first token: the first prompt's prefill is no steady state) so 20 / 3.5; conc 4/4
    assert row1 == [
        "1",
        "5.0",
        "5.0",
        "20",
        "4.0",
        "2",
        "0",
        "0",
        "500.0",
        "500.0",
        "166.7",
        "166.7",
        "2.00",
        "5.7",
        "1.0",
        "0.50",  # Req/s: 2 OK requests in 4 s
    ]
    row3 = [c.strip() for c in text.splitlines()[4].strip("|").split("|")]
    assert row3[0] == "4" and row3[1] == "-" and row3[3] == "0"


def test_plain_format(run_dir: Path) -> None:
    text = render_levels(load_run(run_dir).levels, "plain")
    assert "Agg tok/s" in text and "|" not in text


def test_csv_parses_back(run_dir: Path) -> None:
    rows = list(csv.DictReader(io.StringIO(render_levels(load_run(run_dir).levels, "csv"))))
    assert list(rows[0]) == list(COLUMNS)
    assert [r["C"] for r in rows] == ["1", "2", "4"]
    assert rows[1]["Tokens"] == "24" and rows[1]["Fail"] == "1" and rows[1]["Short"] == "1"
    assert rows[2]["Agg tok/s"] == ""


def test_json_parses_back_full_precision(run_dir: Path) -> None:
    run = load_run(run_dir)
    data = json.loads(render_levels(run.levels, "json"))
    assert data == [level_json(s) for s in run.levels]
    assert data[0]["dists"]["ttft"]["p50"] == pytest.approx(0.5) and data[0]["dists"]["ttft"]["n"] == 2
    assert data[1]["agg_tok_s"] == pytest.approx(24 / 4)  # sends 10..13, last end 14


def test_unknown_format_rejected(run_dir: Path) -> None:
    with pytest.raises(ValueError):
        render_levels(load_run(run_dir).levels, "nope")
    assert main([str(run_dir), "--format", "nope", "--no-write"]) == 2


@pytest.mark.parametrize("fmt", ["github", "plain", "csv", "json", "grid"])
def test_main_every_format(run_dir: Path, fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(run_dir), "--format", fmt, "--no-write"]) == 0
    out = capsys.readouterr().out
    if fmt == "json":
        assert len(json.loads(out)) == 3
    elif fmt == "csv":
        assert len(list(csv.reader(io.StringIO(out)))) == 4
    else:
        assert "TTFT p50 (ms)" in out and "baseline" in out
    assert not (run_dir / "report.md").exists()


# ---------------------------------------------------------------- report text


def test_report_md_written_with_header_and_notes(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(run_dir)]) == 0
    md = (run_dir / "report.md").read_text()
    run = load_run(run_dir)
    assert md == render_report(run)  # every column, as tabulate lays them out
    assert capsys.readouterr().out == render_report(run, view=view_for(None))  # what fits this terminal
    for expected in [
        "# specload report: baseline",
        "SIMULATED SERVER",
        "- host: http://127.0.0.1:30000",
        "- backend: openai",
        "- model: m",
        "- scenario: smoke",
        "- status: completed",
        "- started: 2025-11-30T04:00:00Z",
        "|   C |",
        "c004: level marked incomplete in run.json (budget 8, granted 0, received 0)",
        "c002: 1 of 4 requests got an output token count different from the 10 requested",
        "warmup requests excluded from all figures: c001 1",
        "1 x short: stream ended without terminator (first at c002)",
    ]:
        assert expected in md, expected
    failure = next(line for line in md.splitlines() if "HTTP 503" in line)
    assert "x" * 200 not in failure and "..." in failure  # reason shortened to 120 chars


def test_write_report_md_returns_path(run_dir: Path) -> None:
    path = write_report_md(load_run(run_dir))
    assert path == run_dir / "report.md" and path.read_text().startswith("# specload report")


def test_missing_run_json_still_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = write_run(tmp_path / "orphan", sample_records())
    run = load_run(d)
    assert run.meta == {}
    assert any("no run.json" in n for n in run.notices)
    assert [(s.label, s.sent, s.planned) for s in run.levels] == [("c001", 2, False), ("c002", 4, False)]
    assert main([str(d), "--no-write"]) == 0
    out = capsys.readouterr().out
    assert "NOTICE: no run.json" in out and "c001: records found for a level run.json does not list" in out


def test_run_json_without_records(tmp_path: Path) -> None:
    d = write_run(tmp_path / "fresh", meta=sample_meta())
    run = load_run(d)
    assert [s.sent for s in run.levels] == [0, 0, 0]
    assert any("no records.jsonl" in n for n in run.notices)


def test_empty_dir_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    assert "neither run.json nor records.jsonl" in capsys.readouterr().err
    assert main([str(tmp_path / "does-not-exist")]) == 2
    with pytest.raises(NotARunDir):
        load_run(tmp_path / "empty")


def test_torn_last_line_tolerated(run_dir: Path) -> None:
    with (run_dir / "records.jsonl").open("ab") as f:
        f.write(b'{"level": 1, "concurrency": 2, "phase": "meas')
    run = load_run(run_dir)
    assert len(run.records) == 7 and run.levels[1].sent == 4


def test_interrupted_run_noted(tmp_path: Path) -> None:
    m = sample_meta() | {"status": "interrupted", "simulated": False}
    d = write_run(tmp_path / "r", sample_records(), m, locust_json=locust_entries())
    md = write_report_md(load_run(d)).read_text()
    assert "- status: interrupted" in md and "run status is interrupted" in md
    assert "SIMULATED" not in md


def test_sample_fixture_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """tests/fixtures/sample_run is a small checked-in run dir for trying `specload report` by hand."""
    d = shutil.copytree(FIXTURES / "sample_run", tmp_path / "sample_run")
    assert main([str(d)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\| +C \| Agg tok/s \|", out, re.M) and (d / "report.md").exists()
    run = load_run(d)
    assert run.crosscheck == [] and all(s.sent > 0 for s in run.levels)


# ---------------------------------------------------------------- server samples and configuration


def server_lines() -> str:
    """Samples over C=1's window [0, 4] and C=2's [10, 14]; a torn last line (crash mid-write)."""
    rows = [
        {"t": T0 - 1.0, "level": 0, "running": 0, "queued": 0},
        {"t": T0 + 1.0, "level": 0, "running": 1, "queued": 0},
        {"t": T0 + 3.0, "level": 0, "running": 1, "queued": None},
        {"t": T0 + 11.0, "level": 1, "running": 2, "queued": 1},
        {"t": T0 + 12.0, "level": 1, "running": 2, "queued": 3},
    ]
    return "".join(json.dumps(r) + "\n" for r in rows) + "not json\n" + '{"t": 1764475213.0, "runn'


def test_server_samples_columns(run_dir: Path) -> None:
    (run_dir / "server_samples.jsonl").write_text(server_lines())
    run = load_run(run_dir)
    assert len(run.samples) == 5 and run.notices == []
    c1, c2, c4 = run.levels
    assert (c1.server_samples, c1.server_running_max, c1.server_running_mean) == (2, 1.0, 1.0)
    assert (c1.server_queued_max, c1.server_queued_mean) == (0.0, 0.0)
    assert (c2.server_running_max, c2.server_queued_max, c2.server_queued_mean) == (2.0, 3.0, 2.0)
    assert c4.server_samples == 0 and c4.server_running_max is None
    text = render_levels(run.levels, "github")
    header = [c.strip() for c in text.splitlines()[0].strip("|").split("|")]
    assert header == [*COLUMNS, "Srv run max", "Srv run mean", "Srv queue max", "Srv queue mean"]
    row2 = [c.strip() for c in text.splitlines()[3].strip("|").split("|")]
    assert row2[-4:] == ["2", "2.0", "3", "2.0"]
    rows = list(csv.DictReader(io.StringIO(render_levels(run.levels, "csv"))))
    assert rows[0]["Srv run max"] == "1" and rows[2]["Srv queue mean"] == ""
    assert json.loads(render_levels(run.levels, "json"))[1]["server_queued_max"] == 3.0


def test_read_server_samples_missing_file(tmp_path: Path) -> None:
    assert read_server_samples(tmp_path / "nope.jsonl") == []


def test_accept_len_column_from_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recs = sample_records()
    recs[1] = rec(0, 1, 0, 0.0, 2.0, verify=4)  # 10 tokens / 4 verify steps
    recs[2] = rec(0, 1, 1, 2.0, 4.0, verify=6)  # (10 + 10) / (4 + 6) = 2.0
    d = write_run(tmp_path / "r", recs, sample_meta(), locust_json=locust_entries())
    run = load_run(d)
    assert run.levels[0].figure("accept") == pytest.approx(2.0) and run.levels[1].figure("accept") is None
    text = render_levels(run.levels, "github")
    header = [c.strip() for c in text.splitlines()[0].strip("|").split("|")]
    assert header == [*COLUMNS, "Accept len"]
    assert text.splitlines()[2].rstrip("|").rsplit("|", 1)[1].strip() == "2.00"
    assert main([str(d), "--no-write"]) == 0
    assert "Accept len from SGLang's per-request meta_info" in capsys.readouterr().out


def test_max_running_note_and_server_header(tmp_path: Path) -> None:
    m = sample_meta() | {
        "server": {"engine": "sglang", "speculative_algorithm": "NEXTN", "max_running_requests": 1}
    }
    d = write_run(tmp_path / "r", sample_records(), m, locust_json=locust_entries())
    md = write_report_md(load_run(d)).read_text()
    assert "- server: engine sglang, speculative_algorithm NEXTN, max_running_requests 1" in md
    assert "C=2 exceeds the server's max_running_requests (1): the excess requests queue" in md
    assert "C=4 exceeds the server's max_running_requests (1): the excess requests queue" in md
    assert "C=1 exceeds" not in md
    assert "Accept len" not in md and "Srv run" not in md  # no values, no columns


def test_max_running_requests_effective_wins() -> None:
    def cap(server: Any) -> int | None:
        return ServerInfo.from_json(server).max_running

    assert cap({"max_running_requests": 64, "max_running_requests_effective": 48}) == 48
    assert cap({"max_running_requests": 64}) == 64
    assert cap({"max_running_requests": "64"}) is None
    assert cap({"max_running_requests": True}) is None
    assert cap({"max_running_requests": 64, "max_running_requests_effective": 0}) == 64
    assert cap({}) is None and cap(None) is None
    both = {"speculative_algorithm": None, "max_running_requests": 64, "max_running_requests_effective": 48}
    assert (
        ServerInfo.from_json(both).summary()
        == "speculative_algorithm none, max_running_requests 48 (configured 64)"
    )
    assert ServerInfo().summary() is None


def test_repeats_combined_table(tmp_path: Path) -> None:
    # C=2 run three times: walls 1.0, 2.0 and 3.0 s for 2 x 10 tokens -> agg 20, 10 and 6.67 tok/s.
    records = [
        replace(rec(r, 2, seq, 10.0 * r, 10.0 * r + 1.0 + r), repeat=r) for r in range(3) for seq in range(2)
    ]
    meta = {"levels": [{"index": r, "concurrency": 2, "repeat": r, "status": "completed"} for r in range(3)]}
    run = load_run(write_run(tmp_path / "run", records, meta))
    text = render_report(run)
    assert "Repeats combined" in text
    row = next(line for line in text.splitlines() if line.startswith("| 2 ") and "| 3 " in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:4] == ["2", "3", "12.2", "6.9"]  # mean (20+10+6.67)/3; sample sd sqrt(96.3/2)
    single = load_run(write_run(tmp_path / "one", records[:2], {"levels": meta["levels"][:1]}))
    assert "Repeats combined" not in render_report(single)


# ---------------------------------------------------------------- callable without argv


def test_print_report_is_main_without_argv(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(run_dir), "--format", "csv"]) == 0
    by_main = capsys.readouterr()
    (run_dir / "report.md").unlink()
    out, err = io.StringIO(), io.StringIO()
    path = print_report(load_run(run_dir), "csv", out=out, err=err)
    assert path == run_dir / "report.md" and path.exists()
    assert (out.getvalue(), err.getvalue()) == (by_main.out, by_main.err)
    assert render_report(load_run(run_dir), "csv") == out.getvalue()  # only the data, so it parses
    assert side_text(load_run(run_dir)) + "\n" + f"wrote {path}\n" == err.getvalue()
    with pytest.raises(ValueError):
        print_report(load_run(run_dir), "nope")


def test_write_report(run_dir: Path) -> None:
    path = write_report_md(load_run(run_dir))
    assert path == run_dir / "report.md"
    assert path.read_text() == render_report(load_run(run_dir), "github")
    with pytest.raises(NotARunDir):
        load_run(run_dir / "nowhere")


def test_level_columns_are_one_table() -> None:
    names = [c.header for c in level_columns()]
    # Every table has the always-shown columns in this order (a rate run adds its Rate column first).
    assert [n for n in names if n in COLUMNS] == list(COLUMNS) and len(set(names)) == len(names)
    s = LevelStats(concurrency=1, repeat=0, label="c001")
    counts = ("c", "tokens", "ok", "fail", "short", "late", "429")  # 0 before any request, not None
    assert all(c.value(s) is None or c.key in counts for c in level_columns())


def test_report_reads_run_json_typed(run_dir: Path) -> None:
    run = load_run(run_dir)
    assert run.info.label == "baseline" and run.label == "baseline"
    assert [lv.concurrency for lv in run.info.levels] == [1, 2, 4]
    assert run.meta["label"] == "baseline"  # the raw file, for callers that index it


# ---------------------------------------------------------------- distributions and throughput


def test_distributions_section_has_counts_and_marks_tiny_samples(run_dir: Path) -> None:
    from specload.present.report import render_report

    text = render_report(load_run(run_dir), "github", (50.0, 99.0))
    assert "## Latency distributions" in text
    section = text.split("## Latency distributions", 1)[1].split("##", 1)[0]
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("|")
    ]
    assert rows[0] == ["C", "Latency", "n", "Mean", "Sd", "p50", "p99"]
    ttft1 = next(r for r in rows if r[:2] == ["1", "TTFT"])
    assert ttft1[2] == "2" and ttft1[3] == "500.0" and ttft1[5] == "500.0"
    assert ttft1[6].endswith("*")  # 2 values: the p99 is the maximum, and says so
    assert not ttft1[5].endswith("*")  # the median is not


def test_throughput_section(run_dir: Path) -> None:
    from specload.present.report import render_report

    text = render_report(load_run(run_dir))
    section = text.split("## Throughput", 1)[1].split("##", 1)[0]
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("|")
    ]
    assert rows[0] == [
        "C",
        "Req/s",
        "Output tok/s",
        "Input tok/s",
        "Total tok/s",
        "Peak in flight",
        "Mean conc",
    ]
    c2 = next(r for r in rows if r[0] == "2")
    # C=2: sends 10..13, last end 14 -> 4 s; 2 OK; 24 output tokens; 4 x 100 prompt tokens; at most 2
    # in flight (the hand-offs at 12 and 13 are same-instant); e2e 2 + 3 + 2 + 0.5 over 4 s
    assert c2[1:] == ["0.50", "6.0", "100.0", "106.0", "2", "1.9"]


@pytest.mark.parametrize("bad", ["42", "50,abc", ""])
def test_percentiles_flag_rejects_what_is_not_kept(
    run_dir: Path, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from specload.present.report import main

    assert main([str(run_dir), "--no-write", "--percentiles", bad]) == 2
    assert "--percentiles" in capsys.readouterr().err


def test_percentiles_flag_chooses_the_columns(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specload.present.report import main

    assert main([str(run_dir), "--no-write", "--percentiles", "90,99.9"]) == 0
    out = capsys.readouterr().out
    section = out.split("## Latency distributions", 1)[1].split("##", 1)[0]
    header = [
        c.strip() for c in next(x for x in section.splitlines() if x.startswith("|")).strip("|").split("|")
    ]
    assert header[-2:] == ["p90", "p99.9"] and "p50" not in header


def test_plot_flag_draws_tok_s_over_time(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    from specload.present.report import SERIES_PNG, main

    assert main([str(run_dir), "--no-write", "--plot"]) == 0
    png = run_dir / SERIES_PNG
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {png}" in capsys.readouterr().err


def test_tok_s_series_buckets_add_up(run_dir: Path) -> None:
    lv = load_run(run_dir).levels[0]  # C=1: 20 tokens over 4 s, first tokens at 0.5 and 2.5
    assert len(lv.tok_s_series) == 4
    assert sum(lv.tok_s_series) * 1.0 == pytest.approx(lv.output_tokens)


# ---------------------------------------------------------------- adding a figure (CONTRIBUTING.md)


def test_a_figure_added_through_the_table_reaches_the_table_and_the_json(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe "add a figure": one entry in the figure table (analysis.figures.FIGURES) with its
    definition over a level's columns, and it is in the table (every format) and in the JSON."""
    from specload.analysis import figures
    from specload.core.text import fmt_num

    def ttft_max(c: Any, mask: Any, server: Any) -> float | None:
        xs = c.present("ttft", mask & c.is_label("status", OK))
        return float(xs.max()) * 1e3 if len(xs) else None

    entry = figures.Figure.of("ttft_max", "ttft_max_ms", "TTFT max (ms)", "ms", 1, compute=ttft_max)
    monkeypatch.setattr(figures, "FIGURES", (*figures.FIGURES, entry))
    run = load_run(run_dir)
    want = []  # by hand: the largest TTFT of each level's OK measured requests
    for s in run.levels:
        ttfts = [
            r.ttft_s * 1e3
            for r in run.records
            if r.concurrency == s.concurrency and r.phase == PHASE_MEASURE and r.status == OK and r.ttft_s
        ]
        want.append(max(ttfts) if ttfts else None)
    assert [s.extra.get("ttft_max_ms") for s in run.levels] == want and want[0] is not None
    rows = list(csv.reader(io.StringIO(render_levels(run.levels, "csv"))))
    assert rows[0][-1] == "TTFT max (ms)"
    assert [r[-1] for r in rows[1:3]] == [fmt_num(v, 1) for v in want[:2]]
    narrow = render_levels(run.levels, "github", view_for(None, 100))  # without a rank it goes first
    assert "TTFT max (ms)" not in narrow.splitlines()[0] and "TTFT p50 (ms)" in narrow.splitlines()[0]
    assert [level_json(s)["extra"].get("ttft_max_ms") for s in run.levels] == want
    assert "TTFT max (ms)" in render_levels(run.levels)


def test_reasons_that_differ_only_in_a_number_are_one_line_and_the_list_is_capped() -> None:
    from specload.present.report import MAX_REASONS, failure_summary

    a = LevelStats(concurrency=1, repeat=0, label="c001")
    a.reasons = {f"short: stream ended without [DONE] after {k} of 1000 tokens": 1 for k in (5, 17, 998)}
    a.reasons["failed: HTTP 503: Service Unavailable"] = 4
    b = LevelStats(concurrency=4, repeat=0, label="c004")
    b.reasons = {f"failed: odd reason {chr(65 + i)}": 1 for i in range(MAX_REASONS + 2)}
    lines = failure_summary([a, b])
    assert lines[0] == "4 x failed: HTTP 503: Service Unavailable (first at c001)"
    assert (
        lines[1] == "3 x short: stream ended without [DONE] after N of 1000 tokens (N 5-998) (first at c001)"
    )
    assert len(lines) == MAX_REASONS + 1
    assert lines[-1] == "4 x 4 other reasons (records.jsonl has each)"


def test_a_run_dir_that_cannot_take_report_md_still_prints_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = shutil.copytree(FIXTURES / "sample_run", tmp_path / "sample_run")
    (d / "report.md").unlink(missing_ok=True)
    (d / "report.md").mkdir()  # as a read-only or full directory would (root writes through modes)
    assert main([str(d)]) == 0
    captured = capsys.readouterr()
    assert re.search(r"^\| +C \| Agg tok/s \|", captured.out, re.M)
    assert "Traceback" not in captured.err and "could not write" in captured.err
    assert "the report above is complete (--no-write skips the file)" in captured.err


def test_a_run_dir_that_cannot_take_report_html_still_prints_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The review's L12: `--format html` on a read-only run directory gave an OSError traceback."""
    d = shutil.copytree(FIXTURES / "sample_run", tmp_path / "sample_run")
    for name in ("report.md", "report.html"):
        (d / name).unlink(missing_ok=True)
        (d / name).mkdir()  # as a read-only or full directory would (root writes through modes)
    assert main([str(d), "--format", "html"]) == 0
    captured = capsys.readouterr()
    assert re.search(r"^\| +C \| Agg tok/s \|", captured.out, re.M)
    assert f"could not write {d / 'report.html'}" in captured.err and "Traceback" not in captured.err
