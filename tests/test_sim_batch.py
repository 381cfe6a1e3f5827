"""The batch engine: step-time model, admission, speculation, chunked prefill, cancellation, presets.

Most checks drive :class:`BatchScheduler` in virtual time (no clock, exact arithmetic); a few run
:class:`BatchEngine` in real time at a small time scale, and one starts the simulator process.
"""

from __future__ import annotations

import http.client
import json
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import gevent
import pytest

from specload.client.introspect import parse_metrics
from specload.sim.app import SimApp
from specload.sim.batch import (
    DONE,
    PREFILL,
    QUEUED,
    BatchEngine,
    BatchParams,
    BatchRequest,
    BatchScheduler,
    Table,
    load_preset,
    params_from_dict,
)
from specload.sim.cli import build_engine, build_parser
from specload.sim.process import stop_process
from specload.sim.timing import ADMITTED, Chunk, clock
from tests.rundelay import RunDelay

LATE_MAX = 0.010  # real-time tolerance on a quiet box, plus the measured run-queue wait (tests/rundelay.py)


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    """One request first, so that one-time setup (the hub's timerfd, imports) delays no timed test."""
    eng = BatchEngine(params(decode_ms=[[1, 1.0]]))
    assert sum(c.tokens for c in eng.generate(1, 3)) == 3


def params(**kw: object) -> BatchParams:
    base: dict[str, object] = {"decode_ms": [[1, 10.0]], "chunked_prefill_tokens": 8192}
    base.update(kw)
    return params_from_dict(base, where="test")


def drive(
    sched: BatchScheduler, reqs: list[BatchRequest], t0: float = 0.0
) -> dict[int, list[tuple[float, int, int]]]:
    """Run steps back to back from t0 until nothing is left: per request, (time, tokens, verify) per step."""
    for r in reqs:
        sched.submit(r)
    out: dict[int, list[tuple[float, int, int]]] = {id(r): [] for r in reqs}
    t = t0
    while sched.queue or sched.running:
        step = sched.begin_step(t)
        assert step is not None
        t = step.end
        for r in sched.end_step():
            out[id(r)].append((t, r.pending_tokens, r.pending_verify))
            r.pending_tokens = r.pending_verify = 0
    return out


# ---------------------------------------------------------------------------------------------------
# Step time


def test_table_interpolation_and_extrapolation() -> None:
    t = Table([[1, 10], [4, 16], [16, 22]])
    assert t(1) == 10 and t(4) == 16 and t(16) == 22
    assert t(2) == pytest.approx(12) and t(10) == pytest.approx(19)
    assert t(28) == pytest.approx(28)  # past the last point: the last segment, extended (0.5 ms per request)
    assert t(0.5) == 10  # below the first point: the first value
    assert Table([[8, 5]])(100) == 5
    for bad in ([], [[1, 2, 3]], [[4, 1], [2, 3]], [[1, 1], [1, 2]], [[0, 1]], [[1, -1]]):
        with pytest.raises(ValueError):
            Table(bad)


def test_step_time_formula_and_time_scale() -> None:
    p = params(
        decode_ms=[[1, 10], [9, 18]],
        ctx_us_per_token=0.5,
        prefill_us_per_token=100,
        speculative_algorithm="NEXTN",
        spec_num_steps=2,
        verify_ms=[[1, 12], [9, 28]],
        draft_ms=[[1, 1], [9, 3]],
    )
    # speculative: verify_ms(5) = 20, plus k * draft_ms(5) = 2 * 2; ctx 4000 * 0.5 us; prefill 1000 * 100 us
    expected_ms = 20 + 4 + 2 + 100
    assert BatchScheduler(p).step_seconds(5, 4000, 1000) == pytest.approx(expected_ms / 1e3)
    assert BatchScheduler(p, time_scale=0.25).step_seconds(5, 4000, 1000) == pytest.approx(expected_ms / 4e3)
    base = params(decode_ms=[[1, 10], [9, 18]], ctx_us_per_token=0.5, prefill_us_per_token=100)
    assert BatchScheduler(base).step_seconds(5, 4000, 1000) == pytest.approx((14 + 2 + 100) / 1e3)
    # verify_ms defaults to decode_ms
    nov = params(decode_ms=[[1, 10]], speculative_algorithm="NEXTN", spec_num_steps=1, draft_ms=[[1, 3]])
    assert BatchScheduler(nov).step_seconds(1, 0, 0) == pytest.approx(0.013)


