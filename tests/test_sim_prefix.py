"""The simulator's prefix cache: blocks, LRU, the engines' prefill skip, and what the server reports."""

from __future__ import annotations

import json
from collections.abc import Callable

import gevent
import pytest

from specload.client.introspect import parse_metrics
from specload.sim.batch import BatchRequest, BatchScheduler
from specload.sim.prefix import PrefixCache, PromptKey, chat_units, word_unit
from specload.sim.timing import ADMITTED, FixedEngine, clock
from tests.rundelay import RunDelay
from tests.test_sim import Sim, call, get_json, start_sim  # noqa: F401 - start_sim is a fixture
from tests.test_sim_batch import params

B = 16


def key(units: list[int], out_unit: int = -7) -> PromptKey:
    return PromptKey(list(units), B, out_unit)


# the cache -------------------------------------------------------------------------------------------


def test_whole_matching_blocks_are_served_at_most_all_but_one_token() -> None:
    cache = PrefixCache(10_000, B)
    a = key(list(range(100)))  # 6 whole blocks (96 units) and 4 left over
    assert cache.match(a, 100) == 0
    cache.insert(a)
    assert len(cache) == 6
    same_start = key([*range(70), *range(500, 530)])  # the first 4 blocks (64) are a's, the 5th differs
    assert cache.match(same_start, 100) == 64 and same_start.cached == 64
    assert cache.match(key(list(range(100))), 100) == 96
    assert cache.match(key(list(range(96))), 96) == 95  # one token is always computed
    assert cache.match(key([1, *range(1, 100)]), 100) == 0  # a different first block: nothing
    assert (cache.queries, cache.hits) == (4 * 100 + 96, 64 + 96 + 95)


def test_a_block_matches_only_after_the_same_start() -> None:
    cache = PrefixCache(10_000, B)
    cache.insert(key(list(range(64))))
    shifted = key([999, *range(63)])
    moved = key([*range(16, 32), *range(16), *range(32, 64)])  # the same blocks in another order
    assert cache.match(shifted, 64) == 0 and cache.match(moved, 64) == 0


def test_lru_evicts_the_least_recent_prompt_and_its_tail_first() -> None:
    cache = PrefixCache(6 * B, B)  # six blocks
    a, b = key(list(range(64))), key(list(range(1000, 1064)))
    cache.insert(a)
    cache.insert(b)  # 8 blocks wanted: a's last two go (a's first blocks stay ahead of its tail)
    assert len(cache) == 6
    assert cache.match(key(list(range(64))), 64) == 32
    assert cache.match(key(list(range(1000, 1064))), 64) == 63
    cache.insert(key(list(range(5000, 5096))))  # six new blocks: everything older goes
    assert cache.match(key(list(range(1000, 1064))), 64) == 0


def test_an_answer_extends_the_prompts_chain_as_the_next_turn_resends_it() -> None:
    first = key(list(range(40)))
    first.add_output(30)
    resent = key([*range(40), *([-7] * 30), *range(100, 140)])
    assert resent.hashes[: len(first.hashes)] == first.hashes  # 70 units: 4 whole blocks
    cache = PrefixCache(10_000, B)
    cache.insert(first)
    assert cache.match(resent, 110) == 64


def test_chat_units_of_the_next_turn_start_with_the_last_prompt_and_its_answer() -> None:
    turn0 = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a b c d"}]
    answer = " tok tok tok"
    turn1 = [*turn0, {"role": "assistant", "content": answer}, {"role": "user", "content": "e f"}]
    u0, u1 = chat_units(turn0), chat_units(turn1)
    out = [word_unit("tok")] * 3
    assert u1[: len(u0) + 3] == u0 + out  # the generation prompt's role, then the answer's words
    parts = [{"role": "user", "content": [{"type": "text", "text": "a b"}, {"type": "text", "text": "c d"}]}]
    assert chat_units(parts)[1:5] == chat_units([{"role": "user", "content": "a b c d"}])[1:5]


