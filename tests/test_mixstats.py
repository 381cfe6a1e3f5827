"""specload.analysis.mixstats and its report sections: lengths sent and counted, classes, turns, prefix cache hit rate."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from specload.analysis.columns import LevelColumns
from specload.analysis.metrics import ServerSample
from specload.analysis.mixstats import (
    CACHE_FROM_COUNTERS,
    CACHE_FROM_GAUGE,
    CACHE_FROM_RECORDS,
    prefix_cache_rate,
    summarize,
)
from specload.analysis.run import load_run
from specload.core.records import FAILED, OK, PHASE_MEASURE, PHASE_WARMUP, RequestRecord, make_record
from specload.core.rundir import RECORDS, LevelMeta, RunMeta, write_run_meta
from specload.core.stats import percentile
from specload.present.report import render_report


def rec(
    seq: int, prompt: int, out: int, *, status: str = OK, level: int = 0, c: int = 4, **extra: Any
) -> dict:
    t = 100.0 + seq * 0.01
    r = make_record(
        t_send=t,
        t_first=t + 0.05,
        t_last=t + 0.05 + 0.01 * max(0, out - 1),
        t_end=t + 0.06 + 0.01 * out,
        output_tokens=out if status != FAILED else 0,
        level=level,
        concurrency=c,
        phase=extra.pop("phase", PHASE_MEASURE),
        seq=seq,
        backend="openai",
        status=status,
        reason=None if status == OK else "x",
        http_status=200,
        output_tokens_source="usage",
        prompt_tokens=None if status == FAILED else prompt + extra.pop("extra_prompt", 0),
        requested_output_tokens=out,
        requested_prompt_tokens=prompt,
        chunks=out,
        itl_max_s=None,
        spec_verify_ct=None,
        worker="local",
        **extra,
    )
    return asdict(r)


def write_run(d: Path, records: list[dict], levels: list[tuple[int, int]] | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / RECORDS).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    metas = [LevelMeta(index=i, concurrency=c, repeat=0, status="completed") for i, c in (levels or [(0, 4)])]
    write_run_meta(d, RunMeta(label="t", levels=metas))
    return d


def test_length_summaries_are_the_percentiles_of_the_values() -> None:
    r = random.Random(3)
    for _ in range(50):
        counts = Counter({r.randrange(1, 40): r.randrange(1, 9) for _ in range(r.randrange(1, 12))})
        values = [v for v, k in counts.items() for _ in range(k)]
        s = summarize(np.array(values, dtype=np.float64))
        assert (
            s.n == len(values) and s.mean == pytest.approx(sum(values) / len(values)) and s.max == max(values)
        )
        assert s.p50 == pytest.approx(percentile(values, 50)) and s.p90 == pytest.approx(
            percentile(values, 90)
        )
    assert summarize(np.array([np.nan])).n == 0


def test_lengths_classes_and_turns_of_a_level(tmp_path: Path) -> None:
    records = [rec(-1, 50, 10, phase=PHASE_WARMUP, request_class="chat")]  # warmup: in no figure
    for i in range(30):
        cls = "chat" if i % 3 else "summary"
        prompt, out = (100 + i, 20) if cls == "chat" else (1000 + i, 200)
        records.append(rec(i, prompt, out, request_class=cls, turn=i % 2, cached_tokens=64, extra_prompt=2))
    records.append(rec(30, 3000, 50, status=FAILED, request_class="summary", turn=0))
    run = load_run(write_run(tmp_path / "run", records))
    (s,) = run.levels
    m = s.mix
    assert m is not None and m.varied
    sent = [r["requested_prompt_tokens"] for r in records[1:]]
    assert m.lengths["input_sent"].n == 31 and m.lengths["input_sent"].mean == pytest.approx(sum(sent) / 31)
    assert m.lengths["input_sent"].max == 3000
    counted = [r["prompt_tokens"] for r in records[1:] if r["status"] != FAILED]
    assert m.lengths["input_counted"].n == 30 and m.lengths["input_counted"].mean == pytest.approx(
        sum(counted) / 30
    )
    assert m.lengths["output_received"].n == 30 and m.lengths["output_asked"].n == 31
    by_name = {g.key: g.stats for g in m.classes}
    shares = {g.key: g.share for g in m.classes}
    assert set(by_name) == {"chat", "summary"}
    chat, summ = by_name["chat"], by_name["summary"]
    assert (chat.sent, chat.ok, summ.sent, summ.ok, summ.failed) == (20, 20, 11, 10, 1)
    mean_out = [x.mix.lengths["output_received"].mean if x.mix else None for x in (chat, summ)]
    assert shares["chat"] == pytest.approx(20 / 31) and mean_out == [20, 200]
    assert chat.output_tokens + summ.output_tokens == s.output_tokens
    assert chat.agg_tok_s + summ.agg_tok_s == pytest.approx(s.agg_tok_s)
    assert [g.key for g in m.turns] == [0, 1] and sum(g.stats.sent for g in m.turns) == 31
    assert (
        s.extra["prefix_cache_hit_rate"] == pytest.approx(64 * 30 / sum(counted))
        and s.sources["prefix_cache_hit_rate"] == CACHE_FROM_RECORDS
    )
    text = render_report(run)
    for heading in ("## Request lengths", "## Request classes", "## Conversation turns", "Prefix hit %"):
        assert heading in text
    assert "| 4   | all     " in text or "| 4   | all " in text
    js = json.loads(render_report(run, "json"))
    assert {g["key"] for g in js[0]["mix"]["classes"]} == {"chat", "summary"}
    assert js[0]["mix"]["lengths"]["input_sent"]["max"] == 3000


def test_a_plain_run_has_no_new_section_or_column(tmp_path: Path) -> None:
    records = [rec(i, 500, 40, cached_tokens=0) for i in range(12)]  # an SGLang run: cached_tokens 0
    run = load_run(write_run(tmp_path / "run", records))
    text = render_report(run)
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == [
        "## Latency distributions (ms, OK requests; * less than one value above: about the maximum)",
        "## Throughput (per second of the level's wall time)",
        "## Notes",
    ]
    assert "Prefix hit" not in text and not run.levels[0].mix.varied
    assert run.levels[0].extra["prefix_cache_hit_rate"] == 0.0


def test_where_the_prefix_cache_rate_comes_from() -> None:
    c = LevelColumns()
    samples = [
        ServerSample(t=9.0, prefix_cache_queries=1000, prefix_cache_hits=100, cache_hit_rate=0.2),
        ServerSample(t=10.5, prefix_cache_queries=1500, prefix_cache_hits=400, cache_hit_rate=0.4),
        ServerSample(t=11.5, prefix_cache_queries=3000, prefix_cache_hits=1300, cache_hit_rate=0.8),
        ServerSample(t=13.0, prefix_cache_queries=9000, prefix_cache_hits=1300, cache_hit_rate=0.0),
    ]
    # vLLM's counters: from the last sample at or before the start to the last at or before the end.
    assert prefix_cache_rate(c, samples, 10.0, 12.0) == (pytest.approx(1200 / 2000), CACHE_FROM_COUNTERS)
    gauge_only = [ServerSample(t=s.t, cache_hit_rate=s.cache_hit_rate) for s in samples]
    assert prefix_cache_rate(c, gauge_only, 10.0, 12.0) == (pytest.approx(0.6), CACHE_FROM_GAUGE)
    assert prefix_cache_rate(c, [], 10.0, 12.0) == (None, None)
    c.add(RequestRecord.from_dict({**rec(0, 200, 10), "t_send": 10.0, "t_end": 10.3, "cached_tokens": 50}))
    assert prefix_cache_rate(c, samples, 10.0, 12.0) == (0.25, CACHE_FROM_RECORDS)  # the records win