def test_decode_steps_follow_the_batch_size_and_finish_exactly() -> None:
    p = params(decode_ms=[[1, 10], [2, 14]], prefill_us_per_token=1000)
    s = BatchScheduler(p)
    a, b = BatchRequest(5, 3, 0.0), BatchRequest(5, 3, 0.0)
    out = drive(s, [a, b])
    # step 1 prefills both (14 + 10 ms) and gives each its first token; then 14 ms steps
    assert [x[0] for x in out[id(a)]] == pytest.approx([0.024, 0.038, 0.052])
    assert [x[1:] for x in out[id(a)]] == [(1, 1)] * 3
    assert (s.kv_used, len(s.running), a.state, b.state) == (0, 0, DONE, DONE)


# ---------------------------------------------------------------------------------------------------
# Admission


def test_admission_fifo_under_max_running() -> None:
    s = BatchScheduler(params(max_running_requests=2))
    reqs = [BatchRequest(1, n, 0.0) for n in (3, 10, 2, 2)]
    out = drive(s, reqs)
    starts = [r.admitted_at for r in reqs]
    assert starts[0] == starts[1] == 0.0
    end0 = out[id(reqs[0])][-1][0]
    assert starts[2] == pytest.approx(end0)  # the first slot to free goes to request 2 ...
    assert starts[3] == pytest.approx(out[id(reqs[2])][-1][0])  # ... and request 3 waits for the next one
    assert starts[3] > starts[2]


def test_admission_kv_budget_blocks_the_head_and_never_overtakes() -> None:
    s = BatchScheduler(params(kv_budget_tokens=1000, max_running_requests=10))
    big0 = BatchRequest(400, 200, 0.0)  # reserves 600
    big1 = BatchRequest(300, 200, 0.0)  # 500: does not fit next to big0
    small = BatchRequest(10, 5, 0.0)  # 15: would fit, but must not overtake big1
    for r in (big0, big1, small):
        s.submit(r)
    s.begin_step(0.0)
    assert (big0.state, big1.state, small.state) == (PREFILL, QUEUED, QUEUED)
    assert s.kv_used == 600 and len(s.queue) == 2
    while big0.state != DONE:
        s.end_step()
        s.begin_step(1.0)
    # big0 finished at the end of the last step; the next step admits big1 and small together
    assert big1.state == PREFILL and small.state == PREFILL
    assert big1.admitted_at == small.admitted_at and s.kv_used == 515


def test_speculation_shrinks_the_kv_budget_and_replaces_the_cap() -> None:
    p = params(
        max_running_requests=256,
        kv_budget_tokens=300_000,
        speculative_algorithm="NEXTN",
        spec_num_steps=1,
        draft_kv_tokens=80_000,
        spec_max_running_requests=48,
    )
    s = BatchScheduler(p)
    assert (s.max_running, s.kv_budget) == (48, 220_000)
    for _ in range(50):
        s.submit(BatchRequest(10, 10, 0.0))
    s.begin_step(0.0)
    assert (len(s.running), len(s.queue)) == (48, 2)
    # without speculation the spec_* fields do not apply
    b = BatchScheduler(params(max_running_requests=256, kv_budget_tokens=300_000, draft_kv_tokens=80_000))
    assert (b.max_running, b.kv_budget) == (256, 300_000)


def test_late_arrival_joins_the_step_in_progress() -> None:
    s = BatchScheduler(params(decode_ms=[[1, 10], [2, 20]], prefill_us_per_token=1000))
    s.submit(BatchRequest(0, 5, 0.0))
    step = s.begin_step(1.0)
    assert step is not None and step.end == pytest.approx(1.010)
    early = BatchRequest(5, 5, 0.999)  # arrived before the step began, handed over during it
    assert s.submit(early) is True and early.admitted_at == 1.0
    assert step.end == pytest.approx(1.0 + 0.020 + 0.005)  # batch of 2, plus its 5 prefill tokens
    late = BatchRequest(5, 5, 1.001)
    assert s.submit(late) is False and late.state == QUEUED


