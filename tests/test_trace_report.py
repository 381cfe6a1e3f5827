"""The trace replay's own figures (specload.analysis.tracereplay) on hand-made records whose
lateness, lengths and arrivals are known, and the report section that shows them."""

from __future__ import annotations

import dataclasses

import pytest

from specload.analysis.tracereplay import KEPT_P99_MS, rate_series, trace_replay_of
from specload.core.records import FAILED, OK, RequestRecord
from specload.present.traceview import merged, trace_charts, trace_lines
from tests.test_metrics import T0, rec

META = {
    "file": "t.jsonl",
    "format": "mooncake",
    "time_unit": "ms",
    "block_size": 512,
    "rows": 10,
    "requests_in_file": 10,
    "requests": 10,
    "first_index": 0,
    "last_index": 9,
    "start_s": 0.0,
    "speedup": 1.0,
    "window_span_s": 9.0,
    "replay_span_s": 9.0,
    "ideal_hit_rate": 0.25,
    "text": "random token ids (t)",
}


def _records(lag_ms: list[float]) -> list[RequestRecord]:
    """Request k due at k seconds, sent lag_ms[k] later; trace input 100 + k, output 10."""
    out = []
    for k, lag in enumerate(lag_ms):
        r = rec(k + lag / 1e3, k + 0.5, k + 1.0, seq=k, requested_prompt=100 + k, prompt=100 + k)
        out.append(dataclasses.replace(r, t_sched=T0 + k, trace_index=k, status=OK))
    return out


def test_lateness_and_lengths_by_hand() -> None:
    lags = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 20.0]
    t = trace_replay_of(_records(lags), META, 0.2, "records")
    assert t is not None
    assert (t.window, t.sent, t.failed) == (10, 10, 0)
    assert t.late_p50_ms == pytest.approx(2.75, abs=1e-3)  # the mean of the 5th and 6th: 2.5 and 3.0
    assert t.late_max_ms == pytest.approx(20.0, abs=1e-3)
    assert t.late_over_ms == 1 and t.late_p99_ms is not None and t.late_p99_ms > KEPT_P99_MS
    assert t.kept_schedule is False and "did not keep the trace's schedule" in t.notes[0]
    assert t.lengths["input (trace)"].max == 109 and t.lengths["input (trace)"].mean == pytest.approx(104.5)
    assert t.ideal_hit_rate == 0.25 and t.server_hit_rate == 0.2
    assert t.due_s == [float(k) for k in range(10)]


def test_a_replay_that_kept_time_and_one_with_missing_requests() -> None:
    recs = _records([1.0] * 8)  # 8 of the window's 10
    recs[3] = dataclasses.replace(recs[3], status=FAILED)
    t = trace_replay_of(recs, META)
    assert t is not None and t.kept_schedule is True and t.late_p99_ms == pytest.approx(1.0, abs=1e-3)
    assert t.sent == 8 and t.failed == 1
    assert any("2 of the window's 10 requests have no record" in n for n in t.notes)
    assert any("no prefix-cache figure" in n for n in t.notes)
    assert trace_replay_of(recs, {}) is None
    warm = trace_replay_of(recs, META, 0.9, "records")  # far above the ideal 25 %: cached before
    assert warm is not None and any("held these prompts from before" in n for n in warm.notes)


def test_rate_series_counts_per_bin() -> None:
    import numpy as np

    bin_s, per_s = rate_series(0.0, np.array([0.0, 0.05, 0.1, 3.9, 4.0]), 4.0)
    assert bin_s == pytest.approx(0.1) and len(per_s) == 40
    assert (
        per_s[0] == pytest.approx(20.0, abs=1e-3)
        and per_s[1] == pytest.approx(10.0)
        and per_s[39] == pytest.approx(20.0, abs=1e-3)
    )
    assert sum(per_s) * bin_s == pytest.approx(5)
    assert merged([10.0, 20.0, 30.0], 2) == [15.0, 30.0]


def test_section_names_units_window_text_lateness_and_hit_rates() -> None:
    t = trace_replay_of(_records([1.0] * 10), META, 0.2, "records")
    assert t is not None
    text = "\n".join(trace_lines(t))
    assert "mooncake: time unit ms, 512-token hash_id blocks" in text
    assert "text that filled the lengths: random token ids (t)" in text
    assert "p50 1.00 ms, p99 1.00 ms, max 1.00 ms; kept the schedule" in text
    assert "served 20.0% of the prompt tokens (records)" in text and "ideal" in text and "25.0%" in text
    assert "input (trace)" in text and "Due (req/s)" in text
    assert [c.key for c in trace_charts(t)] == ["trace-arrivals", "trace-lateness"]


def test_json_has_each_repeats_replay_and_the_text_the_first(tmp_path) -> None:
    """``--format json``: each replayed level (one per repeat) carries its own ``trace``, the same
    figures the markdown section shows for the first; levels of a run without a trace have none."""
    import json

    from specload.analysis.run import load_run
    from specload.present.report import render_report

    first = _records([1.0] * 10)  # every request 1 ms late
    second = [dataclasses.replace(r, level=1, repeat=1) for r in _records([3.0] * 9)]  # 3 ms, one missing
    d = tmp_path / "run"
    d.mkdir()
    levels = [
        {"index": i, "concurrency": 2, "repeat": i, "budget": 10, "rate": 1.0, "status": "completed"}
        for i in (0, 1)
    ]
    meta = {
        "label": "t",
        "status": "completed",
        "scenario": {"trace": "t.jsonl", "trace_format": "mooncake"},
        "trace": META,
        "levels": levels,
    }
    (d / "run.json").write_text(json.dumps(meta))
    (d / "records.jsonl").write_bytes(b"".join(r.to_json() + b"\n" for r in first + second))
    run = load_run(d)
    a, b = (lv["trace"] for lv in json.loads(render_report(run, "json")))
    assert (a["sent"], b["sent"]) == (10, 9) and a["window"] == b["window"] == 10
    assert a["late_p50_ms"] == pytest.approx(1.0, abs=1e-3) and b["late_max_ms"] == pytest.approx(
        3.0, abs=1e-3
    )
    assert a["late_ms"] == pytest.approx([1.0] * 10, abs=1e-3) and a["due_s"] == [float(k) for k in range(10)]
    assert sum(a["due_per_s"]) * a["bin_s"] == pytest.approx(10) and sum(b["sent_per_s"]) * b[
        "bin_s"
    ] == pytest.approx(9)
    assert a["lengths"]["input (trace)"]["max"] == 109 and a["meta"] == META and a["ideal_hit_rate"] == 0.25
    assert "1 of the window's 10 requests have no record" in b["notes"][0]
    text = render_report(run, "github")
    assert "p50 1.00 ms" in text and "p50 3.00 ms" not in text  # the markdown shows the first repeat
    (d / "run.json").write_text(json.dumps({**meta, "trace": {}}))
    assert all("trace" not in lv for lv in json.loads(render_report(load_run(d), "json")))
