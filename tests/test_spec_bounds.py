"""Speculative counts that cannot be true are refused per record (review 3a7af2e, M16): a response that
claims them fails, naming the bound, and carries none of them; a record read back with them is invalid.

The responses come from a real TCP server (tests.test_stream's script server on 127.0.0.1); the bounds
are records.SPEC_BOUNDS, checked here against counts worked out by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from specload.analysis.run import load_run
from specload.analysis.validity import RULES, SPEC, Validity, broken
from specload.core.records import FAILED, OK, SPEC_BOUNDS, spec_broken
from tests.test_stream import DONE, END, HEAD_SSE, chunk, clients, cmpl, run, serve, sse  # noqa: F401
from tests.test_validity import _copy, _rec

NEGATIVE, OVER_DRAFTED, STEPS, OVER_TOKENS, OVER_K = SPEC_BOUNDS


def _vllm(tokens: int, **sd: Any) -> dict[str, Any]:
    """vLLM's final usage chunk with its per-request metrics.speculative_decoding."""
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "choices": [],
        "usage": {"prompt_tokens": 4, "completion_tokens": tokens, "total_tokens": 4 + tokens},
        "metrics": {"speculative_decoding": sd},
    }


def _llamacpp(tokens: int, drafted: int, accepted: int) -> dict[str, Any]:
    return {
        **_vllm(tokens),
        "metrics": None,
        "timings": {"draft_n": drafted, "draft_n_accepted": accepted},
    }


def _stream(final: dict[str, Any]) -> list[Any]:
    body = b"".join(sse(cmpl("a")) for _ in range(4)) + sse(cmpl("a", "length")) + sse(final) + DONE
    return [HEAD_SSE + chunk(body) + END]


def test_the_bounds_by_hand() -> None:
    nan = np.nan
    # tokens, steps, drafted, accepted, K -> the first bound broken (-1: none)
    cases = [
        ((9, 4, 12, 6, 3), -1),  # vLLM 0.32's own response (tests.test_acceptance_backends): 1 + 6/4
        ((16, nan, nan, nan, nan), -1),  # no speculation
        ((16, 1, 5, 1000, nan), 1),  # the review's vLLM: Accept len 1001
        ((16, 1, 2, 900, nan), 1),  # the review's SGLang
        ((16, nan, 3, 15, nan), 1),  # the review's llama.cpp
        ((16, 17, nan, nan, nan), 2),
        ((16, 1, 40, 20, 3), 3),  # 20 accepted past 16 tokens + K = 3
        ((16, 1, 40, 20, nan), -1),  # K unknown: a last step may have dropped any of its drafts
        ((4, 2, 6, 6, 3), -1),  # max_tokens 4 cut a last step that accepted 3
        ((16, 2, 10, 5, 2), 4),  # 1 + 5/2 = 3.5 > K + 1 = 3
        ((16, 2, 10, 4, 2), -1),  # 3.0: the most K = 2 allows
        ((16, -1, nan, nan, nan), 0),
        ((16, nan, np.inf, 1, nan), 0),
    ]
    verdict = spec_broken(*(np.array(col, dtype=float) for col in zip(*(c for c, _ in cases), strict=True)))
    assert verdict.tolist() == [want for _, want in cases]


@pytest.mark.parametrize(
    ("final", "bound"),
    [
        (_vllm(5, num_spec_steps=1, num_draft_tokens=5, num_accepted_draft_tokens=1000), OVER_DRAFTED),
        (_vllm(5, num_spec_steps=50, num_draft_tokens=100, num_accepted_draft_tokens=0), STEPS),
        (
            _vllm(
                5,
                num_spec_steps=1,
                num_draft_tokens=100,
                num_accepted_draft_tokens=40,
                acceptance_histogram=[0, 0, 0, 1],
            ),
            OVER_TOKENS,
        ),
        (
            _vllm(
                5,
                num_spec_steps=1,
                num_draft_tokens=4,
                num_accepted_draft_tokens=3,
                acceptance_histogram=[0, 1],
            ),
            OVER_K,
        ),
        (_llamacpp(5, 3, 15), OVER_DRAFTED),
    ],
)
def test_a_response_with_impossible_counts_fails_naming_the_bound(
    serve: Any,  # noqa: F811
    clients: list[Any],  # noqa: F811
    final: dict[str, Any],
    bound: str,
) -> None:
    rec = run(serve(_stream(final)), clients)
    assert rec.status == FAILED and rec.output_tokens == 5, rec
    assert rec.reason is not None and f"cannot be true ({bound})" in rec.reason, rec.reason
    assert (rec.spec_verify_ct, rec.spec_drafted, rec.spec_accepted, rec.spec_hist, rec.spec_source) == (
        None,
    ) * 5
    assert broken([rec]).tolist() == [-1]  # the record as written keeps every rule


def test_a_response_with_possible_counts_keeps_them(serve: Any, clients: list[Any]) -> None:  # noqa: F811
    final = _vllm(
        5,
        num_spec_steps=2,
        num_draft_tokens=6,
        num_accepted_draft_tokens=2,
        acceptance_histogram=[1, 0, 1, 0],
    )
    rec = run(serve(_stream(final)), clients)
    assert rec.status == OK and rec.reason is None, rec
    assert (rec.spec_verify_ct, rec.spec_drafted, rec.spec_accepted, rec.spec_hist) == (2, 6, 2, [1, 0, 1, 0])


def test_a_record_read_back_with_impossible_counts_is_invalid(tmp_path: Path) -> None:
    forged = _rec(spec_verify_ct=1, spec_drafted=5, spec_accepted=1000, spec_source="vllm_metrics")
    assert broken([forged, _rec(spec_verify_ct=4, spec_drafted=12, spec_accepted=6)]).tolist() == [
        RULES.index(SPEC),
        -1,
    ]
    v = Validity()
    assert v.keep([forged]) == []
    assert "1000 accepted of 5 drafted in 1 steps" in (v.note() or "")
    # and through the run directory's reader, which judges columns
    d = _copy(tmp_path)
    lines = (d / "records.jsonl").read_text().splitlines(keepends=True)
    i = next(
        i
        for i, ln in enumerate(lines)
        if json.loads(ln)["phase"] == "measure" and json.loads(ln)["status"] == "ok"
    )
    record = json.loads(lines[i])
    record.update(spec_verify_ct=1, spec_drafted=5, spec_accepted=1000, spec_source="vllm_metrics")
    (d / "records.jsonl").write_text(
        "".join(lines[:i] + [orjson.dumps(record).decode() + "\n"] + lines[i + 1 :])
    )
    (note,) = [n for n in load_run(d).notices if "client's own rules" in n]
    assert note.startswith("1 record(s) break") and f"1 {SPEC}" in note, note


def test_counts_beside_a_count_of_events_are_not_held_to_it(serve: Any, clients: list[Any]) -> None:  # noqa: F811
    """Without the server's token count the record counts events, which may carry several tokens each:
    no bound on output tokens then (8 accepted in 2 steps may well be 11 tokens in 5 events)."""
    final = _vllm(5, num_spec_steps=2, num_draft_tokens=10, num_accepted_draft_tokens=8)
    del final["usage"]
    rec = run(serve(_stream(final)), clients)
    assert rec.output_tokens_source == "chunks" and rec.output_tokens == 5, rec
    assert rec.status == OK and (rec.spec_verify_ct, rec.spec_accepted) == (2, 8), rec
    assert broken([rec]).tolist() == [-1]