# ---------------------------------------------------------------------------------------------------
# Speculation


def spec_params(k: int, p: float, seed: int = 0) -> BatchParams:
    return params(speculative_algorithm="NEXTN", spec_num_steps=k, spec_accept_prob=p, seed=seed)


def test_speculation_p1_gives_k_plus_1_tokens_per_verify_step() -> None:
    s = BatchScheduler(spec_params(3, 1.0))
    r = BatchRequest(10, 18, 0.0)
    steps = drive(s, [r])[id(r)]
    # first token from the prefill step, then 4 per step, the last step capped at what is left
    assert [n for _, n, _ in steps] == [1, 4, 4, 4, 4, 1]
    assert all(v == 1 for _, _, v in steps)
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (5, 15, 12)
    assert s.accept_length == pytest.approx(1 + 12 / 5)


def test_speculation_rng_is_seeded_and_accounting_adds_up() -> None:
    def run(seed: int) -> list[int]:
        s = BatchScheduler(spec_params(3, 0.7, seed))
        reqs = [BatchRequest(10, 300, 0.0) for _ in range(4)]
        out = drive(s, reqs)
        for r in reqs:
            got = out[id(r)]
            assert sum(n for _, n, _ in got) == 300
            assert sum(v for _, _, v in got) == len(got)  # one verify step per step the request was in
            assert all(1 <= n <= 4 for _, n, _ in got)
        assert s.num_draft_tokens == 3 * s.num_drafts
        assert s.num_accepted_tokens == 4 * 300 - 4 - s.num_drafts  # every token but the first and bonus ones
        return [n for r in reqs for _, n, _ in out[id(r)]]

    a, b, c = run(1), run(1), run(2)
    assert a == b and a != c
    decode = a[1:]  # mean accepted per step for k=3, p=0.7: p + p^2 + p^3 = 1.533
    assert 2.2 < sum(decode) / len(decode) < 2.9


def test_speculation_p0_is_one_token_per_step() -> None:
    s = BatchScheduler(spec_params(2, 0.0))
    r = BatchRequest(10, 6, 0.0)
    assert [n for _, n, _ in drive(s, [r])[id(r)]] == [1] * 6
    assert s.accept_length == 1.0


# ---------------------------------------------------------------------------------------------------
# Chunked prefill


def test_chunked_prefill_spreads_a_long_prompt_and_shares_the_budget() -> None:
    s = BatchScheduler(params(decode_ms=[[1, 10]], prefill_us_per_token=1, chunked_prefill_tokens=8192))
    long, short = BatchRequest(20_000, 2, 0.0), BatchRequest(100, 2, 0.0)
    s.submit(long)
    s.submit(short)
    chunks = []
    firsts: dict[str, float] = {}
    t = 0.0
    while s.running or s.queue:
        step = s.begin_step(t)
        assert step is not None
        chunks.append(step.prefill_tokens)
        t = step.end
        for r in s.end_step():
            firsts.setdefault("long" if r is long else "short", t)
    # 8192 + 8192 for the long prompt; the third step finishes it (3616) and prefills the short one
    assert chunks[:3] == [8192, 8192, 3616 + 100]
    assert firsts["long"] == firsts["short"] == pytest.approx(0.010 * 3 + 20_100 / 1e6)
    assert long.prefilled == 20_000 and long.state == DONE


def test_admitted_requests_wait_for_prefill_budget_while_running() -> None:
    s = BatchScheduler(params(chunked_prefill_tokens=1000))
    reqs = [BatchRequest(1000, 1, 0.0) for _ in range(3)]
    for r in reqs:
        s.submit(r)
    step = s.begin_step(0.0)
    assert step is not None and step.batch == [reqs[0]] and len(s.running) == 3  # admitted, one prefilled
    s.end_step()
    step = s.begin_step(step.end)
    assert step is not None and step.batch == [reqs[1]]


