"""Hand-computed cases for specload.analysis.metrics: every expected value below is worked out in comments."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from specload.analysis.acceptance import FROM_COUNTERS, FROM_OLD_RECORDS, acceptance
from specload.analysis.columns import LevelColumns
from specload.analysis.metrics import (
    Dist,
    LevelStats,
    ServerSample,
    combine_repeats,
    group_repeats,
    repeats_at,
    steady_tok_s,
    steady_window,
)
from specload.core.records import (
    FAILED,
    OK,
    PHASE_MEASURE,
    PHASE_WARMUP,
    SHORT,
    SRC_CHUNKS,
    SRC_USAGE,
    RequestRecord,
    make_record,
)
from specload.core.stats import percentile
from tests.fixtures.by_records import levels_of_records, summarize_level

T0 = 1_764_475_200.0  # epoch base; offsets below are exact binary fractions


def rec(
    t_send: float,
    t_first: float | None,
    t_end: float,
    tokens: int = 10,
    *,
    status: str = OK,
    concurrency: int = 2,
    level: int = 0,
    repeat: int = 0,
    phase: str = PHASE_MEASURE,
    seq: int = 0,
    requested: int = 10,
    prompt: int | None = 100,
    requested_prompt: int = 100,
    source: str = SRC_USAGE,
    reason: str | None = None,
    verify: int | None = None,
) -> RequestRecord:
    """A record with the client's own arithmetic (records.derived) for the per-request fields."""
    tf = None if t_first is None else T0 + t_first
    return make_record(
        t_send=T0 + t_send,
        t_first=tf,
        t_last=None if tf is None else T0 + t_end,
        t_end=T0 + t_end,
        output_tokens=tokens,
        level=level,
        concurrency=concurrency,
        phase=phase,
        seq=seq,
        backend="openai",
        status=status,
        reason=reason,
        http_status=200,
        output_tokens_source=source,
        prompt_tokens=prompt,
        requested_output_tokens=requested,
        requested_prompt_tokens=requested_prompt,
        chunks=tokens,
        itl_max_s=None,
        spec_verify_ct=verify,
        worker="local",
        repeat=repeat,
    )


def four_requests() -> list[RequestRecord]:
    """C=2, two users, two requests each, 10 tokens each.

    user A: r0 [0, 5] first 0.5   then r3 [5, 10]  first 5.5
    user B: r1 [0, 4] first 1.0   then r2 [4, 8]   first 4.5
    """
    return [
        rec(0.0, 0.5, 5.0, seq=0),
        rec(0.0, 1.0, 4.0, seq=1),
        rec(4.0, 4.5, 8.0, seq=2),
        rec(5.0, 5.5, 10.0, seq=3),
    ]


# ---------------------------------------------------------------- percentile


def test_percentile_empty() -> None:
    assert percentile([], 50) is None


def test_percentile_single_value() -> None:
    assert percentile([7.0], 0) == 7.0
    assert percentile([7.0], 50) == 7.0
    assert percentile([7.0], 100) == 7.0


def test_percentile_linear_interpolation_like_numpy() -> None:
    xs = [4.0, 1.0, 3.0, 2.0]  # unsorted on purpose; sorted 1 2 3 4
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 100) == 4.0
    assert percentile(xs, 50) == pytest.approx(2.5)  # pos 1.5
    assert percentile(xs, 99) == pytest.approx(3.97)  # pos 2.97 -> 3 + 0.97
    assert percentile(xs, 25) == pytest.approx(1.75)  # pos 0.75


def test_percentile_rejects_bad_q() -> None:
    assert percentile([1.0, 3.0], 50) == 2.0
    with pytest.raises(ValueError):
        percentile([1.0], 101)
    with pytest.raises(ValueError):
        percentile([1.0], -1)


# ---------------------------------------------------------------- one level


