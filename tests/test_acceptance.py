"""The acceptance figures' arithmetic (specload.analysis.acceptance), each against a hand computation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specload.analysis.acceptance import (
    FROM_COUNTERS,
    FROM_OLD_RECORDS,
    acceptance,
    at_least,
    mismatch_note,
    position_gaps,
)
from specload.analysis.columns import LevelColumns, read_columns
from specload.analysis.metrics import ServerSample
from specload.client.backends.spec import along
from specload.core.records import OK, PHASE_MEASURE, SCHEMA_VERSION, SPEC_BOUNDS, make_record, read_records


def rec(**kw: Any) -> Any:
    fields: dict[str, Any] = dict(
        level=0,
        concurrency=1,
        phase=PHASE_MEASURE,
        seq=0,
        backend="openai",
        status=OK,
        reason=None,
        http_status=200,
        output_tokens_source="usage",
        prompt_tokens=8,
        requested_output_tokens=64,
        requested_prompt_tokens=8,
        chunks=10,
        itl_max_s=None,
        spec_verify_ct=None,
        worker="w",
    )
    fields.update(kw)
    return make_record(t_send=0.0, t_first=0.1, t_last=0.9, t_end=1.0, output_tokens=64, **fields)


def test_at_least_is_the_tail_share_of_the_histogram() -> None:
    # 10 steps: 2 accepted 0, 3 accepted 1, 5 accepted 2 -> >=1: 8/10, >=2: 5/10
    assert at_least(np.array([2, 3, 5])) == pytest.approx([0.8, 0.5])


def test_along_buckets_steps_by_the_position_of_their_first_token() -> None:
    # steps accepting 3, 3, 0, ... start at 1, 5, 9, 10; 30 steps of 3 after: positions 10 + 4i
    steps = [3, 3, 0] + [3] * 30
    got = along(steps)
    # bucket 0: positions 1, 5, 9, then 10, 14, ..., 98 (23 of them) -> 26 steps, 3+3+0+69 accepted
    assert got[0] == [0, 26, 75] and got[1][0] == 1 and got[0][1] + got[1][1] == 33


def test_records_with_accepted_counts_give_one_plus_accepted_per_step() -> None:
    a = [
        rec(spec_verify_ct=16, spec_accepted=47, spec_drafted=48, spec_source="vllm_metrics"),
        rec(spec_verify_ct=20, spec_accepted=20, spec_drafted=60, spec_source="vllm_metrics"),
    ]
    got = acceptance(LevelColumns.of(a), [], 0.0, 1.0)
    assert got is not None
    assert got.length == pytest.approx(1 + 67 / 36) and got.rate == pytest.approx(67 / 108)
    assert got.sources == {
        "length": "vllm_metrics",
        "rate": "vllm_metrics",
        "tokens_per_pass": "vllm_metrics",
    }
    assert got.requests == 2 and got.tokens_per_pass == pytest.approx(128 / (128 - 67))


def test_old_records_keep_tokens_per_verify_step() -> None:
    got = acceptance(LevelColumns.of([rec(spec_verify_ct=32)]), [], 0.0, 1.0)
    assert (
        got is not None and got.length == pytest.approx(2.0) and got.sources == {"length": FROM_OLD_RECORDS}
    )


def test_counters_fill_what_the_records_lack() -> None:
    s0 = ServerSample(
        t=0.0,
        spec_num_drafts=100,
        spec_num_draft_tokens=300,
        spec_num_accepted_tokens=150,
        spec_accepted_per_pos=(80.0, 50.0, 20.0),
    )
    s1 = ServerSample(
        t=2.0,
        spec_num_drafts=200,
        spec_num_draft_tokens=600,
        spec_num_accepted_tokens=330,
        spec_accepted_per_pos=(170.0, 110.0, 50.0),
    )
    got = acceptance(LevelColumns.of([rec()]), [s0, s1], 0.5, 2.5)
    assert got is not None
    # 100 steps, 300 drafted, 180 accepted: 90 / 60 / 30 steps accepted position 1 / 2 / 3
    assert got.length == pytest.approx(2.8) and got.rate == pytest.approx(0.6)
    assert got.per_position == pytest.approx([0.9, 0.6, 0.3])
    assert set(got.sources.values()) == {FROM_COUNTERS}


def test_mismatch_beyond_the_tolerance_is_a_note() -> None:
    assert mismatch_note(3.0, 3.1, None, None) is None  # 3.3 % apart
    note = mismatch_note(3.0, 3.3, 0.5, 0.5)
    assert note is not None and "acceptance length 3.00 from the responses, 3.30 from the counters" in note


def test_old_records_still_read(tmp_path: Path) -> None:
    new = rec(spec_verify_ct=16, spec_accepted=47, spec_hist=[0, 0, 1, 15], spec_source="vllm_metrics")
    old = {k: v for k, v in new.to_dict().items() if not k.startswith("spec_") or k == "spec_verify_ct"}
    old["v"] = 2
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(old) + "\n" + new.to_json().decode() + "\n")
    a, b = read_records(str(path))
    assert (
        a.spec_accepted is None and a.v == 2 and b.spec_hist == [0, 0, 1, 15] and b.v == SCHEMA_VERSION == 4
    )
    cols = next(iter(read_columns(str(path)).values()))
    assert cols.spec.hist.tolist() == [0, 0, 1, 15] and cols.spec.hist_requests == 1


def test_per_position_gaps_beyond_the_tolerance_are_named() -> None:
    assert position_gaps([1.0, 0.9, 0.5], [0.98, 0.88, 0.49]) is None  # each within 5 %
    assert position_gaps([1.0, 0.9], []) is None  # nothing to reconcile
    note = position_gaps([1.0, 0.9, 0.5], [1.0, 0.8, 0.5])
    assert note is not None and note.startswith(
        "acceptance per position (k=2 90.0% from the responses, 80.0%"
    )
    assert "k=1" not in note and "k=3" not in note
    assert position_gaps([0.01], [0.012]) is None  # near 0: 5 % of 0.05 at least
    other = position_gaps([1.0, 0.9], [1.0, 0.9, 0.5])
    assert other is not None and "2 draft positions in the responses, 3 in the counters" in other


# ---------------------------------------------------------------- llama.cpp and tokens per target pass


def test_llamacpp_length_is_per_drafting_step_from_its_counters() -> None:
    """llama.cpp's timings give drafted and accepted tokens but no drafting steps: the length is its
    counters' 1 + accepted / drafts, the same definition as vLLM's, not output / (output - accepted)."""
    # Two 64-token requests: 40 drafted, 30 accepted, over 16 drafting steps, by hand.
    recs = [
        rec(seq=i, spec_drafted=d, spec_accepted=a, spec_source="timings")
        for i, (d, a) in enumerate(((24, 18), (16, 12)))
    ]
    samples = [
        ServerSample(0.0, spec_num_drafts=100.0, spec_num_draft_tokens=300.0, spec_num_accepted_tokens=200.0),
        ServerSample(2.0, spec_num_drafts=116.0, spec_num_draft_tokens=340.0, spec_num_accepted_tokens=230.0),
    ]
    a = acceptance(LevelColumns.of(recs), samples, 0.0, 2.0)
    assert a is not None
    assert a.length == pytest.approx(1 + 30 / 16) and a.sources["length"] == FROM_COUNTERS
    assert a.rate == pytest.approx(30 / 40) and a.sources["rate"] == "timings"
    # 128 tokens in 128 - 30 = 98 target passes (the prefill's included): each yields one of its own
    assert a.tokens_per_pass == pytest.approx(128 / 98) and a.sources["tokens_per_pass"] == "timings"
    assert a.note is None  # the counters' rate (30/40) agrees with the responses'
    # Without the counters there is no length: the responses do not say how many steps drafted.
    alone = acceptance(LevelColumns.of(recs), (), 0.0, 2.0)
    assert alone is not None and alone.length is None and alone.rate == pytest.approx(0.75)


def test_llamacpp_records_of_older_runs_give_no_per_pass_length() -> None:
    """Records written before: spec_verify_ct = output - accepted (target passes) under spec_source
    "timings". Their ratio is tokens per pass (64 / 34 here), not the acceptance length."""
    old = [rec(spec_verify_ct=34, spec_drafted=40, spec_accepted=30, spec_source="timings")]
    a = acceptance(LevelColumns.of(old), (), 0.0, 1.0)
    assert a is not None and a.length is None and a.requests == 0
    assert a.tokens_per_pass == pytest.approx(64 / 34)


def test_tokens_per_pass_beside_the_length_on_vllm() -> None:
    """An n-gram drafter drafts on some steps only: 64 tokens, 10 drafting steps that accepted 21
    drafts. Length 1 + 21/10 = 3.1 per drafting step; 64 / (64 - 21) = 1.49 tokens per target pass."""
    r = rec(spec_verify_ct=10, spec_drafted=30, spec_accepted=21, spec_source="vllm_metrics")
    a = acceptance(LevelColumns.of([r]), (), 0.0, 1.0)
    assert a is not None
    assert a.length == pytest.approx(3.1) and a.tokens_per_pass == pytest.approx(64 / 43)


def test_tokens_per_pass_from_the_counters_when_the_responses_lack_it() -> None:
    samples = [
        ServerSample(0.0, spec_num_drafts=0.0, spec_num_accepted_tokens=0.0, generation_tokens=0.0),
        ServerSample(1.0, spec_num_drafts=50.0, spec_num_accepted_tokens=60.0, generation_tokens=200.0),
    ]
    a = acceptance(LevelColumns.of([rec()]), samples, 0.0, 1.0)
    assert a is not None and a.length == pytest.approx(1 + 60 / 50)
    assert a.tokens_per_pass == pytest.approx(200 / 140) and a.sources["tokens_per_pass"] == FROM_COUNTERS


def test_a_request_that_drafted_nothing_counts_all_its_tokens_as_passes() -> None:
    """llama.cpp leaves draft_n out of a request's timings when it drafted nothing; on a level where
    other requests count drafts, that request's 64 tokens took 64 target passes."""
    recs = [rec(seq=0, spec_drafted=40, spec_accepted=30, spec_source="timings"), rec(seq=1)]
    a = acceptance(LevelColumns.of(recs), (), 0.0, 1.0)
    assert a is not None and a.tokens_per_pass == pytest.approx(128 / (128 - 30))


