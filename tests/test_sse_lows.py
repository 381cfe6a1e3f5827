# ruff: noqa: F811 - the fixtures of tests/test_stream.py, imported by name, are the tests' arguments
"""SSE oddities the review listed as low (ab9c161): legal SSE that no engine sends, and a server
that holds the connection after [DONE]. The scripted server and helpers are tests/test_stream.py's."""

from __future__ import annotations

import time
from typing import Any

import orjson

from specload.core.records import FAILED, OK
from tests.rundelay import RunDelay
from tests.test_stream import END, HEAD_SSE, chunk, clients, cmpl, run, serve, sse, usage  # noqa: F401 - the fixtures, by name


def _split(obj: Any) -> bytes:
    """One event's JSON over two data: lines, as legal SSE may send it."""
    text = orjson.dumps(obj)
    cut = text.index(b',"choices"') + 1
    return b"data: " + text[:cut] + b"\ndata: " + text[cut:] + b"\n\n"


def test_an_event_over_several_data_lines_is_one_event(serve: Any, clients: list[Any]) -> None:
    body = _split(cmpl("a")) + sse(cmpl("b", "length")) + _split(usage(2)) + sse(b"[DONE]")
    srv = serve([HEAD_SSE, chunk(body) + END])
    rec = run(srv, clients, requested=2)
    assert rec.status == OK, rec.reason
    assert rec.output_tokens == 2 and rec.chunks == 2


def test_lines_that_never_make_json_are_still_a_malformed_event(serve: Any, clients: list[Any]) -> None:
    body = sse(cmpl("a")) + b"data: {not json\ndata: nor this\n\n" + sse(b"[DONE]")
    srv = serve([HEAD_SSE, chunk(body) + END])
    rec = run(srv, clients, requested=2)
    assert rec.status == FAILED and "malformed event after 1 tokens" in (rec.reason or ""), rec.reason
    assert "nor this" in (rec.reason or "")


def test_a_stream_ending_mid_event_is_a_malformed_event(serve: Any, clients: list[Any]) -> None:
    srv = serve([HEAD_SSE, chunk(sse(cmpl("a")) + b'data: {"id":\n') + END])
    rec = run(srv, clients, requested=2)
    assert rec.status == FAILED and "malformed event after 1 tokens" in (rec.reason or ""), rec.reason


def test_a_server_holding_the_connection_after_done_costs_no_second(serve: Any, clients: list[Any]) -> None:
    """Before, each request waited 1 s for the last chunk, and the users' idle second showed as the
    client failing to keep C in flight."""
    held = [HEAD_SSE, chunk(sse(cmpl("a")) + sse(cmpl("b", "length")) + sse(usage(2)) + sse(b"[DONE]")), 5.0]
    srv = serve(held)
    t0, waited = time.monotonic(), RunDelay()  # (server and client: both in this process)
    recs = [run(srv, clients, requested=2) for _ in range(3)]
    took = time.monotonic() - t0
    assert [r.status for r in recs] == [OK] * 3
    assert took - waited.s < 1.0, (took, waited.s)  # 3 x (the request + 50 ms), not 3 x 1 s


def test_a_gzip_body_is_named_not_copied_into_the_record(serve: Any, clients: list[Any]) -> None:
    """Before: `HTTP 200 without an event stream: <the compressed bytes>`, into report.md and the log."""
    import gzip

    body = gzip.compress(sse(cmpl("a")) + sse(cmpl("b", "length")) + sse(usage(2)) + sse(b"[DONE]"))
    head = HEAD_SSE.replace(b"transfer-encoding", b"content-encoding: gzip\r\ntransfer-encoding")
    srv = serve([head, chunk(body) + END])
    rec = run(srv, clients, requested=2)
    assert rec.status == FAILED
    assert (rec.reason or "").startswith("HTTP 200 with a gzip-compressed body"), rec.reason
    assert "\x1f" not in (rec.reason or "") and "\ufffd" not in (rec.reason or "")


def test_cr_only_line_ends_are_named(serve: Any, clients: list[Any]) -> None:
    body = (sse(cmpl("a")) + sse(cmpl("b", "length")) + sse(usage(2)) + sse(b"[DONE]")).replace(b"\n", b"\r")
    srv = serve([HEAD_SSE, chunk(body) + END])
    rec = run(srv, clients, requested=2)
    assert rec.status == FAILED
    assert (rec.reason or "").startswith("HTTP 200 with SSE lines ended by CR alone"), rec.reason