def test_level_exact_figures() -> None:
    s = summarize_level(four_requests(), 2)
    assert (s.label, s.sent, s.ok, s.short, s.failed, s.warmup) == ("c002", 4, 4, 0, 0, 0)
    assert s.output_tokens == 40
    assert s.wall_s == pytest.approx(10.0)
    assert s.agg_tok_s == pytest.approx(4.0)  # 40 / 10
    # per request: 10/5, 10/4, 10/4, 10/5 -> mean 2.25
    assert s.per_req_tok_s == pytest.approx(2.25)
    # TTFT sorted 0.5 0.5 0.5 1.0 s: p50 pos 1.5 -> 0.5; p99 pos 2.97 -> 0.5 + 0.97*0.5
    assert s.figure("ttft_p50") == pytest.approx(500.0)
    assert s.figure("ttft_p99") == pytest.approx(985.0)
    # TPOT = (e2e - ttft) / 9: 4.5/9, 3/9, 3.5/9, 4.5/9 -> sorted 3, 3.5, 4.5, 4.5 (/9)
    assert s.figure("tpot_p50") == pytest.approx(4.0 / 9 * 1000)
    assert s.figure("tpot_p99") == pytest.approx(4.5 / 9 * 1000)
    # E2E sorted 4 4 5 5
    assert s.figure("e2e_p50") == pytest.approx(4.5)
    assert s.figure("e2e_p99") == pytest.approx(5.0)
    # decode = 9 / (e2e - ttft): 2, 3, 9/3.5, 2
    assert s.decode_tok_s_mean == pytest.approx((2 + 3 + 9 / 3.5 + 2) / 4)
    assert s.prompt_tokens_mean == pytest.approx(100.0)
    # sum(e2e) = 18 over wall 10
    assert s.mean_concurrency == pytest.approx(1.8)
    assert s.token_note is None and s.output_mismatch == 0 and s.prompt_mismatch == 0
    assert s.reasons == {}


def rel(window: tuple[float, float] | None) -> tuple[float, float] | None:
    """A window as offsets from T0 (pytest.approx on epoch times would forgive whole seconds)."""
    return None if window is None else (window[0] - T0, window[1] - T0)


def test_steady_state_window_and_rate() -> None:
    recs = four_requests()
    # Opens when both first requests are decoding (r1's first token at 1.0: the prefill burst is
    # over); hand-offs at 4 and 5 are same-instant; the first real drop is at 8 (r2 ends).
    assert rel(steady_window(recs, 2)) == (1.0, 8.0)
    # tokens in [1, 8]: r0 9 * 4 / 4.5 = 8, r1 10, r2 10, r3 1 + 9 * (8 - 5.5) / 4.5 = 6 -> 34 / 7
    rate, length = steady_tok_s(recs, 2)
    assert length == pytest.approx(7.0)
    assert rate == pytest.approx(34 / 7)
    assert summarize_level(recs, 2).steady_tok_s == pytest.approx(34 / 7)


def test_steady_state_tolerates_short_handoff_dip_but_not_long_one() -> None:
    # user B sends its second request 0.2 s after its first ended: a hand-off, not the end
    recs = [rec(0.0, 0.5, 4.0), rec(0.0, 0.5, 6.0), rec(4.2, 4.7, 9.0), rec(6.0, 6.5, 12.0)]
    assert rel(steady_window(recs, 2)) == (0.5, 9.0)
    # a 2 s gap ends the window at the first drop
    recs[2] = rec(6.0, 6.5, 9.0)
    recs[1] = rec(0.0, 0.5, 4.0)
    assert rel(steady_window(recs, 2)) == (0.5, 4.0)


def test_steady_state_none_when_window_never_forms_or_too_short() -> None:
    assert steady_tok_s([rec(0.0, 0.5, 5.0)], 2) == (None, None)  # fewer requests than C
    # both in flight until 1.0, but the second is decoding only from 1.0: no saturated span at all
    short = [rec(0.0, 0.1, 1.0), rec(0.9, 1.0, 3.0)]
    assert steady_tok_s(short, 2) == (None, None)
    assert summarize_level(short, 2).steady_tok_s is None
    # both decoding during [0.5, 1.0] only: window 0.5 s < 1 s
    brief = [rec(0.0, 0.5, 1.0), rec(0.0, 0.5, 3.0)]
    rate, length = steady_tok_s(brief, 2)
    assert rate is None and length == pytest.approx(0.5)
    # sequential requests never overlap
    assert steady_window([rec(0.0, 0.5, 1.0), rec(1.5, 2.0, 3.0)], 2) is None


