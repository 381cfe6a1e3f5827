"""Reasoning streams: chat deltas with ``reasoning`` (vLLM) or ``reasoning_content`` (SGLang, older
vLLM) are reasoning, not answer. TTFT stays the first token of any kind; the record keeps the first
answer token's time and the reasoning tokens (the server's count, else the events counted), and the
report gives each level's time to the first answer and its answer tok/s (specload.analysis.reasoning)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from specload.analysis.columns import LevelColumns
from specload.analysis.reasoning import reasoning_stats
from specload.analysis.run import load_run
from specload.client.backends import get_backend
from specload.client.http import make_client, warm_up
from specload.client.stream import RequestSpec, stream_request
from specload.core.records import (
    OK,
    PHASE_MEASURE,
    SRC_CHUNKS,
    SRC_USAGE,
    RequestRecord,
    make_record,
)
from specload.present.report import render_report
from specload.sim.process import SimProcess
from tests.fixtures.by_records import summarize_level
from tests.fixtures.sim_sweep import sim_sweep
from tests.rundelay import RunDelay

T0 = 1_800_000_000.0


def ev(delta: dict[str, object], finish: str | None = None, usage: dict[str, object] | None = None) -> bytes:
    choices = [{"index": 0, "delta": delta, "finish_reason": finish}]
    return orjson.dumps({"choices": choices, **({"usage": usage} if usage else {})})


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_the_chat_parser_tells_reasoning_from_answer(field: str) -> None:
    p = get_backend("chat").parser()
    p.text = []
    assert p.feed(ev({"role": "assistant", "content": ""})) == 0  # role-only: no token
    assert p.feed(ev({field: " Let"})) == 1 and p.in_reasoning
    assert p.feed(ev({field: " me", "content": None})) == 1 and p.in_reasoning
    assert p.feed(ev({"content": " Hi"})) == 1 and not p.in_reasoning
    assert p.feed(ev({"content": " there"}, "length")) == 1
    assert p.reasoning_events == 2 and p.reasoning_tokens is None
    assert p.text == [" Hi", " there"]  # the answer's text only (a conversation resends it)
    usage = {"prompt_tokens": 3, "completion_tokens": 4, "completion_tokens_details": {"reasoning_tokens": 2}}
    p.feed(orjson.dumps({"choices": [], "usage": usage}))
    assert p.reasoning_tokens == 2 and p.output_tokens == 4


def test_a_delta_with_the_end_of_the_reasoning_and_the_answer_starts_the_answer() -> None:
    # vLLM's reasoning parser returns the delta holding the end-of-think marker with both fields;
    # when it is the stream's first, the stream still had reasoning and its answer begins there.
    p = get_backend("chat").parser()
    p.text = []
    assert p.feed(ev({"reasoning": " so", "content": " Yes"})) == 1
    assert p.reasoning_events == 1 and not p.in_reasoning and p.text == [" Yes"]


def test_a_plain_chat_stream_has_no_reasoning() -> None:
    p = get_backend("chat").parser()
    assert p.feed(ev({"content": " Hi"})) == 1
    assert p.reasoning_events == 0 and not p.in_reasoning


def _spec(n: int) -> RequestSpec:
    return RequestSpec(
        level=0,
        concurrency=1,
        phase=PHASE_MEASURE,
        seq=0,
        repeat=0,
        requested_output_tokens=n,
        requested_prompt_tokens=8,
    )


def _one(url: str, backend: str, n: int) -> RequestRecord:
    client = make_client(url, 5.0, 2.0)
    warm_up(client)
    try:
        b = get_backend(backend)
        prompt: list[int] | str = "a b c d" if backend == "chat" else [1, 2, 3, 4]
        body = b.body(prompt, n, "specload-sim", 0.0, {})
        return stream_request(
            client, b.path, body, {"Content-Type": "application/json"}, b, _spec(n), "w", 5.0
        )
    finally:
        client.close()


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_a_reasoning_stream_from_the_simulator(sim: Callable[..., SimProcess], field: str) -> None:
    s = sim("--ttft-ms", "40", "--itl-ms", "10", "--reasoning-tokens", "8", "--reasoning-field", field)
    waited = RunDelay([s.proc.pid])
    rec = _one(s.url, "chat", 20)
    late = waited.s  # a first token sent or read late shortens the gap to the answer by as much
    assert rec.status == OK and rec.output_tokens == 20
    assert rec.reasoning_tokens == 8 and rec.reasoning_tokens_source == SRC_USAGE
    assert rec.t_first is not None and rec.t_first_answer is not None and rec.ttft_s is not None
    # The answer's first token is the 9th: 8 ITL after the first token (reasoning counts in TTFT).
    assert 0.030 <= rec.ttft_s <= 0.2 + late
    assert 0.070 - late <= rec.t_first_answer - rec.t_first <= 0.2 + late, late
    # The raw events: reasoning deltas first, named as asked, then content; usage counts them.
    req = urllib.request.Request(
        s.url + "/v1/chat/completions",
        data=json.dumps(
            {
                "model": "specload-sim",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 10,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        lines = [
            x[6:] for x in r.read().decode().splitlines() if x.startswith("data: ") and x != "data: [DONE]"
        ]
    events = [json.loads(x) for x in lines]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    kinds = ["role" if "role" in d else next(iter(d)) for d in deltas]
    assert kinds == ["role"] + [field] * 8 + ["content"] * 2
    assert events[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 8}


def _raw_chat(url: str, max_tokens: int) -> list[dict[str, object]]:
    """A streamed chat answer's events (usage included), as the server sent them."""
    body = {
        "model": "specload-sim",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(
        url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        lines = r.read().decode().splitlines()
    return [json.loads(x[6:]) for x in lines if x.startswith("data: ") and x != "data: [DONE]"]


# A chunk that crosses the end of the reasoning, as each engine's reasoning parser splits it: vLLM
# returns one delta with both fields, SGLang a reasoning_content chunk and then a content chunk.
SPLIT = {
    "reasoning": [{"reasoning": 1}, {"reasoning": 3}, {"reasoning": 3}, {"reasoning": 1, "content": 2}],
    "reasoning_content": [
        {"reasoning_content": 1},
        {"reasoning_content": 3},
        {"reasoning_content": 3},
        {"reasoning_content": 1},
        {"content": 2},
    ],
}


@pytest.mark.parametrize("field", sorted(SPLIT))
def test_a_chunk_across_the_end_of_the_reasoning_is_split_as_the_engine_splits_it(
    sim: Callable[..., SimProcess], field: str
) -> None:
    # Events of 1, 3, 3, 3, 3 tokens: the fourth (tokens 8-10) holds the 8th, the last of the reasoning.
    s = sim(
        "--ttft-ms",
        "5",
        "--itl-ms",
        "1",
        "--tokens-per-chunk",
        "3",
        "--reasoning-tokens",
        "8",
        "--reasoning-field",
        field,
    )
    events = _raw_chat(s.url, 13)
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]][1:]  # after the role-only one
    words = [{k: len(v.split()) for k, v in d.items() if v} for d in deltas]
    assert words == SPLIT[field] + [{"content": 3}]
    assert events[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 8}
    # The client: exactly the reasoning asked for, and the answer begins in the split chunk.
    rec = _one(s.url, "chat", 13)
    assert rec.status == OK and rec.output_tokens == 13 and rec.reasoning_tokens == 8
    assert rec.t_first_answer is not None and rec.t_first is not None
    assert rec.t_first_answer > rec.t_first