def test_the_gauge_is_the_last_batch_and_the_counters_add_up() -> None:
    cache = PrefixCache(10_000, B)
    cache.insert(key(list(range(32))))
    cache.begin_batch()
    cache.match(key(list(range(40))), 40)  # 32 of 40
    cache.match(key(list(range(100, 140))), 40)  # 0 of 40
    assert cache.last_batch_rate == pytest.approx(32 / 80)
    cache.begin_batch()
    cache.match(key(list(range(40))), 40)
    assert cache.last_batch_rate == pytest.approx(32 / 40)
    assert (cache.queries, cache.hits) == (120, 64)


def test_bad_cache_sizes() -> None:
    with pytest.raises(ValueError, match="at least one block"):
        PrefixCache(8, 16)
    with pytest.raises(ValueError, match="block must be >= 1"):
        PrefixCache(100, 0)


# the engines -----------------------------------------------------------------------------------------


def test_batch_engine_skips_the_cached_part_of_prefill_in_virtual_time() -> None:
    p = params(decode_ms=[[1, 10.0]], prefill_us_per_token=1000)  # 1 ms per prompt token prefilled
    cache = PrefixCache(100_000, B)
    sched = BatchScheduler(p, 1.0, cache)
    a = BatchRequest(512, 4, 0.0, key(list(range(512))))
    b = BatchRequest(512, 4, 10.0, key([*range(384), *range(9000, 9128)]))
    # Its first token comes out of a step of 10 ms + 1 ms per prefilled token.
    sched.submit(a)
    step = sched.begin_step(0.0)
    assert step is not None and step.end == pytest.approx(0.010 + 0.512)
    sched.end_step()
    t = step.end
    while sched.running:  # a's remaining tokens; at its end its blocks are in the cache
        step = sched.begin_step(t)
        assert step is not None
        t = step.end
        sched.end_step()
    sched.submit(b)
    step = sched.begin_step(10.0)
    assert step is not None and step.prefill_tokens == 128 and step.end == pytest.approx(10.0 + 0.010 + 0.128)
    assert b.prefilled == 384 and b.key is not None and b.key.cached == 384
    assert step.ctx_tokens == 384  # the cached part is read as context, as a prefilled one is
    assert (cache.queries, cache.hits) == (1024, 384)


def test_a_queued_request_uses_a_prefix_computed_while_it_waited() -> None:
    p = params(decode_ms=[[1, 10.0]], prefill_us_per_token=1000, max_running_requests=1)
    cache = PrefixCache(100_000, B)
    sched = BatchScheduler(p, 1.0, cache)
    a = BatchRequest(256, 2, 0.0, key(list(range(256))))
    b = BatchRequest(256, 2, 0.0, key(list(range(256))))  # the same prompt, arriving with a
    sched.submit(a)
    sched.submit(b)
    t = 0.0
    while sched.queue or sched.running:
        step = sched.begin_step(t)
        assert step is not None
        t = step.end
        sched.end_step()
    assert a.key is not None and b.key is not None and (a.key.cached, b.key.cached) == (0, 255)


def test_fixed_engine_first_token_skips_the_cached_prefill() -> None:
    cache = PrefixCache(100_000, B)
    eng = FixedEngine(
        ttft_s=0.005, itl_s=0.001, max_running=4, prefill_per_token_s=0.0005, prefix_cache=cache
    )

    def ttft(units: list[int]) -> float:
        t0 = clock()
        gen = eng.generate(len(units), 2, arrival=t0, key=key(units))
        assert next(gen) == ADMITTED
        next(gen)
        t = clock() - t0
        list(gen)
        return t

    waited = RunDelay()
    cold = ttft(list(range(128)))
    late_cold = 0.010 + waited.s  # quiet-machine tolerance plus the run-queue wait (tests/rundelay.py)
    waited = RunDelay()
    warm = ttft([*range(96), *range(7000, 7032)])  # 96 cached: 48 ms less prefill
    late_warm = 0.010 + waited.s
    assert 0.005 + 0.064 - 0.0005 <= cold <= 0.005 + 0.064 + late_cold, (cold, late_cold)
    assert 0.005 + 0.016 - 0.0005 <= warm <= 0.005 + 0.016 + late_warm, (warm, late_warm)
    assert eng.server_info()["sim_prefix_cache"] == {"capacity_tokens": 100_000, "block": B}
    gevent.sleep(0)


