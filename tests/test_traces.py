"""Trace readers: each format's units fixed by its reader, checked on slices of the real files
(tests/fixtures/traces, whose counts, token totals and spans were computed from the rows with awk
and a JSON parser, not with specload), and a wrong unit refused."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from specload.workload.traces import Layout, TraceError, TraceRequest, read_trace
from specload.workload.traces.window import Window, cut, due_offsets, ideal_hit_rate, prefix_blocks_seen

FIX = Path(__file__).parent / "fixtures" / "traces"
MOONCAKE = FIX / "mooncake_conversation_head300.jsonl"
AZURE = FIX / "azure2023_code_head300.csv"
BURST = FIX / "burstgpt_layout.csv"


def test_mooncake_slice_matches_the_file() -> None:
    t = read_trace(MOONCAKE, "mooncake")
    assert (t.rows, len(t.requests)) == (300, 300)
    assert t.input_tokens == 4_269_971 and t.output_tokens == 113_079
    assert t.span_s == pytest.approx(102.0)  # 102000 ms from the first row to the last
    assert [r.index for r in t.requests] == list(range(300))  # already in time order


def test_mooncake_units_are_milliseconds_and_512_token_blocks() -> None:
    t = read_trace(MOONCAKE, "mooncake")
    assert t.time_unit == "ms" and t.block_size == 512
    # Every row has exactly ceil(input_length / 512) blocks: 16-token blocks (vLLM's default) would
    # need 32x as many ids; and the file's 102000 timestamp units are 102 s of traffic.
    assert all(len(r.hash_ids) == math.ceil(r.input_tokens / 512) for r in t.requests)
    raw = [line for line in MOONCAKE.read_text().splitlines() if '"timestamp": 102000' in line]
    assert raw and t.requests[-1].arrival_s == pytest.approx(102.0)


def test_mooncake_read_as_seconds_is_refused_saying_why(tmp_path: Path) -> None:
    # The whole file's span (3,536,999) read as seconds: 41 days.
    p = tmp_path / "long.jsonl"
    p.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
        '{"timestamp": 3536999, "input_length": 10, "output_length": 5}\n'
    )
    with pytest.raises(TraceError, match=r"3\.5 million 's' units = 41 days.*ms would make it 59 minutes"):
        read_trace(p, "jsonl", Layout("s"))
    assert read_trace(p, "jsonl", Layout("ms")).span_s == pytest.approx(3536.999)


def test_a_millisecond_trace_read_as_nanoseconds_is_refused_as_too_dense() -> None:
    # 300 requests in 102000 ns: 2.9 million requests/s.
    with pytest.raises(
        TraceError, match=r"requests/s on average: the time unit does not fit.*ms would make it 102 s"
    ):
        read_trace(MOONCAKE, "jsonl", Layout("ns", hash_field="hash_ids", block_size=512))


def test_azure_slice_matches_the_file() -> None:
    t = read_trace(AZURE, "azure")
    assert (t.rows, len(t.requests)) == (300, 300)
    assert t.input_tokens == 627_529 and t.output_tokens == 7_126
    # 18:20:40.8181990 - 18:17:03.9799600, the seven decimals kept to the microsecond
    assert t.span_s == pytest.approx(216.838239, abs=1e-6)
    assert t.time_unit == "datetime" and t.block_size is None
    assert t.requests[0].input_tokens == 4808 and t.requests[0].output_tokens == 10


def test_azure_bad_timestamp_names_the_row(tmp_path: Path) -> None:
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,5,5\n1700000000,5,5\n")
    with pytest.raises(TraceError, match=r"row 1: TIMESTAMP '1700000000' is not a date-time"):
        read_trace(p, "azure")


def test_burstgpt_layout_seconds_and_failed_rows_counted_out() -> None:
    t = read_trace(BURST, "burstgpt")
    assert t.rows == 6 and len(t.requests) == 5
    assert t.skipped == {"no output tokens": 1}  # the row with 0 response tokens
    assert t.time_unit == "s" and t.span_s == pytest.approx(3600.0)
    assert [r.index for r in t.requests] == [0, 2, 3, 4, 5]  # file rows, the skipped one keeps its number
    assert t.input_tokens == 472 + 417 + 1360 + 33 + 2801


def test_rows_out_of_order_are_sorted_and_keep_their_file_row(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("t,i,o,h\n2.5,10,3,1 2\n1.0,20,4,[1]\n1.0,30,5,\n")
    t = read_trace(p, "csv", Layout("s", "t", "i", "o", "h", 16))
    assert [r.index for r in t.requests] == [1, 2, 0]
    assert [r.arrival_s for r in t.requests] == [0.0, 0.0, 1.5]
    assert t.requests[2].hash_ids == (1, 2) and t.block_size == 16


def test_generic_needs_unit_and_block_size_declared(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1, "h": [1]}\n')
    with pytest.raises(TraceError, match="time unit declared"):
        read_trace(p, "jsonl", Layout(""))
    with pytest.raises(TraceError, match="needs its block size declared"):
        read_trace(p, "jsonl", Layout("ms", hash_field="h"))


def test_missing_field_and_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 1}\n')
    with pytest.raises(TraceError, match="row 0: no 'output_length'"):
        read_trace(p, "mooncake")
    with pytest.raises(TraceError, match="cannot read the trace file"):
        read_trace(tmp_path / "none.jsonl", "mooncake")


def test_window_cuts_in_trace_time_and_offsets_scale_by_the_speedup() -> None:
    t = read_trace(MOONCAKE, "mooncake")
    w = cut(t.requests, Window(start_s=10.0, duration_s=20.0))
    assert all(10.0 <= r.arrival_s < 30.0 for r in w)
    n_in = sum(1 for r in t.requests if 10.0 <= r.arrival_s < 30.0)
    assert len(w) == n_in > 0
    assert len(cut(t.requests, Window(first_n=7))) == 7
    offs = due_offsets(w, speedup=2.0)
    assert offs[0] == 0.0 and offs[-1] == pytest.approx((w[-1].arrival_s - w[0].arrival_s) / 2)
    with pytest.raises(TraceError, match="no request in the window"):
        cut(t.requests, Window(start_s=1000.0))


def test_ideal_hit_rate_by_hand() -> None:
    reqs = [
        TraceRequest(0, 0.0, 10, 1, (1, 2, 3)),  # blocks of 4: 4+4+2 tokens, all new
        TraceRequest(1, 1.0, 12, 1, (1, 2, 9)),  # 1 and 2 seen: 8 tokens
        TraceRequest(2, 2.0, 6, 1, (7, 2)),  # 7 new ends the prefix: 2 is not counted
        TraceRequest(3, 3.0, 6, 1, (1, 2)),  # 4 + 2 (its last block is 2 tokens)
    ]
    assert prefix_blocks_seen(reqs, 4) == [0, 8, 0, 6]
    assert ideal_hit_rate(reqs, 4) == pytest.approx(14 / 34)
    assert ideal_hit_rate(reqs, None) is None


def test_mooncake_slice_shares_its_first_block() -> None:
    # Every conversation row starts with hash id 0 (one system prompt): from the second request on,
    # at least its first 512 tokens are seen.
    t = read_trace(MOONCAKE, "mooncake")
    seen = prefix_blocks_seen(t.requests, 512)
    assert all(s >= 512 for s in seen[1:]) and seen[0] == 0