# ---------------------------------------------------------------------------------------------------
# Cancellation


def test_cancel_frees_kv_and_slot_in_queue_running_and_mid_step() -> None:
    s = BatchScheduler(params(max_running_requests=1, kv_budget_tokens=10_000))
    a, b = BatchRequest(100, 50, 0.0), BatchRequest(100, 50, 0.0)
    s.submit(a)
    s.submit(b)
    s.begin_step(0.0)
    assert s.kv_used == 150 and len(s.queue) == 1
    s.cancel(b)  # queued
    assert len(s.queue) == 0 and b.state == DONE
    s.cancel(a)  # running, in the current step's batch
    assert s.kv_used == 0 and not s.running
    assert s.end_step() == []  # the step ends without handing a token to the cancelled request
    s.cancel(a)  # idempotent
    assert s.kv_used == 0


def _until(pred: Any, timeout: float = 10.0) -> None:
    """Yield to the engine's greenlets until ``pred()`` holds (a fixed sleep is a guess at the load)."""
    with gevent.Timeout(timeout, AssertionError(f"not within {timeout:g} s")):
        while not pred():
            gevent.sleep(0.001)


def test_engine_generator_close_frees_kv() -> None:
    eng = BatchEngine(params(decode_ms=[[1, 2.0]], max_running_requests=1), time_scale=1.0)
    gen = eng.generate(100, 1000)
    assert next(gen) == ADMITTED
    assert next(gen).tokens >= 1
    waiting = gevent.spawn(lambda: list(eng.generate(10, 2)))
    _until(lambda: eng.queued == 1)  # the engine's loop has seen it (a loaded machine runs it late)
    assert (eng.running, eng.queued, eng.sched.kv_used) == (1, 1, 1100)
    gen.close()  # client gone
    assert eng.running == 0 and eng.sched.kv_used == 0
    got = waiting.get(timeout=2)
    assert got[0] == ADMITTED and sum(c.tokens for c in got) == 2
    assert (eng.running, eng.queued, eng.sched.kv_used) == (0, 0, 0)
    killed = gevent.spawn(lambda: list(eng.generate(10, 10_000)))
    _until(lambda: eng.running == 1)
    killed.kill()
    assert (eng.running, eng.queued, eng.sched.kv_used) == (0, 0, 0)


# ---------------------------------------------------------------------------------------------------
# Real time


def test_engine_real_time_steps_on_absolute_deadlines_from_arrival() -> None:
    scale = 0.5
    p = params(
        decode_ms=[[1, 20.0]], prefill_us_per_token=100, speculative_algorithm="NEXTN", spec_num_steps=2
    )
    eng = BatchEngine(p, time_scale=scale)
    waited = RunDelay()
    arrival = clock() - 0.004  # the HTTP layer saw the request 4 ms ago
    got = []
    for chunk in eng.generate(100, 10, arrival=arrival):
        got.append((clock(), chunk))
    late_max = LATE_MAX + waited.s
    first = arrival + (0.020 + 0.010) * scale  # step + 100 prefill tokens, from the arrival
    due = [first + i * 0.020 * scale for i in range(4)]
    steps = [Chunk(1, 1), *[Chunk(3, 1, (2,))] * 3]  # 2 drafts accepted per step
    chunks = [c for _, c in got]
    assert chunks[0] == ADMITTED
    if chunks[1:] != steps:
        # a reader a step (10 ms) late gets the steps that came due meanwhile in one chunk: it
        # waited for a CPU half a step at least
        assert waited.s > 0.010 / 2, (chunks, waited.s)
        assert sum(c.tokens for c in chunks) == 10 and sum(c.verify_steps for c in chunks) == 4, chunks
        assert [a for c in chunks for a in c.accepted] == [2, 2, 2], chunks
    done = 0
    for t, c in got[1:]:  # a chunk goes when its last step is due
        done += c.verify_steps
        assert due[done - 1] - 0.0005 <= t <= due[done - 1] + late_max, ((t - due[done - 1]) * 1e3, late_max)
    assert eng.server_info()["speculative_num_draft_tokens"] == 3