def test_fixed_engine_stores_the_answer_before_its_last_chunk() -> None:
    # The server closes the engine's generator as soon as it has the last chunk: the answer must be in.
    cache = PrefixCache(100_000, B)
    eng = FixedEngine(ttft_s=0.0, itl_s=0.0, max_running=1, prefix_cache=cache)
    for p, n in ((47, 1), (40, 8)):  # the answer completes the prompt's third block
        k = key(list(range(100 * n, 100 * n + p)))
        gen = eng.generate(p, n, key=k)
        assert [c.tokens for c in [next(gen) for _ in range(n + 1)]][1:] == [1] * n
        gen.close()
        assert cache.match(key([*range(100 * n, 100 * n + p), *([-7] * n), *range(9000, 9040)]), 80) == 48


# over HTTP -------------------------------------------------------------------------------------------


def _completion(port: int, prompt: list[int]) -> dict:
    body = {
        "model": "m",
        "prompt": prompt,
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = call(port, "/v1/completions", body).json_events()
    return events[-1]["usage"]


def test_vllm_style_counters_and_per_request_cached_tokens(start_sim: Callable[..., Sim]) -> None:  # noqa: F811
    s = start_sim(
        "--model",
        "m",
        "--ttft-ms",
        "1",
        "--itl-ms",
        "1",
        "--prefix-cache-tokens",
        "4096",
        "--metrics-style",
        "vllm",
        "--cache-report",
    )
    prompt = list(range(1000, 1064))
    assert _completion(s.port, prompt)["prompt_tokens_details"] == {"cached_tokens": 0}
    assert _completion(s.port, prompt)["prompt_tokens_details"] == {"cached_tokens": 63}
    text = call(s.port, "/metrics", method="GET").body.decode()
    assert "vllm:prefix_cache_queries_total" in text
    got = parse_metrics(text)
    assert (got["prefix_cache_queries"], got["prefix_cache_hits"]) == (128, 63)
    assert get_json(s.port, "/get_server_info")["sim_prefix_cache"] == {"capacity_tokens": 4096, "block": 16}
    # A next turn that resends the answer as this server tokenizes it finds prompt and answer cached.
    answer = call(s.port, "/tokenize", {"content": " tok" * 4})
    ids = prompt + json.loads(answer.body)["tokens"]
    assert _completion(s.port, [*ids, *range(5000, 5032)])["prompt_tokens_details"] == {"cached_tokens": 64}


def test_sglang_style_gauge_and_meta_info(start_sim: Callable[..., Sim]) -> None:  # noqa: F811
    s = start_sim("--model", "m", "--ttft-ms", "1", "--itl-ms", "1", "--prefix-cache-tokens", "4096")
    body = {"input_ids": list(range(300, 348)), "sampling_params": {"max_new_tokens": 3}, "stream": True}
    first = call(s.port, "/generate", body).json_events()[-1]["meta_info"]
    second = call(s.port, "/generate", body).json_events()[-1]["meta_info"]
    assert (first["cached_tokens"], second["cached_tokens"]) == (0, 47)
    assert parse_metrics(call(s.port, "/metrics", method="GET").body.decode())[
        "cache_hit_rate"
    ] == pytest.approx(47 / 48)
    # Without --cache-report OpenAI usage stays as vLLM sends it by default.
    usage = _completion(s.port, list(range(10)))
    assert "prompt_tokens_details" not in usage


def test_no_cache_by_default(start_sim: Callable[..., Sim]) -> None:  # noqa: F811
    s = start_sim("--ttft-ms", "1", "--itl-ms", "1", "--metrics-style", "vllm")
    body = {"input_ids": list(range(48)), "sampling_params": {"max_new_tokens": 2}, "stream": True}
    for _ in range(2):
        assert call(s.port, "/generate", body).json_events()[-1]["meta_info"]["cached_tokens"] == 0
    got = parse_metrics(call(s.port, "/metrics", method="GET").body.decode())
    assert got["prefix_cache_queries"] is None and "sim_prefix_cache" not in get_json(
        s.port, "/get_server_info"
    )
