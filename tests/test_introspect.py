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