def test_steady_state_starts_after_the_prefill_burst() -> None:
    """Audit F2: four prompts sent together, prefilled one at a time (first tokens at 1, 2, 3, 4 s),
    then 100 tokens each over 9.9 s; each user sends its next request at once. A window opened at
    the first send counts the burst's seconds with few tokens and comes out below Agg."""
    recs = [rec(0.0, 1.0 + i, 1.0 + i + 9.9, tokens=100, requested=100, seq=i) for i in range(4)]
    recs += [rec(10.9 + i, 11.9 + i, 21.8 + i, tokens=100, requested=100, seq=4 + i) for i in range(4)]
    for r in recs:
        r.concurrency = 4
    a, b = rel(steady_window(recs, 4)) or (0.0, 0.0)
    assert a == pytest.approx(4.0)  # the fourth request's first token
    assert b == pytest.approx(21.8)  # the first lasting drop below 4 in flight
    # Tokens inside [4, 21.8]: first wave 69 + 79 + 89 + 100, second wave 100 + 90 + 80 + 70.
    rate, length = steady_tok_s(recs, 4)
    assert length == pytest.approx(17.8) and rate == pytest.approx(677 / 17.8)
    s = summarize_level(recs, 4)
    assert s.steady_tok_s is not None and s.agg_tok_s is not None and s.steady_tok_s > s.agg_tok_s


def test_steady_state_above_the_servers_cap_lasts_while_the_server_is_full() -> None:
    """C=4 against a server that runs 2 at once: the client has 4 in flight, the server runs 2 and
    queues 2. Requests take 2 s once admitted (first token 0.5 s after admission)."""
    recs = [
        rec(0.0, 0.5, 2.0, seq=0),
        rec(0.0, 0.5, 2.0, seq=1),  # admitted at once
        rec(0.0, 2.5, 4.0, seq=2),
        rec(0.0, 2.5, 4.0, seq=3),  # queued until 2.0
        rec(2.0, 4.5, 6.0, seq=4),
        rec(2.0, 4.5, 6.0, seq=5),  # sent at 2.0, queued until 4.0
    ]
    for r in recs:
        r.concurrency = 4
    # Without the cap the window would wait for 4 decoding requests, which never happens.
    assert steady_window(recs, 4) is None
    # With it: from 0.5 (2 decoding) until fewer than 2 are left in flight (6.0, nothing after).
    assert steady_window(recs, 4, cap=2) is None or rel(steady_window(recs, 4, cap=2)) == (0.5, 6.0)
    rate, length = steady_tok_s(recs, 4, cap=2)
    assert length is None or length == pytest.approx(5.5)


def test_failures_shorts_and_token_sum() -> None:
    recs = four_requests() + [
        rec(1.0, 1.5, 3.0, tokens=6, status=SHORT, reason="stream ended without [DONE]", seq=4),
        rec(2.0, None, 2.5, tokens=0, status=FAILED, reason="HTTP 503: overloaded", seq=5),
    ]
    s = summarize_level(recs, 2)
    assert (s.sent, s.ok, s.short, s.failed) == (6, 4, 1, 1)
    assert s.output_tokens == 46  # the short request's 6 tokens count, as in the reference's Tokens
    assert s.agg_tok_s == pytest.approx(4.6)
    assert s.per_req_tok_s == pytest.approx(2.25)  # OK requests only
    assert s.figure("ttft_p50") == pytest.approx(500.0)  # OK requests only
    assert s.output_mismatch == 1  # the short one; the failed one is not counted twice
    assert s.reasons == {"short: stream ended without [DONE]": 1, "failed: HTTP 503: overloaded": 1}
    # in flight: e2e 5 4 4 5 2 0.5 = 20.5 over 10 s
    assert s.mean_concurrency == pytest.approx(2.05)


