"""Trace replay: the scenario's trace fields, the schedule the owner hands out, each request's prompt
(exact length, shared hash_ids blocks as shared tokens), and whole replays against the simulator:
one process and --processes 2, every request of the window sent once, with its own lengths, at
its due time, and the server's prefix cache hitting as the trace's ideal says."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from specload.core.records import read_records
from specload.core.rundir import read_run_meta
from specload.sweep.levels import (
    GRANT_AHEAD_S,
    MEASURE,
    TRACE_GRANT_AHEAD_S,
    TRACE_LEAD_S,
    SweepController,
    plan_levels,
)
from specload.workload.config import Scenario, ScenarioError, apply_overrides
from specload.workload.prompts import IDS, TEXT, PromptSource
from specload.workload.replay import replay_of
from specload.workload.traceprompt import TRACE_N0, trace_prompt
from specload.workload.traces import TraceRequest, read_trace
from specload.workload.traces.window import Window, cut, due_offsets
from specload.workload.vocab import IdPool
from tests.conftest import specload_cmd

FIX = Path(__file__).parent / "fixtures" / "traces"
MOONCAKE = str(FIX / "mooncake_conversation_head300.jsonl")


def _sc(**fields: object) -> Scenario:
    return apply_overrides(Scenario(), {"trace": MOONCAKE, "trace_format": "mooncake", **fields})


def test_trace_fields_are_checked() -> None:
    with pytest.raises(ScenarioError, match="needs its format named"):
        apply_overrides(Scenario(), {"trace": MOONCAKE})
    with pytest.raises(ScenarioError, match="time unit declared"):
        apply_overrides(Scenario(), {"trace": "t.jsonl", "trace_format": "jsonl"})
    with pytest.raises(ScenarioError, match="block size declared"):
        apply_overrides(
            Scenario(),
            {"trace": "t.csv", "trace_format": "csv", "trace_time_unit": "s", "trace_hash_field": "h"},
        )
    with pytest.raises(ScenarioError, match="reader fixes its own units"):
        _sc(trace_time_unit="s")
    for key, value in (("rates", "2"), ("warmup_requests", 2), ("turns", 2)):
        with pytest.raises(ScenarioError, match=f"field '{key}'"):
            _sc(**{key: value})
    with pytest.raises(ScenarioError, match="real text on a trace is sent as token ids"):
        _sc(prompts="real", backend="chat")
    assert _sc(prompts="real").prompt_method == "real"
    with pytest.raises(ScenarioError, match="trace_format"):
        _sc(trace_format="parquet")


def test_plan_is_one_level_per_repeat_due_at_the_trace_times() -> None:
    sc = _sc(trace_requests=20, trace_speedup=2.0, repeat=2)
    plans = plan_levels(sc)
    offsets = plans[0].offsets
    assert offsets is not None
    trace = read_trace(MOONCAKE, "mooncake")
    window = trace.requests[:20]
    assert len(plans) == 2 and all(p.budget == 20 and p.warmup == 0 for p in plans)
    assert offsets == pytest.approx([(r.arrival_s - window[0].arrival_s) / 2 for r in window])
    assert plans[0].rate == pytest.approx(19 / offsets[-1])

    t = [1000.0]
    ctrl = SweepController(plans, clock=lambda: t[0])
    ctrl.tick(0)
    ctrl.tick(plans[0].concurrency)
    assert ctrl.current is not None and ctrl.current.phase == MEASURE
    opened = t[0]
    # A trace's first request is due TRACE_LEAD_S after the level opens (a rate level's: 50 ms), and
    # each ticket waits until TRACE_GRANT_AHEAD_S before its request is due: a burst is built ahead.
    assert TRACE_LEAD_S > TRACE_GRANT_AHEAD_S > GRANT_AHEAD_S
    assert ctrl.wait_s() == pytest.approx(TRACE_LEAD_S - TRACE_GRANT_AHEAD_S)
    for k in range(20):
        t[0] = opened + TRACE_LEAD_S + offsets[k] - 0.05
        g = ctrl.grant()
        assert g is not None and g.seq == k
        assert g.delay_s == pytest.approx(0.05)  # due at the trace's time after the level opened
        if k + 1 < 20:
            assert ctrl.wait_s() == pytest.approx(
                max(0.0, offsets[k + 1] - offsets[k] + 0.05 - TRACE_GRANT_AHEAD_S)
            )


def test_replay_window_and_run_json_description() -> None:
    r = replay_of(_sc(trace_start_s=10, trace_duration_s=20))
    assert r is not None
    assert all(10 <= q.arrival_s < 30 for q in r.requests)
    d = r.describe()
    assert d["format"] == "mooncake" and d["time_unit"] == "ms" and d["block_size"] == 512
    assert d["requests"] == len(r.requests) and d["first_index"] == r.requests[0].index
    assert 0 < d["ideal_hit_rate"] < 1


POOL = IdPool(((1000, 30000),))


@pytest.mark.parametrize("kind", [IDS, TEXT])
def test_trace_prompts_share_blocks_by_hash_id_and_have_the_exact_length(kind: str) -> None:
    src = PromptSource(kind, "t", ids=POOL if kind == IDS else None, overhead=3)
    a = TraceRequest(0, 0.0, 1000, 5, (7, 8))
    b = TraceRequest(1, 1.0, 900, 5, (7, 8))
    c = TraceRequest(2, 1.0, 900, 5, (7, 9))
    d = TraceRequest(3, 1.0, 900, 5, (6, 8))

    def units(r: TraceRequest) -> list[object]:
        p = trace_prompt(src, 0, r, 512)
        return list(p) if isinstance(p, list) else list(p.split())

    pa, pb, pc, pd = units(a), units(b), units(c), units(d)
    assert [len(p) for p in (pa, pb, pc, pd)] == [997, 897, 897, 897]  # input - overhead
    assert pa[:897] == pb  # the same two blocks (b's second one cut to its length)
    assert pa[:512] == pc[:512] and pa[512:897] != pc[512:]  # first block shared, second not
    # a different first block: no prefix shared (its second block is block 8's content, which a prefix
    # cache cannot serve after another first block)
    assert pd[:512] != pa[:512] and pd[512:] == pa[512:897]
    # blocks that cover less than the input (2 x 512 < 1500): the rest is the request's own
    e = TraceRequest(4, 1.0, 1500, 5, (7, 8))
    pe = units(e)
    assert len(pe) == 1497 and pe[:997] == pa
    assert pe[1024:] != units(TraceRequest(5, 1.0, 1500, 5, (7, 8)))[1024:]
    # no blocks: every prompt its own from its first unit
    assert units(TraceRequest(6, 0.0, 100, 5))[:8] != units(TraceRequest(7, 0.0, 100, 5))[:8]
    assert TRACE_N0 > 10**9
    # another repeat (or trace file) salts the blocks: a second replay against the same server does
    # not find the first one's prompts in its prefix cache
    again = trace_prompt(src, 0, a, 512, "t.jsonl#1")
    assert again == trace_prompt(src, 0, a, 512, "t.jsonl#1")  # the same replay, the same tokens
    assert (list(again) if isinstance(again, list) else again.split())[:512] != pa[:512]


def test_due_offsets_scale_the_gaps() -> None:
    trace = read_trace(MOONCAKE, "mooncake")
    w = cut(trace.requests, Window(start_s=30))
    assert due_offsets(w, 4.0)[-1] == pytest.approx((w[-1].arrival_s - w[0].arrival_s) / 4)


# ---------------------------------------------------------------- replays against the simulator

SIM = ("--ttft-ms", "20", "--itl-ms", "1", "--max-model-len", "200000", "--max-running", "256")
SIM_CACHE = (*SIM, "--prefix-cache-tokens", "20000000", "--prefix-cache-block", "16", "--cache-report")


def _replay(sim, out: Path, sim_args: tuple[str, ...], *flags: str) -> Path:
    return _replay_out(sim, out, sim_args, *flags)[0]


def _replay_out(sim, out: Path, sim_args: tuple[str, ...], *flags: str) -> tuple[Path, str]:
    """The run's directory and what the sweep printed on stdout."""
    server = sim(*sim_args)
    res = subprocess.run(
        specload_cmd("sweep", "--host", server.url, "--read-timeout", "60", "--out", str(out), *flags),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    return run_dir, res.stdout


@pytest.mark.xdist_group("trace-replay")
def test_mooncake_window_replayed_by_two_worker_processes(sim, tmp_path: Path) -> None:
    """--processes 2: the master hands out the trace's due times and requests; every request of
    the window goes once, with its row, its lengths exact, due at its trace time (sped up 8x)."""
    run_dir = _replay(
        sim,
        tmp_path,
        SIM_CACHE,
        "--trace",
        MOONCAKE,
        "--trace-format",
        "mooncake",
        "--trace-requests",
        "40",
        "--trace-speedup",
        "8",
        "--max-in-flight",
        "64",
        "--processes",
        "2",
    )
    recs = list(read_records(str(run_dir / "records.jsonl")))
    trace = read_trace(MOONCAKE, "mooncake")
    window = {r.index: r for r in trace.requests[:40]}
    assert sorted(r.trace_index for r in recs) == sorted(window)  # type: ignore[type-var]
    workers = {r.worker for r in recs}
    # Sent by the master's workers (usually both; on a loaded machine one may join after the other took
    # every due request), never by the master itself.
    assert 1 <= len(workers) <= 2 and "local" not in workers
    for r in recs:
        want = window[r.trace_index]  # type: ignore[index]
        assert r.status == "ok"
        assert r.prompt_tokens == want.input_tokens and r.requested_prompt_tokens == want.input_tokens
        assert r.output_tokens == want.output_tokens
    # Due times on the trace's schedule: each worker set t_sched from the master's delay on its own
    # clock (the same machine's), so only the message latency separates them from the trace's: a few
    # ms, up to ~0.1 s on a loaded 2-core machine; the trace's distinct times are >= 0.375 s apart at 8x.
    t0 = min(r.t_sched for r in recs if r.trace_index == 0)  # type: ignore[type-var]
    off = sorted(
        abs(r.t_sched - t0 - window[r.trace_index].arrival_s / 8)  # type: ignore[operator,index]
        for r in recs
    )
    assert off[len(off) // 2] < 0.05 and off[-1] < 0.3, off
    meta = read_run_meta(run_dir)
    assert meta.trace["requests"] == 40 and meta.trace["speedup"] == 8.0


@pytest.mark.xdist_group("trace-replay")
def test_shared_hash_ids_hit_the_servers_prefix_cache_as_the_trace_says(sim, tmp_path: Path) -> None:
    """A generic trace in which later requests repeat earlier blocks: the simulator's prefix cache
    serves what the trace's ideal hit rate says (less only what the server's 16-token blocks and the
    prompt's overhead cut off, and requests that overlapped their sharer's prefill)."""
    rows = []
    for i in range(24):
        group = i % 3
        rows.append(
            {
                "t": i * 150,
                "in": 900,
                "out": 4,
                "h": [100 + group, 200 + group, 1000 + i],
            }  # 2 of 3 blocks shared
        )
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_dir, printed = _replay_out(
        sim,
        tmp_path / "out",
        SIM_CACHE,
        "--trace",
        str(p),
        "--trace-format",
        "jsonl",
        "--trace-time-unit",
        "ms",
        "--trace-time-field",
        "t",
        "--trace-input-field",
        "in",
        "--trace-output-field",
        "out",
        "--trace-hash-field",
        "h",
        "--trace-block-size",
        "300",
        "--format",
        "json",
    )
    recs = list(read_records(str(run_dir / "records.jsonl")))
    assert len(recs) == 24 and all(r.status == "ok" and r.prompt_tokens == 900 for r in recs)
    served = sum(r.cached_tokens or 0 for r in recs) / sum(r.prompt_tokens or 0 for r in recs)
    ideal = read_run_meta(run_dir).trace["ideal_hit_rate"]
    assert ideal == pytest.approx(21 * 600 / (24 * 900))  # all but each group's first share 600 tokens
    assert ideal - 0.03 <= served <= ideal
    report = (run_dir / "report.md").read_text()
    assert (
        "## Trace replay" in report
        and f"ideal (an unbounded cache, requests in order): {ideal:.1%}" in report
    )
    assert "though the scenario asked for no shared prefix" not in report  # (the trace's blocks are shared)
    _check_trace_json(run_dir, printed, recs, served)


def _check_trace_json(run_dir: Path, printed: str, recs: list, served: float) -> None:
    """The sweep's ``--format json`` and ``specload report --format json`` carry the report's trace
    figures, each checked against the records (and the trace file's rows: 24 of 900 in, 4 out)."""
    (level,) = json.loads(printed)
    t = level["trace"]
    res = subprocess.run(
        specload_cmd("report", str(run_dir), "--format", "json", "--no-write"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert [lv["trace"] for lv in json.loads(res.stdout)] == [t]
    lag_ms = np.array([(r.t_send - r.t_sched) * 1e3 for r in sorted(recs, key=lambda r: r.t_sched)])
    assert t["late_p50_ms"] == pytest.approx(float(np.percentile(lag_ms, 50)))
    assert t["late_p99_ms"] == pytest.approx(float(np.percentile(lag_ms, 99)))
    assert t["late_max_ms"] == pytest.approx(float(lag_ms.max()))
    assert t["late_ms"] == pytest.approx(list(lag_ms)) and len(t["due_s"]) == 24
    assert t["late_over_ms"] == int((lag_ms > t["kept_p99_threshold_ms"]).sum())
    # Arrivals: every one of the window's 24 requests due and sent once, counted in the bins.
    assert (t["window"], t["sent"], t["failed"]) == (24, 24, 0)
    assert sum(t["due_per_s"]) * t["bin_s"] == pytest.approx(24)
    assert sum(t["sent_per_s"]) * t["bin_s"] == pytest.approx(24)
    # The trace's rows are 150 ms apart: the due times are too, from the first.
    assert t["due_s"] == pytest.approx([0.15 * i for i in range(24)], abs=0.02)
    # The server's hit rate next to the trace's ideal one (21 of 24 requests share 600 of 900 tokens).
    assert t["ideal_hit_rate"] == pytest.approx(21 * 600 / (24 * 900))
    assert t["server_hit_rate"] == pytest.approx(served, abs=0.01)
    assert t["server_hit_source"] is not None
    lengths = t["lengths"]
    assert lengths["input (trace)"] == {"n": 24, "mean": 900, "p50": 900, "p90": 900, "p99": 900, "max": 900}
    assert lengths["input (server count)"]["mean"] == 900 and lengths["output (trace)"]["max"] == 4
    assert lengths["output (received)"]["n"] == 24
    assert lengths["output (received)"]["mean"] == pytest.approx(np.mean([r.output_tokens for r in recs]))
    meta = t["meta"]  # the trace's description, as run.json has it
    assert meta == read_run_meta(run_dir).trace and meta["file"] == "t.jsonl" and meta["block_size"] == 300


class _WordIds:
    """A tokenizer that gives each word its own id (a stand-in for a server's /tokenize)."""

    name = "words"

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        return [self.vocab.setdefault(w, len(self.vocab)) for w in text.split()]


def test_real_text_trace_prompts_are_windows_of_the_real_text() -> None:
    from specload.workload.traceprompt import real_tape, real_trace_prompt

    tok = _WordIds()
    tape = real_tape(tok, 0)
    assert len(tape.code) > 5000 and len(tape.prose) > 20000
    a = TraceRequest(0, 0.0, 1030, 5, (7, 8, 9))
    b = TraceRequest(1, 0.0, 700, 5, (7, 8))
    pa, pb = real_trace_prompt(tape, 0, a, 512, 6), real_trace_prompt(tape, 0, b, 512, 6)
    assert len(pa) == 1024 and len(pb) == 694  # input less the server's overhead
    assert pa[:694] == pb  # blocks 7 and 8 the same text
    # each block is a stretch of the real text as tokenized, not a draw: block 7's ids appear in order
    src = tape.source(7)
    joined = ",".join(map(str, src))
    assert ",".join(map(str, pa[:512])) in joined
    assert tape.source(5) is tape.code and tape.source(7) is tape.prose