def test_completions_and_plain_chat_records_have_no_reasoning(sim: Callable[..., SimProcess]) -> None:
    s = sim("--ttft-ms", "5", "--itl-ms", "1", "--reasoning-tokens", "3")
    plain = _one(s.url, "openai", 6)  # /v1/completions streams no reasoning
    assert plain.status == OK and plain.reasoning_tokens is None and plain.t_first_answer is None
    s2 = sim("--ttft-ms", "5", "--itl-ms", "1")
    chat = _one(s2.url, "chat", 6)
    assert chat.status == OK and chat.reasoning_tokens is None and chat.t_first_answer is None


def rec(
    seq: int, t_send: float, ttft: float, answer: float | None, n: int, reasoning: int | None, **kw: object
) -> RequestRecord:
    t_first = t_send + ttft
    t_last = t_send + ttft + 0.01 * (n - 1)
    return make_record(
        t_send=t_send,
        t_first=t_first,
        t_last=t_last,
        t_end=t_last,
        output_tokens=n,
        level=0,
        concurrency=2,
        phase=PHASE_MEASURE,
        seq=seq,
        backend="chat",
        status=kw.get("status", OK),
        reason=None,
        http_status=200,
        output_tokens_source=SRC_USAGE,
        prompt_tokens=8,
        requested_output_tokens=n,
        requested_prompt_tokens=8,
        chunks=n,
        itl_max_s=0.01,
        spec_verify_ct=None,
        worker="w",
        t_first_answer=None if answer is None else t_send + answer,
        reasoning_tokens=reasoning,
        reasoning_tokens_source=None if reasoning is None else kw.get("source", SRC_USAGE),
    )