def test_per_request_tok_s_is_the_mean_of_the_records_own() -> None:
    """docs/metrics.md: Per-req tok/s is the mean of the OK records' ``per_request_tok_s``, which a
    chunk-counted request does not have (a chunk may carry several tokens). One usage-counted
    request at 100 tok/s and one chunk-counted at 50 give 100, not the 75 of counting both."""
    usage = rec(0.0, 0.25, 1.0, tokens=100, seq=0)
    chunks = rec(0.0, 0.25, 1.0, tokens=50, seq=1, source=SRC_CHUNKS)
    assert (usage.per_request_tok_s, chunks.per_request_tok_s) == (100.0, None)
    s = summarize_level([usage, chunks], 2)
    assert s.per_req_tok_s == pytest.approx(100.0)
    assert s.agg_tok_s == pytest.approx(150.0)  # tokens of both, chunks included, as Tokens has them
    only_chunks = summarize_level([chunks], 2)
    assert only_chunks.per_req_tok_s is None and only_chunks.agg_tok_s == pytest.approx(50.0)


def test_warmup_excluded_everywhere() -> None:
    warm = rec(-3.0, -2.9, -0.5, tokens=3, requested=3, phase=PHASE_WARMUP, status=OK)
    s = summarize_level([warm, *four_requests()], 2)
    assert s.warmup == 1
    assert s.sent == 4 and s.output_tokens == 40
    assert s.wall_s == pytest.approx(10.0)  # starts at the first measured send, not the warmup's


def test_other_levels_filtered_out() -> None:
    other = rec(0.0, 0.1, 50.0, tokens=99, concurrency=4, level=1)
    again = rec(0.0, 0.1, 50.0, tokens=99, repeat=1)
    s = summarize_level([other, again, *four_requests()], 2)
    assert s.sent == 4 and s.output_tokens == 40


def test_chunk_fallback_note_and_prompt_mismatch() -> None:
    recs = four_requests()
    recs[0] = rec(0.0, 0.5, 5.0, source=SRC_CHUNKS)
    recs[1] = rec(0.0, 1.0, 4.0, prompt=103)
    s = summarize_level(recs, 2)
    assert s.chunk_fallback_ok == 1
    assert s.token_note is not None and "1 of 4" in s.token_note and "chunks" in s.token_note
    assert s.token_sources == {SRC_CHUNKS: 1, SRC_USAGE: 3}
    assert s.prompt_mismatch == 1
    assert s.prompt_tokens_mean == pytest.approx(100.75)


def test_empty_level_has_zero_counts_and_no_values() -> None:
    s = summarize_level([], 16)
    assert (s.label, s.sent, s.ok, s.output_tokens) == ("c016", 0, 0, 0)
    assert s.wall_s is None and s.agg_tok_s is None and s.steady_tok_s is None


# ---------------------------------------------------------------- run


def meta(index: int, c: int, repeat: int = 0, status: str = "completed") -> dict[str, Any]:
    return {
        "index": index,
        "concurrency": c,
        "repeat": repeat,
        "budget": 2 * c,
        "warmup": 0,
        "status": status,
    }


def test_run_keeps_missing_levels_and_unplanned_levels() -> None:
    recs = four_requests() + [rec(0.0, 0.5, 2.0, concurrency=8, level=5)]
    levels = levels_of_records(recs, [meta(0, 2), meta(1, 16, status="incomplete")])
    assert [(s.label, s.sent, s.planned) for s in levels] == [
        ("c002", 4, True),
        ("c016", 0, True),
        ("c008", 1, False),
    ]
    assert levels[1].status == "incomplete" and levels[1].agg_tok_s is None
    assert levels[2].index == 5


def test_run_ignores_malformed_meta_levels() -> None:
    levels = levels_of_records(four_requests(), [{"index": 0}, meta(0, 2)])
    assert [(s.label, s.sent, s.planned) for s in levels] == [("c002", 4, True)]


def test_run_without_meta_groups_records() -> None:
    recs = four_requests() + [rec(0.0, 0.5, 2.0, concurrency=1, level=1)]
    levels = levels_of_records(recs, None)
    assert [(s.concurrency, s.sent, s.planned) for s in levels] == [(2, 4, False), (1, 1, False)]


# ---------------------------------------------------------------- repeats


