"""The backends read each engine's per-request acceptance object, in the engine's own event shapes."""

from __future__ import annotations

import orjson

from specload.client.backends import get_backend
from specload.core.records import SPEC_LLAMACPP, SPEC_SGLEXT, SPEC_VLLM

# vLLM 0.32 with --per-request-spec-decode-metrics detailed: the final usage chunk (choices: []).
VLLM_FINAL = orjson.dumps(
    {
        "id": "cmpl-1",
        "object": "text_completion",
        "choices": [],
        "usage": {"prompt_tokens": 4, "completion_tokens": 9, "total_tokens": 13},
        "metrics": {
            "speculative_decoding": {
                "mean_acceptance_length": 2.0,
                "draft_acceptance_rate": 4 / 12,
                "acceptance_histogram": [1, 1, 1, 1],
                "num_spec_steps": 4,
                "num_accepted_draft_tokens": 6,
                "num_draft_tokens": 12,
                "num_spec_tokens": 3,
                "per_step_accepted": [3, 0, 2, 1],
                "per_step_drafted": [3, 3, 3, 3],
            }
        },
    }
)
# SGLang's OpenAI completions with return_spec_tokens_details: a chunk of its own before the usage.
SGLEXT = orjson.dumps(
    {
        "id": "x",
        "object": "text_completion",
        "choices": [],
        "sglext": {
            "spec_tokens_details": {
                "spec_accept_rate": 0.5,
                "spec_accept_length": 2.0,
                "spec_num_correct_drafts": 4,
                "spec_num_proposed_drafts": 8,
                "spec_verify_ct": 4,
                "spec_correct_drafts_histogram": [1, 2, 1],
            }
        },
    }
)


def test_vllm_metrics_on_the_final_usage_chunk() -> None:
    p = get_backend("openai").parser()
    assert p.feed(VLLM_FINAL) == 0
    assert (p.spec_verify_ct, p.spec_accepted, p.spec_drafted, p.spec_source) == (4, 6, 12, SPEC_VLLM)
    assert p.spec_hist == [1, 1, 1, 1]
    # steps start at positions 1, 5, 6, 9: all in the first 100-token bucket
    assert p.spec_along == [[0, 4, 6]]


def test_sglext_on_completions_and_chat() -> None:
    for backend in ("openai", "chat"):
        p = get_backend(backend).parser()
        assert p.feed(SGLEXT) == 0
        assert (p.spec_verify_ct, p.spec_accepted, p.spec_drafted, p.spec_source) == (4, 4, 8, SPEC_SGLEXT)
        assert p.spec_hist == [1, 2, 1]


def test_llamacpp_timings_give_drafted_and_accepted() -> None:
    ev = b'{"choices":[{"text":"","index":0,"finish_reason":"length"}],"usage":{"completion_tokens":20,"prompt_tokens":3},"timings":{"draft_n":19,"draft_n_accepted":12}}'
    p = get_backend("openai").parser()
    p.feed(ev)
    # No drafting steps in timings: spec_verify_ct stays unset (the length comes from /metrics).
    assert (p.spec_verify_ct, p.spec_accepted, p.spec_drafted, p.spec_source) == (None, 12, 19, SPEC_LLAMACPP)


def test_a_field_that_is_no_count_is_left_out_not_the_request() -> None:
    bad = VLLM_FINAL.replace(b'"num_draft_tokens":12', b'"num_draft_tokens":"12"').replace(
        b'"acceptance_histogram":[1,1,1,1]', b'"acceptance_histogram":[1,-1]'
    )
    p = get_backend("openai").parser()
    assert p.feed(bad) == 0 and p.output_tokens == 9
    assert p.spec_drafted is None and p.spec_hist is None and p.spec_accepted == 6


def test_the_default_body_asks_for_running_usage_and_sglang_details() -> None:
    body = get_backend("openai").body([1, 2], 8, "m", 0.0, {})
    assert (
        body["stream_options"]["continuous_usage_stats"] is True
        and body["return_spec_tokens_details"] is True
    )
