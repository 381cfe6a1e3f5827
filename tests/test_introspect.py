"""specload.client.introspect: the one reader of /v1/models, and the max-running lookup."""

from __future__ import annotations

from typing import Any

import pytest

from specload.client.introspect import ServedModel, max_running, parse_models


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {"object": "list", "data": [{"id": "Qwen/Qwen3", "object": "model"}]},
            ServedModel("Qwen/Qwen3", None),
        ),
        ({"data": [{"id": "m", "max_model_len": 32768}, {"id": "other"}]}, ServedModel("m", 32768)),
        ({"data": [{"id": "", "max_model_len": True}]}, ServedModel(None, None)),
        ({"data": [{"id": 7}]}, ServedModel("7", None)),
        ({"data": []}, None),
        ({"data": ["m"]}, None),
        ({"data": {"id": "m"}}, None),
        ({}, None),
        (None, None),
        ("Not Found", None),
    ],
)
def test_parse_models(body: Any, expected: ServedModel | None) -> None:
    assert parse_models(body) == expected


def test_max_running() -> None:
    assert max_running({"max_running_requests": 64, "max_running_requests_effective": 48}) == 48
    assert max_running({"max_running_requests": 64, "max_running_requests_effective": "48"}) == 64
    assert max_running({"max_running_requests": True}) is None and max_running({}) is None


def test_secrets_are_scrubbed_and_token_counts_and_costs_are_not() -> None:
    from specload.client.introspect import REDACTED, scrub_secrets

    info = {
        "api_key": "sk-1",
        "admin_api_key": None,
        "hf_token": "hf_x",
        "nested": [{"ssl_keyfile_password": "pw", "note": "uses sk-1 here"}],
        "max_tokens": 64,
        "num_speculative_tokens": 3,
        "verify_us_per_token": 40.0,
        "itl_us_per_token": 12.5,
        "eos_token_id": 2,
        "bos_token": "<s>",
        "tokenizer": "llama",
    }
    out = scrub_secrets(info, "sk-1")
    assert out["api_key"] == out["hf_token"] == out["nested"][0]["ssl_keyfile_password"] == REDACTED
    assert out["nested"][0]["note"] == f"uses {REDACTED} here" and out["admin_api_key"] is None
    for name in ("max_tokens", "num_speculative_tokens", "verify_us_per_token", "itl_us_per_token"):
        assert out[name] == info[name], name
    assert (out["eos_token_id"], out["bos_token"], out["tokenizer"]) == (2, "<s>", "llama")


def test_a_negative_or_infinite_metric_is_no_value() -> None:
    """The review's L9: a /metrics running gauge of -5 was shown as `Srv run max -5`."""
    from specload.client.introspect import parse_metrics

    got = parse_metrics(
        "sglang:num_running_reqs -5\nsglang:num_queue_reqs +Inf\nsglang:num_used_tokens 3\n"
        "vllm:spec_decode_num_drafts_total 7\n"
    )
    assert got["running"] is None and got["queued"] is None
    assert got["spec_num_drafts"] == 7.0