def test_combine_repeats_mean_and_sample_std() -> None:
    a = LevelStats(concurrency=4, repeat=0, label="c004", agg_tok_s=10.0, per_req_tok_s=2.0)
    b = LevelStats(concurrency=4, repeat=1, label="c004.r1", agg_tok_s=14.0, per_req_tok_s=4.0)
    empty = LevelStats(concurrency=4, repeat=2, label="c004.r2")
    r = combine_repeats([a, b, empty])
    assert r.repeats == [0, 1, 2] and r.n == 2
    assert r.of("agg_tok_s") == pytest.approx(12.0)
    assert r.std("agg_tok_s") == pytest.approx(math.sqrt(8.0))  # ((2^2 + 2^2) / 1) ** 0.5
    assert r.of("per_req_tok_s") == pytest.approx(3.0)
    assert r.std("per_req_tok_s") == pytest.approx(math.sqrt(2.0))


def test_combine_repeats_single_and_errors() -> None:
    one = combine_repeats([LevelStats(concurrency=1, repeat=0, label="c001", agg_tok_s=5.0)])
    assert one.of("agg_tok_s") == 5.0 and one.std("agg_tok_s") is None
    with pytest.raises(ValueError):
        combine_repeats([])
    with pytest.raises(ValueError):
        combine_repeats([LevelStats(1, 0, "c001"), LevelStats(2, 0, "c002")])


def test_repeats_at_means_and_server_maxima() -> None:
    a = LevelStats(
        concurrency=4,
        repeat=0,
        label="c004",
        sent=8,
        agg_tok_s=10.0,
        dists={"ttft": Dist(1, p={50.0: 0.125})},
        server_running_max=4.0,
        server_queued_max=0.0,
    )
    b = LevelStats(
        concurrency=4,
        repeat=1,
        label="c004.r1",
        sent=8,
        agg_tok_s=14.0,
        server_running_max=3.0,
        server_queued_max=2.0,
    )
    other = LevelStats(concurrency=8, repeat=0, label="c008", sent=16, agg_tok_s=99.0)
    r = repeats_at([a, other, b], 4)
    assert r.repeats == [0, 1] and r.values("agg_tok_s") == [10.0, 14.0] and r.of("agg_tok_s") == 12.0
    assert r.of("ttft_p50_ms") == 125.0  # a repeat without a value does not count
    assert (r.of("server_running_max"), r.of("server_queued_max")) == (4.0, 2.0)  # max over repeats, not mean
    assert r.measured and r.of("per_req_tok_s") is None and r.values("per_req_tok_s") == []
    absent = repeats_at([a, b], 16)
    assert absent.repeats == [] and not absent.measured and absent.of("agg_tok_s") is None and absent.n == 0


def test_group_repeats_from_records() -> None:
    recs = four_requests() + [
        rec(t.t_send - T0, (t.t_first or 0) - T0, t.t_end - T0 + 10.0, repeat=1, level=1)
        for t in four_requests()
    ]
    levels = levels_of_records(recs, [meta(0, 2), meta(1, 2, repeat=1)])
    assert [s.label for s in levels] == ["c002", "c002.r1"]
    (g,) = group_repeats(levels)
    assert g.n == 2 and g.std("agg_tok_s") is not None and g.of("agg_tok_s") is not None


# ---------------------------------------------------------------- speculative accept length


def accept_length_from_records(recs: list[RequestRecord]) -> tuple[float | None, int]:
    """The acceptance length of the records alone, by the one definition (analysis.acceptance)."""
    a = acceptance(LevelColumns.of(recs), (), 0.0, 0.0)
    return (a.length, a.requests) if a is not None and a.length is not None else (None, 0)


def accept_length_from_counters(samples: list[ServerSample], start: float, end: float) -> float | None:
    a = acceptance(LevelColumns.of([]), samples, start, end)
    return a.length if a is not None else None