def test_engine_batches_simultaneous_requests_in_one_step() -> None:
    eng = BatchEngine(params(decode_ms=[[1, 10.0], [8, 24.0]]), time_scale=1.0)
    times: list[list[float]] = [[] for _ in range(8)]

    tokens: list[list[int]] = [[] for _ in range(8)]

    def run(i: int) -> None:
        for c in eng.generate(1, 5, arrival=t0):
            times[i].append(clock())
            tokens[i].append(c.tokens)

    waited = RunDelay()
    t0 = clock()
    gevent.joinall([gevent.spawn(run, i) for i in range(8)], timeout=5, raise_error=True)
    late_max = LATE_MAX + waited.s
    for ts, ns in zip(times, tokens, strict=True):  # ADMITTED + 5 tokens, every step 24 ms for all eight
        assert ns[0] == 0 and sum(ns) == 5, ns
        # one token a chunk, unless a reader kept waiting for a CPU got the steps due meanwhile at once
        # (to get two steps in one chunk, the reader came a step late: it waited half a step at least)
        assert ns == [0, 1, 1, 1, 1, 1] or waited.s > 0.024 / 2, (ns, waited.s)
        done = 0
        for n, t in zip(ns[1:], ts[1:], strict=True):  # a chunk goes when its last step is due
            done += n
            due = t0 + done * 0.024
            assert due - 0.0005 <= t <= due + late_max, (t - due, late_max)
    assert eng.running == 0 and eng.queued == 0


# ---------------------------------------------------------------------------------------------------
# Presets, CLI, server_info, metrics


def test_presets_load_and_overrides(tmp_path: Path) -> None:
    b, m = load_preset("baseline"), load_preset("mtp")
    assert b.name == "baseline" and not b.speculative
    assert m.speculative_algorithm == "NEXTN" and m.spec_num_steps == 1 and m.effective_max_running == 48
    assert m.effective_kv_budget < b.effective_kv_budget
    o = load_preset("mtp", ["spec_max_running_requests=128", "spec_accept_prob=0.9", "decode_ms=[[1, 5]]"])
    assert (o.effective_max_running, o.spec_accept_prob, o.decode_ms) == (128, 0.9, ((1.0, 5.0),))
    f = tmp_path / "mine.toml"
    f.write_text("decode_ms = [[1, 7.5]]\nmax_running_requests = 3\n")
    assert load_preset(str(f)).name == "mine" and load_preset(str(f)).max_running_requests == 3
    for bad in (["nope=1"], ["spec_accept_prob=2"], ["max_running_requests"]):
        with pytest.raises(ValueError):
            load_preset("mtp", bad)
    with pytest.raises(ValueError):
        load_preset("no-such-preset")


def test_cli_builds_the_batch_engine_and_keeps_fixed_by_default() -> None:
    assert build_parser().parse_args([]).engine == "fixed"
    args = build_parser().parse_args(["--engine", "batch", "--preset", "mtp", "--time-scale", "0.5"])
    eng = build_engine(args)
    assert isinstance(eng, BatchEngine) and eng.time_scale == 0.5 and eng.speculative
    info = eng.server_info()
    assert info["max_running_requests"] == 48 and info["speculative_algorithm"] == "NEXTN"
    assert (
        info["speculative_num_steps"],
        info["speculative_num_draft_tokens"],
        info["speculative_eagle_topk"],
    ) == (
        1,
        2,
        1,
    )
    assert info["sim_engine"] == "batch" and info["sim_preset"] == "mtp"
    assert info["max_total_num_tokens"] == load_preset("mtp").effective_kv_budget
    base = build_engine(build_parser().parse_args(["--engine", "batch"])).server_info()
    assert base["speculative_algorithm"] is None and base["sim_preset"] == "baseline"
    with pytest.raises(ValueError):
        build_engine(build_parser().parse_args(["--preset", "mtp"]))  # a preset without --engine batch