def test_level_figures_by_hand() -> None:
    # t_last = t_send + ttft + 0.01 (n - 1); answer tok/s = (n - reasoning - 1) / (t_last - t_first_answer)
    recs = [
        rec(0, T0, 0.1, 0.5, 101, 40),  # t_last T0+1.1; answer 61 tokens: 60 / (1.1 - 0.5) = 100
        rec(1, T0 + 0.2, 0.1, 0.3, 51, 20, source=SRC_CHUNKS),  # t_last T0+0.8: 30 / (0.8 - 0.5) = 100
        rec(2, T0 + 0.4, 0.1, None, 11, None),  # no reasoning: in the agg answer tok/s only
    ]
    s = summarize_level(recs, 2)
    r = s.reasoning
    assert r is not None
    assert r.requests == 2 and r.reasoning_tokens == 60 and r.reasoning_tokens_mean == pytest.approx(30.0)
    assert r.reasoning_share == pytest.approx(60 / 152)
    assert r.sources == (SRC_CHUNKS, SRC_USAGE)
    assert r.answer_ttft_p50_ms == pytest.approx(400.0)  # (300, 500) ms: their midpoint
    assert r.ttft_p50_ms == pytest.approx(100.0)
    assert r.answer_tok_s_mean == pytest.approx(100.0)
    wall = 1.1  # last t_end (T0 + 1.1) - first t_send (T0)
    assert s.wall_s == pytest.approx(wall)
    assert r.agg_answer_tok_s == pytest.approx((163 - 60) / wall)
    text = render_report_of(recs)
    assert "## Reasoning streams" in text and "usage" in text


def render_report_of(recs: list[RequestRecord]) -> str:
    from specload.present.report import render_reasoning

    return "## Reasoning streams\n" + (render_reasoning([summarize_level(recs, 2)]) or "")


def test_no_reasoning_no_figures() -> None:
    c = LevelColumns()
    c.extend([rec(0, T0, 0.1, None, 11, None)])
    assert reasoning_stats(c, 1.0) is None
    assert summarize_level([rec(0, T0, 0.1, None, 11, None)], 2).reasoning is None


def test_sweep_of_a_reasoning_model(sim: Callable[..., SimProcess], tmp_path: Path) -> None:
    s = sim("--ttft-ms", "10", "--itl-ms", "2", "--reasoning-tokens", "12")
    args = ["--backend", "chat", "--input-tokens", "32", "--output-tokens", "40", "--levels", "1,2"]
    out = sim_sweep(s.url, tmp_path / "out", *args, "--requests-per-level", "6", "--metrics-interval", "0")
    run_dir, recs = out.run_dir, out.records()
    assert recs and all(r.reasoning_tokens == 12 and r.t_first_answer is not None for r in recs)
    run = load_run(run_dir)
    for lv in run.levels:
        assert lv.reasoning is not None and lv.reasoning.reasoning_tokens_mean == pytest.approx(12.0)
        assert lv.reasoning.answer_ttft_p50_ms is not None and lv.figure("ttft_p50") is not None
        assert lv.reasoning.answer_ttft_p50_ms > lv.figure(
            "ttft_p50"
        )  # the answer waits behind the reasoning
    assert "## Reasoning streams" in render_report(run)
    level = json.loads((run_dir / "run.json").read_text())
    assert level["backend"] == "chat"


def test_reasoning_counted_but_streamed_as_content_has_no_first_answer() -> None:
    from specload.client.stream import _Exchange, _reasoning

    b = get_backend("chat")
    p = b.parser()
    p.feed(ev({"content": "<think> hmm"}))
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "completion_tokens_details": {"reasoning_tokens": 1}}
    p.feed(orjson.dumps({"choices": [], "usage": usage}))
    ex = _Exchange(_spec(2), b, "w", 1.0, None, p, p.feed, t_answer_p=5.0)
    assert _reasoning(ex, T0, 4.0) == {
        "t_first_answer": None,  # no reasoning delta: where the answer began is not known
        "reasoning_tokens": 1,
        "reasoning_tokens_source": SRC_USAGE,
    }
    p.reasoning_events = 1  # had a reasoning delta come first, the first content event is the answer's
    assert _reasoning(ex, T0, 4.0)["t_first_answer"] == pytest.approx(T0 + 1.0)
    counted = b.parser()
    counted.feed(ev({"reasoning": " a"}))
    ex2 = _Exchange(_spec(2), b, "w", 1.0, None, counted, counted.feed)
    assert _reasoning(ex2, T0, 4.0) == {
        "t_first_answer": None,  # the answer never began
        "reasoning_tokens": 1,
        "reasoning_tokens_source": SRC_CHUNKS,
    }


def test_a_reasoning_conversation_resends_the_answer_not_the_reasoning(
    sim: Callable[..., SimProcess], tmp_path: Path
) -> None:
    s = sim("--ttft-ms", "5", "--itl-ms", "1", "--reasoning-tokens", "6")
    args = [
        "--backend",
        "chat",
        "--input-tokens",
        "20",
        "--output-tokens",
        "16",
        "--levels",
        "1",
        "--turns",
        "2",
    ]
    recs = sim_sweep(
        s.url, tmp_path / "out", *args, "--requests-per-level", "4", "--metrics-interval", "0"
    ).records()
    later = [r for r in recs if r.turn == 1]
    assert len(later) == 2 and all(r.status == OK for r in recs)
    # the history is the first prompt and the answer's 16 - 6 tokens: what the server counted
    assert all(r.prompt_tokens == r.requested_prompt_tokens for r in recs), [
        (r.turn, r.prompt_tokens, r.requested_prompt_tokens) for r in recs
    ]