def test_accept_length_from_records_weighted_by_verify_steps() -> None:
    recs = [
        rec(0.0, 0.5, 5.0, tokens=10, verify=5, seq=0),  # 2.0 per step
        rec(0.0, 1.0, 4.0, tokens=12, requested=12, verify=4, seq=1),  # 3.0 per step
        rec(4.0, 4.5, 8.0, tokens=10, verify=None, seq=2),  # not a speculative reply
        rec(5.0, 5.5, 10.0, tokens=10, verify=0, seq=3),  # no verify steps: ignored
        rec(5.0, 5.5, 6.0, tokens=3, verify=1, status=SHORT, seq=4),  # not OK: ignored
    ]
    # (10 + 12) / (5 + 4) = 22 / 9, not the unweighted mean (2 + 3) / 2
    assert accept_length_from_records(recs) == (pytest.approx(22 / 9), 2)
    s = summarize_level(recs, 2)
    assert s.figure("accept") == pytest.approx(22 / 9)
    assert (
        s.acceptance is not None
        and s.acceptance.sources.get("length") == FROM_OLD_RECORDS
        and s.acceptance.requests == 2
    )
    assert accept_length_from_records(four_requests()) == (None, 0)
    plain = summarize_level(four_requests(), 2)
    assert plain.figure("accept") is None and (
        plain.acceptance is None or "length" not in plain.acceptance.sources
    )


def counter_samples() -> list[ServerSample]:
    """Around four_requests' window [T0, T0 + 10]: one sample before, two inside, one after."""
    return [
        ServerSample(T0 - 1.0, running=0.0, queued=0.0, spec_num_drafts=100.0, spec_num_accepted_tokens=50.0),
        ServerSample(
            T0 + 3.0, running=2.0, queued=None, spec_num_drafts=150.0, spec_num_accepted_tokens=100.0
        ),
        ServerSample(
            T0 + 9.0, running=4.0, queued=1.0, spec_num_drafts=200.0, spec_num_accepted_tokens=170.0
        ),
        ServerSample(
            T0 + 11.0, running=9.0, queued=9.0, spec_num_drafts=300.0, spec_num_accepted_tokens=400.0
        ),
    ]


def test_accept_length_from_counters_window() -> None:
    samples = counter_samples()
    # from the last sample at/before T0 (T0-1) to the last at/before T0+10 (T0+9):
    # 1 + (170 - 50) / (200 - 100) = 2.2
    assert accept_length_from_counters(samples, T0, T0 + 10.0) == pytest.approx(2.2)
    # sampling started inside the window: from the first sample inside it (T0+3) to T0+9
    assert accept_length_from_counters(samples[1:], T0, T0 + 10.0) == pytest.approx(1 + 70 / 50)
    # one usable sample only, or none: not measurable
    assert accept_length_from_counters(samples[:1], T0, T0 + 10.0) is None
    assert accept_length_from_counters([], T0, T0 + 10.0) is None
    # counter reset (server restart): Δdrafts <= 0
    reset = [samples[0], ServerSample(T0 + 5.0, spec_num_drafts=20.0, spec_num_accepted_tokens=10.0)]
    assert accept_length_from_counters(reset, T0, T0 + 10.0) is None
    # samples without counters (SGLang) are not used
    gauges = [ServerSample(T0 + 1.0, running=1.0), ServerSample(T0 + 2.0, running=1.0)]
    assert accept_length_from_counters(gauges, T0, T0 + 10.0) is None


def test_server_samples_inside_measured_window() -> None:
    s = summarize_level(four_requests(), 2, samples=counter_samples())
    # inside [T0, T0+10]: the samples at T0+3 and T0+9 only
    assert s.server_samples == 2
    assert s.server_running_max == 4.0 and s.server_running_mean == pytest.approx(3.0)
    assert s.server_queued_max == 1.0 and s.server_queued_mean == pytest.approx(1.0)  # null is skipped
    assert (
        s.figure("accept") == pytest.approx(2.2)
        and s.acceptance is not None
        and s.acceptance.sources.get("length") == FROM_COUNTERS
    )
    assert s.acceptance is not None and s.acceptance.requests == 0


def test_records_accept_length_wins_over_counters() -> None:
    recs = four_requests()
    recs[0] = rec(0.0, 0.5, 5.0, verify=4)
    s = summarize_level(recs, 2, samples=counter_samples())
    assert (
        s.figure("accept") == pytest.approx(2.5)
        and s.acceptance is not None
        and s.acceptance.sources.get("length") == FROM_OLD_RECORDS
    )