def test_vllm_style_spec_counters_parse() -> None:
    eng = BatchEngine(spec_params(2, 1.0), time_scale=1.0)
    got = list(eng.generate(10, 7))  # 1 token from the prefill step, then 3 per step
    assert sum(c.tokens for c in got) == 7 and sum(c.verify_steps for c in got) == 3
    app = SimApp(eng, metrics_style="vllm")
    text = app.metrics_text()
    assert "# TYPE vllm:spec_decode_num_drafts_total counter" in text
    m = parse_metrics(text)
    assert (m["spec_num_drafts"], m["spec_num_draft_tokens"], m["spec_num_accepted_tokens"]) == (2, 4, 4)
    assert "sglang:spec_accept_length" in SimApp(eng).metrics_text()
    assert "spec_" not in SimApp(BatchEngine(params())).metrics_text()  # not speculative: no spec metrics


# ---------------------------------------------------------------------------------------------------
# The simulator process


def test_simulator_process_with_the_mtp_preset(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "specload.sim",
        "--port",
        "0",
        "--engine",
        "batch",
        "--preset",
        "mtp",
        "--time-scale",
        "0.05",
    ]
    with open(tmp_path / "stderr.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 15)
        line = proc.stdout.readline().decode() if ready else ""  # type: ignore[union-attr]
        assert "listening on http://127.0.0.1:" in line, (tmp_path / "stderr.log").read_text()
        port = int(line.rsplit(":", 1)[1])

        def get(path: str) -> str:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", path)
            r = conn.getresponse()
            body = r.read().decode()
            conn.close()
            assert r.status == 200
            return body

        info = json.loads(get("/get_server_info"))
        assert info["sim_engine"] == "batch" and info["sim_preset"] == "mtp"
        assert info["max_running_requests"] == 48 and info["internal_states"][0]["max_running_requests"] == 48
        assert info["speculative_algorithm"] == "NEXTN" and info["speculative_num_draft_tokens"] == 2
        assert info["speculative_eagle_topk"] == 1 and info["max_total_num_tokens"] > 0

        def generate(n: int) -> list[dict[str, Any]]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            body = {"input_ids": list(range(1000)), "sampling_params": {"max_new_tokens": n}, "stream": True}
            conn.request(
                "POST", "/generate", body=json.dumps(body), headers={"Content-Type": "application/json"}
            )
            r = conn.getresponse()
            assert r.status == 200
            events = [json.loads(ln[6:]) for ln in r.read().decode().splitlines() if ln.startswith("data: {")]
            conn.close()
            return events

        generate(1)  # the first request of a fresh process meets one-time setup costs
        waited = RunDelay([proc.pid])
        events = generate(41)
        counts = [e["meta_info"]["completion_tokens"] for e in events]
        # The first token alone, then 2 per verify step (accept rate 1) in one event; a handler that
        # falls behind sends the tokens of several steps together, so only the parity is exact (and
        # one kept waiting for a CPU for the whole request may send them all at once).
        assert counts[-1] == 41 and counts[0] % 2 == 1, counts
        assert len(counts) >= 3 or waited.s > 0, (counts, waited.s)
        deltas = [b - a for a, b in zip(counts, counts[1:], strict=False)]
        assert all(d > 0 and d % 2 == 0 for d in deltas), counts
        assert events[-1]["meta_info"]["spec_verify_ct"] == 21  # the prefill step and 20 verify steps
        assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"

        metrics = get("/metrics")
        assert 'sglang:spec_accept_length{model_name="specload-sim"} 2.0' in metrics
        assert 'sglang:num_running_reqs{model_name="specload-sim"} 0' in metrics
    finally:
        stop_process(proc, 5)


def test_queued_counts_only_requests_the_last_admission_left_waiting() -> None:
    s = BatchScheduler(params(max_running_requests=1))
    s.submit(BatchRequest(1, 3, 0.0))
    s.begin_step(0.0)
    s.submit(BatchRequest(1, 3, 0.005))  # arrives during the step: the scheduler has not decided yet
    assert (len(s.queue), s.waiting()) == (1, 0)
    s.end_step()
    s.begin_step(0.010)  # held back by the cap: now it is queued, as SGLang's gauge would say
    assert s.waiting() == 1