@pytest.mark.parametrize(
    ("later", "bound"),
    [
        # the review's counters: accepted 100x the draft tokens (Accept len 501, rate 10,000 %)
        ({"spec_num_drafts": 2.0, "spec_num_draft_tokens": 10.0, "spec_num_accepted_tokens": 1000.0}, 1),
        # accepted more than the output tokens the server generated in the window
        (
            {
                "spec_num_drafts": 10.0,
                "spec_num_draft_tokens": 400.0,
                "spec_num_accepted_tokens": 300.0,
                "generation_tokens": 40.0,
            },
            3,
        ),
        # more verify steps than output tokens
        (
            {
                "spec_num_drafts": 50.0,
                "spec_num_draft_tokens": 150.0,
                "spec_num_accepted_tokens": 10.0,
                "generation_tokens": 20.0,
            },
            2,
        ),
        # more accepted per step than the per-position counter's K (3): an acceptance length above K + 1
        (
            {
                "spec_num_drafts": 10.0,
                "spec_num_draft_tokens": 300.0,
                "spec_num_accepted_tokens": 50.0,
                "spec_accepted_per_pos": (10.0, 10.0, 10.0),
            },
            4,
        ),
        # a count that went negative over the window (no reset seen)
        ({"spec_num_drafts": 10.0, "spec_num_draft_tokens": 30.0, "spec_num_accepted_tokens": -5.0}, 0),
    ],
)
def test_counters_that_cannot_be_true_are_refused_by_name(later: dict[str, Any], bound: int) -> None:
    """Held to the bounds a record's counts are held to (core.records.spec_broken): the level keeps
    no figure from them, and its note names the bound broken with the numbers."""
    first = {k: (0.0,) * len(v) if isinstance(v, tuple) else 0.0 for k, v in later.items()}
    samples = [ServerSample(t=0.0, **first), ServerSample(t=2.0, **later)]
    got = acceptance(LevelColumns(), samples, 0.0, 2.0)
    assert got is not None and got.length is None and got.rate is None and not got.sources
    assert got.note is not None and got.note.startswith(
        f"the server's /metrics counters were refused: {SPEC_BOUNDS[bound]} ("
    ), got.note
    # Figures from the responses stay; the note says the counters were left out.
    kept = acceptance(
        LevelColumns.of(
            [rec(seq=0, spec_drafted=8, spec_accepted=4, spec_verify_ct=4, spec_source="vllm_metrics")]
        ),
        samples,
        0.0,
        2.0,
    )
    assert kept is not None and kept.counter_length is None and "refused" in (kept.note or "")
