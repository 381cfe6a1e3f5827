"""Every acceptance source against the simulator, whose acceptance is known exactly.

With spec_accept_prob = 1 and k = 3 draft tokens, a request of 64 tokens is its prefill's token and
16 verify steps: 15 that accept all 3 drafts (4 tokens each, 60) and a last one that may take only 3
tokens, so accepts 2 (1 + 60 + 3 = 64). Hence, per request: steps 16, accepted 47, drafted 48,
histogram [0, 0, 1, 15], acceptance length 1 + 47/16, rate 47/48, at least k accepted: 1, 1, 15/16.
SGLang counts the prefill's pass as a 17th verify step that accepted nothing: 64 / 17.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from specload.analysis.acceptance import FROM_COUNTERS, acceptance
from specload.analysis.columns import LevelColumns
from specload.analysis.metrics import ServerSample
from specload.client.introspect import parse_metrics
from specload.core import histogram
from specload.core.records import ITL_PER_TOKEN, OK, SPEC_SGLANG_META, SPEC_SGLEXT, SPEC_VLLM, RequestRecord
from specload.sim.process import SimProcess
from tests import test_stream
from tests.test_stream import run

clients = test_stream.clients  # the fixture: clients a test made, closed after it
K3 = ["--engine", "batch", "--preset", "mtp", "--time-scale", "0.05", "--model", "m"]
K3 += ["--param", "spec_num_steps=3", "--param", "spec_accept_prob=1.0"]
STEPS, ACCEPTED, HIST = 16, 47, [0, 0, 1, 15]


def _acc(recs: list[RequestRecord], samples: list[ServerSample] | None = None) -> Any:
    c = LevelColumns.of(recs)
    return acceptance(c, samples or [], 1.0, 2.0)


def test_vllm_per_request_metrics(sim: Callable[..., SimProcess], clients: list[Any]) -> None:
    s = sim(*K3, "--metrics-style", "vllm", "--per-request-spec-decode-metrics", "summary")
    rec = run(s.port, clients, "openai", requested=64)
    assert rec.status == OK and rec.output_tokens == 64
    assert rec.spec_source == SPEC_VLLM
    assert (rec.spec_verify_ct, rec.spec_accepted, rec.spec_drafted) == (STEPS, ACCEPTED, 48)
    assert rec.spec_hist == HIST and rec.spec_along is None  # per-step arrays only at detailed
    a = _acc([rec, rec])
    assert a.length == pytest.approx(1 + ACCEPTED / STEPS) and a.rate == pytest.approx(ACCEPTED / 48)
    assert a.histogram == [0, 0, 2, 30]
    assert a.per_position == pytest.approx([1.0, 1.0, 15 / 16])
    assert a.sources == dict.fromkeys(
        ("length", "rate", "tokens_per_pass", "histogram", "per_position"), SPEC_VLLM
    )
    assert a.tokens_per_pass == pytest.approx(64 / (64 - ACCEPTED))


def test_vllm_streams_count_tokens_per_event(sim: Callable[..., SimProcess], clients: list[Any]) -> None:
    # continuous_usage_stats: each event's running count says how many tokens it carried (4 per step;
    # more when steps' tokens were sent together), so ITL is per token: a gap for every token after
    # the first event's, not one per event.
    s = sim(*K3, "--metrics-style", "vllm")
    rec = run(s.port, clients, "openai", requested=64)
    assert rec.status == OK and rec.chunks <= 17 and rec.first_event_tokens
    assert rec.itl_unit == ITL_PER_TOKEN
    assert histogram.count(histogram.merge([rec.itl or []])) == 64 - rec.first_event_tokens
    assert rec.spec_source is None  # no --per-request-spec-decode-metrics: no per-request figures


def test_vllm_detailed_gives_acceptance_along_the_output(
    sim: Callable[..., SimProcess], clients: list[Any]
) -> None:
    # 300 tokens: steps start at positions 1, 5, ..., 297; 25 per 100-token bucket, the very last
    # one accepting 2 (297 + 3 = 300).
    s = sim(*K3, "--metrics-style", "vllm", "--per-request-spec-decode-metrics", "detailed")
    rec = run(s.port, clients, "openai", requested=300, read_timeout=10.0)
    assert rec.status == OK
    assert rec.spec_along == [[0, 25, 75], [1, 25, 75], [2, 25, 74]]
    a = _acc([rec])
    assert a.along == pytest.approx([4.0, 4.0, 1 + 74 / 25]) and a.along_steps == [25, 25, 25]
    assert a.sources["along"] == SPEC_VLLM


def test_acceptance_decays_along_the_output(sim: Callable[..., SimProcess], clients: list[Any]) -> None:
    # p falls by 1.6 per 1000 positions: 0.92 at position 50, 0.28 at 450; a step at q accepts
    # q + q^2 + q^3 drafts on average. Six requests give 150 steps or more per bucket.
    s = sim(
        *K3,
        "--param",
        "spec_accept_decay=1.6",
        "--metrics-style",
        "vllm",
        "--per-request-spec-decode-metrics",
        "detailed",
    )
    recs = [run(s.port, clients, "openai", requested=500, read_timeout=10.0) for _ in range(6)]
    a = _acc(recs)
    assert len(a.along) == 5
    for b, got in enumerate(a.along):
        q = 1.0 - 1.6 * (100 * b + 50) / 1000
        assert got == pytest.approx(1 + q + q * q + q**3, abs=0.25), (b, a.along)
    assert a.along[0] - a.along[-1] > 1.5


def test_sglang_meta_info(sim: Callable[..., SimProcess], clients: list[Any]) -> None:
    s = sim(*K3, "--metrics-style", "sglang")
    rec = run(s.port, clients, "sglang", requested=64)
    assert rec.status == OK and rec.spec_source == SPEC_SGLANG_META
    assert (rec.spec_verify_ct, rec.spec_accepted, rec.spec_drafted) == (STEPS + 1, ACCEPTED, 48)
    assert rec.spec_hist == [1, 0, 1, 15]
    a = _acc([rec])
    assert a.length == pytest.approx(64 / 17)  # = 1 + 47/17: SGLang's spec_accept_length
    assert a.rate == pytest.approx(47 / 48) and a.per_position == pytest.approx([16 / 17, 16 / 17, 15 / 17])


def test_sglang_openai_endpoint_sends_sglext(sim: Callable[..., SimProcess], clients: list[Any]) -> None:
    # The default backend asks for return_spec_tokens_details, so it gets SGLang's acceptance too.
    s = sim(*K3, "--metrics-style", "sglang")
    for backend in ("openai", "chat"):
        rec = run(s.port, clients, backend, requested=64)
        assert rec.status == OK and rec.spec_source == SPEC_SGLEXT, backend
        assert (rec.spec_verify_ct, rec.spec_accepted, rec.spec_hist) == (STEPS + 1, ACCEPTED, [1, 0, 1, 15])
        assert _acc([rec]).length == pytest.approx(64 / 17)


def _sample(url: str, t: float) -> ServerSample:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        values = parse_metrics(resp.read().decode())
    sample = ServerSample.from_dict({"t": t, **values})
    assert sample is not None
    return sample


def test_vllm_counters_with_positions_reconcile(sim: Callable[..., SimProcess], clients: list[Any]) -> None:
    s = sim(*K3, "--metrics-style", "vllm", "--per-request-spec-decode-metrics", "summary")
    before = _sample(s.url, 0.0)
    recs = [run(s.port, clients, "openai", requested=64) for _ in range(3)]
    after = _sample(s.url, 1.5)
    assert after.spec_accepted_per_pos is not None and len(after.spec_accepted_per_pos) == 3
    from_counters = _acc([], [before, after])  # no records: the counters alone
    keys = ("length", "rate", "tokens_per_pass", "per_position")
    assert from_counters.sources == dict.fromkeys(keys, FROM_COUNTERS)
    # vllm:generation_tokens_total counts the three requests' 64 tokens each
    assert from_counters.tokens_per_pass == pytest.approx(64 / (64 - ACCEPTED))
    assert from_counters.length == pytest.approx(1 + ACCEPTED / STEPS)
    assert from_counters.rate == pytest.approx(ACCEPTED / 48)
    assert from_counters.per_position == pytest.approx([1.0, 1.0, 15 / 16])
    both = _acc(recs, [before, after])
    assert both.sources["length"] == SPEC_VLLM and both.counter_length == pytest.approx(both.length)
    assert both.sources["per_position"] == SPEC_VLLM  # the histograms', reconciled with the counters'
    assert both.counter_per_position == pytest.approx(both.per_position)
    assert both.note is None


def test_sglang_counters(sim: Callable[..., SimProcess], clients: list[Any]) -> None:
    s = sim(*K3, "--metrics-style", "sglang")
    before = _sample(s.url, 0.0)
    for _ in range(2):
        run(s.port, clients, "sglang", requested=64)
    after = _sample(s.url, 1.5)
    a = _acc([], [before, after])
    assert a.sources == {"length": FROM_COUNTERS}
    assert a.length == pytest.approx(64 / 17)  # generation_tokens_total / spec_verify_calls_total


def test_a_counter_that_disagrees_is_a_note(sim: Callable[..., SimProcess], clients: list[Any]) -> None:
    # Another client's traffic inside the window: requests that are not this level's records.
    s = sim(*K3, "--metrics-style", "vllm", "--per-request-spec-decode-metrics", "summary")
    before = _sample(s.url, 0.0)
    mine = run(s.port, clients, "openai", requested=64)
    for _ in range(3):  # 2 tokens each: the prefill's, then a verify step that may keep only 1 (accepts 0)
        run(s.port, clients, "openai", requested=2)
    after = _sample(s.url, 1.5)
    a = _acc([mine], [before, after])
    assert a.length == pytest.approx(1 + ACCEPTED / STEPS)
    assert a.counter_length == pytest.approx(1 + ACCEPTED / (STEPS + 3))
    assert a.note is not None and "from the counters" in a.note
    # per position too: the other requests' steps accepted nothing, so each share falls to 16 / 19
    assert a.per_position == pytest.approx([1.0, 1.0, 15 / 16])
    assert a.counter_per_position == pytest.approx([16 / 19, 16 / 19, 15 / 19])
    assert "acceptance per position (k=1 100.0% from the responses, 84.2% from the counters, k=2" in a.note