def test_no_samples_no_server_figures() -> None:
    s = summarize_level(four_requests(), 2, samples=[])
    assert s.server_samples == 0
    assert (s.server_running_max, s.server_running_mean, s.server_queued_max, s.server_queued_mean) == (
        None,
        None,
        None,
        None,
    )
    outside = [ServerSample(T0 + 20.0, running=5.0, queued=5.0)]
    assert summarize_level(four_requests(), 2, samples=outside).server_running_max is None
    assert summarize_level([], 2, samples=counter_samples()).server_samples == 0  # no records, no window


def test_summarize_run_splits_samples_by_level_window() -> None:
    later = [
        rec(t.t_send - T0 + 20.0, (t.t_first or 0) - T0 + 20.0, t.t_end - T0 + 20.0, concurrency=4, level=1)
        for t in four_requests()
    ]
    samples = [ServerSample(T0 + 25.0, running=4.0, queued=2.0), *reversed(counter_samples())]  # any order
    levels = levels_of_records(four_requests() + later, [meta(0, 2), meta(1, 4)], samples)
    assert [(s.label, s.server_samples, s.server_running_max, s.server_queued_max) for s in levels] == [
        ("c002", 2, 4.0, 1.0),
        ("c004", 1, 4.0, 2.0),
    ]
    # level 2's window [T0+20, T0+30] has no counter samples after T0+11: not measurable
    assert levels[1].figure("accept") is None


def test_server_sample_from_dict() -> None:
    d = {"t": T0, "level": 3, "running": 4, "queued": None, "spec_num_drafts": 10.5, "extra": "x"}
    assert ServerSample.from_dict(d) == ServerSample(T0, running=4.0, queued=None, spec_num_drafts=10.5)
    assert ServerSample.from_dict({"running": 1}) is None  # no time
    assert ServerSample.from_dict({"t": "soon"}) is None
    assert ServerSample.from_dict([1, 2]) is None
    assert ServerSample.from_dict({"t": T0, "running": True, "queued": "3"}) == ServerSample(T0)
    assert ServerSample.from_dict({"t": T0, "running": float("nan")}) == ServerSample(T0)


def test_tok_s_series_matches_the_window_integral_and_stays_linear() -> None:
    """Each bucket holds what _tokens_in_window says for it; long sparse levels cost their
    request-seconds, not buckets x records (a 20 000 s level once took minutes to report)."""
    import random

    from specload.analysis.metrics import Timeline, _window_tokens, tok_s_series

    rnd = random.Random(5)
    recs = []
    for i in range(200):
        s0 = rnd.uniform(0, 50)
        first = s0 + rnd.uniform(0.01, 2)
        end = first + rnd.uniform(0, 8)
        recs.append(rec(s0, first, end, tokens=rnd.randint(1, 300), seq=i))
    series = tok_s_series(recs, 1.0)
    t0, t1 = min(r.t_send for r in recs), max(r.t_end for r in recs)
    for i, value in enumerate(series):
        a, b = t0 + i, min(t1, t0 + i + 1)
        want = sum(_window_tokens(Timeline.of(recs), a, b)) / (b - a)
        assert value == pytest.approx(want, rel=1e-6, abs=1e-6), i
    assert sum(v * min(1.0, t1 - (t0 + i)) for i, v in enumerate(series)) == pytest.approx(
        sum(r.output_tokens for r in recs), rel=1e-9
    )
    sparse = [rec(i * 10.0, i * 10.0 + 0.5, i * 10.0 + 9.0, seq=i) for i in range(2000)]  # 20 000 s
    series = tok_s_series(sparse)  # (make bench measures the speed; this is the shape)
    assert len(series) == 19_999 and series[0] == pytest.approx(1 + 0.5 * 9 / 8.5) and series[9] == 0.0
    assert series[1] == pytest.approx(9 / 8.5) and series[10] == pytest.approx(series[0])


# ---------------------------------------------------------------- every figure computed reaches the output


def _full_levels() -> list[LevelStats]:
    """A concurrency level and a rate level whose records have everything a figure can be made of:
    failures (a 429), a short reply, chunk-counted tokens, spec verify counts, cached prompt
    tokens, request classes, turns and categories, reasoning, due times (some late), ITL histograms; server samples with
    gauges; an SLO."""
    from specload.core.slo import parse_slo

    out = []
    for rate in (None, 2.0):
        recs = []
        for i in range(40):
            t = T0 + i * 0.25 if rate else T0 + (i // 2) * 0.5
            status = FAILED if i == 5 else SHORT if i == 6 else OK
            n = 0 if status == FAILED else 9 if status == SHORT else 10
            r = make_record(
                t_send=t,
                t_first=None if status == FAILED else t + 0.125,
                t_last=None if status == FAILED else t + 0.375,
                t_end=t + 0.5 + (i % 3) * 0.25,
                output_tokens=n,
                level=0,
                concurrency=2,
                phase=PHASE_MEASURE,
                seq=i,
                backend="sglang",
                status=status,
                reason=None if status == OK else "why",
                http_status=429 if status == FAILED else 200,
                output_tokens_source=SRC_CHUNKS if i == 7 else SRC_USAGE,
                prompt_tokens=None if status == FAILED else 100 + i % 2,
                requested_output_tokens=10,
                requested_prompt_tokens=100 + i % 3,
                chunks=n,
                itl_max_s=None,
                spec_verify_ct=5 if status == OK else None,
                worker="w",
                itl=[[500, 5], [510, 4]] if status == OK else None,
                itl_unit="token",
                first_event_tokens=1,
                t_sched=t - (0.05 if i % 4 == 0 else 0.001) if rate else None,
                rate=rate,
                request_class="chat" if i % 2 else "code",
                turn=i % 2,
                cached_tokens=50 if status != FAILED else None,
                category="coding" if i % 3 else "math",
                t_first_answer=None if status == FAILED else t + 0.25,
                reasoning_tokens=None if status == FAILED else 4,
                reasoning_tokens_source=None if status == FAILED else SRC_USAGE,
            )
            recs.append(r)
        recs.append(dataclasses.replace(recs[1], phase=PHASE_WARMUP))
        samples = [ServerSample(t=T0 + k, running=2.0, queued=1.0) for k in range(12)]
        out.append(
            summarize_level(recs, 2, samples=samples, rate=rate, slo=parse_slo("ttft_p99=1s,tpot_p50=50ms"))
        )
    return out


# Inputs of a level (copied from run.json or the caller), not figures.
_GIVEN = {"concurrency", "repeat", "label", "index", "planned", "status", "rate", "extra"}


def test_every_level_stats_field_that_is_computed_reaches_the_output() -> None:
    """Each figure a fill computes is kept on the LevelStats and reaches level_json: no figure may be
    computed and then dropped (the way a table of fields kept per part once dropped one)."""
    from dataclasses import fields

    from specload.analysis.metrics import level_json

    levels = _full_levels()
    defaults = LevelStats(concurrency=2, repeat=0, label="")
    never = []
    for f in fields(LevelStats):
        if f.name in _GIVEN:
            continue
        if all(getattr(s, f.name) == getattr(defaults, f.name) for s in levels):
            never.append(f.name)
        for s in levels:
            assert f.name in level_json(s)
    # The accept length and the prefix cache rate came from the records here: their other sources
    # (the server's counters) have tests of their own above and in test_mixstats.
    assert never == [], f"computed by no fill, or never kept: {never}"


def test_a_levels_counters_end_at_its_close_sample() -> None:
    """The counters' deltas end at the sample taken as the level closed (after its last request,
    before the next level), not at the last periodic one inside it; another level's close, or one
    before the window's end, is no such sample."""
    from specload.analysis.metrics import counter_window_end

    samples = [
        ServerSample(t=9.0, closes=0),  # the level before
        ServerSample(t=12.5),
        ServerSample(t=14.0, closes=3),  # before the end: not a close of this window
        ServerSample(t=15.2, closes=2),
        ServerSample(t=15.1, closes=1),
        ServerSample(t=16.0, closes=1),
    ]
    assert counter_window_end(samples, 1, 15.0) == 15.1
    assert counter_window_end(samples, 3, 15.0) == 15.0
    assert counter_window_end(samples, None, 15.0) == 15.0
    assert ServerSample.from_dict({"t": 1.0, "closes": 2}) == ServerSample(t=1.0, closes=2)
    assert ServerSample.from_dict({"t": 1.0, "closes": True}) == ServerSample(t=1.0)
