"""specload.client.http.StreamResponse: the response head, the chunked decoder, the SSE line split and the
read-timeout watch of the streaming hot path.

The decoder is driven through a fake socket that hands out a recorded response cut at chosen
places (every byte offset, one byte at a time), so each boundary case of HTTP/1.1 chunked framing
meets the line splitter; the end-to-end tests run stream_request against the raw-socket script
server of tests/test_stream.py.
"""

from __future__ import annotations

import gc
import time
from typing import Any

import gevent
import orjson
import pytest
from geventhttpclient.response import HTTPConnectionClosed, HTTPParseError

from specload.client.http import StreamResponse, StreamTimeout, make_client
from specload.core.records import FAILED, OK
from tests import test_stream
from tests.rundelay import RunDelay
from tests.test_stream import CLOSE, DONE, END, HEAD_SSE, chunk, cmpl, run, sse, usage

serve = test_stream.serve  # fixtures: the raw-socket script server, the clients a test made
clients = test_stream.clients


class FakeSock:
    """A socket whose recv_into hands out the given pieces, then b"" (the peer closed)."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)
        self.timeout: float | None = 5.0

    def recv_into(self, buf: bytearray) -> int:
        if not self.pieces:
            return 0
        p = self.pieces.pop(0)
        assert len(p) <= len(buf)
        buf[: len(p)] = p
        return len(p)

    def gettimeout(self) -> float | None:
        return self.timeout

    def settimeout(self, t: float | None) -> None:
        self.timeout = t


class FakePool:
    def __init__(self) -> None:
        self.returned: list[Any] = []
        self.closed: list[Any] = []

    def return_socket(self, sock: Any) -> None:
        self.returned.append(sock)

    def release_socket(self, sock: Any) -> None:
        self.closed.append(sock)


def read_all(pieces: list[bytes]) -> tuple[list[bytes], StreamResponse, FakePool]:
    """Every line of the body, the response (drained, released) and the pool it went back to."""
    pool = FakePool()
    resp = StreamResponse(FakeSock(pieces), pool)
    out: list[bytes] = []
    while (lines := resp.lines()) is not None:
        out += lines
    resp.release()
    return out, resp, pool


def cuts(data: bytes, step: int = 1) -> list[list[bytes]]:
    """``data`` in two pieces at every offset (every ``step``-th), and one byte at a time."""
    return [[data[:k], data[k:]] if 0 < k < len(data) else [data] for k in range(0, len(data), step)] + [
        [data[i : i + 1] for i in range(len(data))]
    ]


EVENTS = [sse(cmpl(" a")), b": keep-alive\r\n\r\n", sse(cmpl(" b c"), b"\r\n"), sse(usage(2)), DONE]
BODY = b"".join(EVENTS)
LINES = BODY.split(b"\n")[:-1]  # every line, without its newline


def chunked(payload: bytes, sizes: list[int], ext: bool = False, trailer: bytes = b"") -> bytes:
    """``payload`` as chunks of the given sizes (cycled): chunks that split lines, lines that split chunks."""
    out, pos, i = [], 0, 0
    while pos < len(payload):
        n = sizes[i % len(sizes)]
        part = payload[pos : pos + n]
        out.append(b"%x%s\r\n%s\r\n" % (len(part), b";ext=1" if ext and i % 2 else b"", part))
        pos, i = pos + n, i + 1
    return b"".join(out) + b"0\r\n" + trailer + b"\r\n"


@pytest.mark.parametrize("sizes", [[len(BODY)], [1], [7, 300, 2], [len(EVENTS[0]), 5]], ids=str)
def test_chunked_body_cut_at_every_byte_offset(sizes: list[int]) -> None:
    wire = HEAD_SSE + chunked(BODY, sizes, ext=True)
    # 1-byte chunks: every byte offset of the head and the first events, then every 7th
    pieces_list = cuts(wire) if sizes != [1] else cuts(wire[:600]) + cuts(wire, 7)
    for pieces in pieces_list:
        if sum(map(len, pieces)) < len(wire):
            pieces = [*pieces, wire[sum(map(len, pieces)) :]]
        lines, resp, pool = read_all(pieces)
        assert lines == LINES, pieces
        assert resp.status == 200 and resp.complete and resp.pending == b""
        assert len(pool.returned) == 1 and not pool.closed  # a clean end: the connection is reused


def test_head_and_body_in_one_recv_lose_nothing() -> None:
    lines, resp, pool = read_all([HEAD_SSE + chunked(BODY, [50])])
    assert lines == LINES and pool.returned


def test_trailers_end_the_message_cleanly() -> None:
    wire = HEAD_SSE + chunked(BODY, [64], trailer=b"X-Checksum: 1\r\nX-Other: two\r\n")
    for pieces in cuts(wire):
        lines, resp, pool = read_all(pieces)
        assert lines == LINES and resp.complete and pool.returned and not pool.closed


@pytest.mark.parametrize("where", [1, 3, 40, -8, -3, -1])
def test_stream_cut_mid_chunk_raises_and_closes(where: int) -> None:
    wire = HEAD_SSE + chunked(BODY, [len(BODY)])
    cut = len(HEAD_SSE) + (where if where > 0 else len(wire) - len(HEAD_SSE) + where)
    pool = FakePool()
    resp = StreamResponse(FakeSock([wire[:cut]]), pool)
    with pytest.raises(HTTPConnectionClosed):
        while resp.lines() is not None:
            pass
    resp.release()
    assert pool.closed and not pool.returned


def test_bad_chunk_size_is_a_parse_error() -> None:
    pool = FakePool()
    resp = StreamResponse(FakeSock([HEAD_SSE + b"zz\r\nabc\r\n"]), pool)
    with pytest.raises(HTTPParseError):
        resp.lines()
    resp.release()
    assert pool.closed


def test_content_length_body() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n" % len(BODY)
    for pieces in cuts(head + BODY):
        lines, resp, pool = read_all(pieces)
        assert lines == LINES and resp.complete and pool.returned and not pool.closed


def test_content_length_with_bytes_past_the_end_is_not_reused() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(BODY)
    lines, resp, pool = read_all([head + BODY + b"garbage"])
    assert lines == LINES and pool.closed and not pool.returned


def test_body_until_close() -> None:
    head = b"HTTP/1.0 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
    lines, resp, pool = read_all([head, BODY[:30], BODY[30:] + b"data: no newline"])
    assert lines == LINES and resp.pending == b"data: no newline"
    assert resp.complete and pool.closed and not pool.returned  # never reusable


def test_connection_close_header_is_honoured() -> None:
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nConnection: close\r\n\r\n"
    lines, resp, pool = read_all([head + chunked(BODY, [9])])
    assert lines == LINES and resp.complete and pool.closed


def test_interim_response_is_skipped() -> None:
    lines, resp, pool = read_all([b"HTTP/1.1 100 Continue\r\n\r\n", HEAD_SSE + chunked(BODY, [20])])
    assert resp.status == 200 and lines == LINES and pool.returned


def test_error_body_read_up_to_a_limit() -> None:
    body = b'{"error": {"message": "overloaded"}}'
    head = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: %d\r\n\r\n" % len(body)
    pool = FakePool()
    resp = StreamResponse(FakeSock([head, body[:5], body[5:]]), pool)
    assert resp.status == 503 and resp.read(2000) == body
    resp.release()
    assert pool.returned
    pool = FakePool()
    resp = StreamResponse(FakeSock([head + body[:12], body[12:]]), pool)
    assert resp.read(10) == body[:10]
    resp.release()
    assert pool.closed  # the rest was never read


def test_closed_before_any_byte_is_a_stale_connection() -> None:
    pool = FakePool()
    with pytest.raises(HTTPConnectionClosed):
        StreamResponse(FakeSock([]), pool)
    with pytest.raises(HTTPParseError):
        StreamResponse(FakeSock([b"HTTP/1.1 200 OK\r\n"]), pool)
    gc.collect()
    assert not pool.closed and not pool.returned  # post() closes it, exactly once


def test_stale_connection_is_closed_once_and_the_request_resent(serve: Any, clients: list[Any]) -> None:
    """A server that closes every connection after its stream, keep-alive or not (llama.cpp): the
    next request meets a closed connection, is resent on a new one, and the pool's count of
    connections stays right (one closed twice would break its semaphore)."""
    payload = sse(cmpl("a")) + sse(cmpl("b", "length")) + sse(usage(2)) + DONE
    srv = serve([HEAD_SSE, chunk(payload) + END, CLOSE])
    client = make_client(f"http://127.0.0.1:{srv.port}", 2.0, 2.0)
    clients.append(client)
    for _ in range(4):
        rec = run(srv, clients, requested=2, client=client)
        gc.collect()
        assert rec.status == OK, rec.reason
    assert len(srv.requests) >= 4 and srv.connections == len(srv.requests)  # a connection per request


# end to end, through stream_request ---------------------------------------------------------------


def test_content_length_stream_is_ok_and_keeps_the_connection(serve: Any, clients: list[Any]) -> None:
    body = sse(cmpl("a")) + sse(cmpl("b", "length")) + sse(usage(2)) + DONE
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n" % len(body)
    srv = serve([head, body[:20], 0.01, body[20:]])
    client = make_client(f"http://127.0.0.1:{srv.port}", 2.0, 2.0)
    clients.append(client)
    recs = [run(srv, clients, requested=2, client=client) for _ in range(2)]
    assert [(r.status, r.output_tokens) for r in recs] == [(OK, 2), (OK, 2)]
    assert srv.connections == 1


def test_trailers_after_done_keep_the_connection(serve: Any, clients: list[Any]) -> None:
    payload = sse(cmpl("a")) + sse(cmpl("b", "length")) + sse(usage(2)) + DONE
    srv = serve([HEAD_SSE, chunk(payload), b"0\r\nX-Usage: 2\r\n\r\n"])
    client = make_client(f"http://127.0.0.1:{srv.port}", 2.0, 2.0)
    clients.append(client)
    recs = [run(srv, clients, requested=2, client=client) for _ in range(2)]
    assert [r.status for r in recs] == [OK, OK]
    assert srv.connections == 1


def test_read_timeout_rearms_while_bytes_trickle_in(serve: Any, clients: list[Any]) -> None:
    """Gaps shorter than the read timeout never fire it, however long the stream; a silence of the
    full timeout does, at its time, with the reason's words."""
    steps: list[Any] = [HEAD_SSE]
    for i in range(8):
        steps += [chunk(sse(cmpl(f" {i}"))), 0.15]  # 1.2 s of stream, gaps of 0.15 s < 0.4 s
    steps += [1.5, chunk(sse(cmpl("late")))]
    srv = serve(steps)
    t0, waited = time.perf_counter(), RunDelay()  # (server and client: both in this process)
    rec = run(srv, clients, requested=20, read_timeout=0.4)
    took = time.perf_counter() - t0
    assert rec.status == FAILED
    assert rec.reason == "no data for 0.4 s (read timeout) after 8 tokens", rec.reason
    assert rec.t_end - rec.t_last == pytest.approx(0.4, abs=0.1 + waited.s)
    assert took - waited.s < 1.5 + 0.15 * 8  # it did not wait for the late byte


def test_a_stream_that_arrives_in_one_recv_still_has_distinct_times(serve: Any, clients: list[Any]) -> None:
    """A fast server (llama.cpp with a tiny model) can put a whole stream in one TCP segment: each
    event is still stamped as it is taken, in order, so the record keeps a TPOT."""
    payload = b"".join(sse(cmpl(f" {i}")) for i in range(5)) + sse(usage(5)) + DONE
    rec = run(serve([HEAD_SSE + chunk(payload) + END]), clients, requested=5)
    assert rec.status == OK and rec.t_first < rec.t_last and rec.tpot_s is not None and rec.tpot_s > 0


def test_watch_throws_into_a_silent_reader_only() -> None:
    class Silent(FakeSock):
        def recv_into(self, buf: bytearray) -> int:
            if self.pieces:
                return super().recv_into(buf)
            gevent.sleep(5)
            return 0

    resp = StreamResponse(Silent([HEAD_SSE]), FakePool())
    disarm = resp.watch(0.1)
    t0 = time.perf_counter()
    with pytest.raises(StreamTimeout):
        resp.lines()
    assert 0.09 <= time.perf_counter() - t0 < 1.0
    disarm()
    assert resp._sock.gettimeout() == 5.0  # the socket's own timeout is back
    resp = StreamResponse(Silent([HEAD_SSE, chunk(sse(cmpl("a")))]), FakePool())
    disarm = resp.watch(0.1)
    assert resp.lines() == [b"data: " + orjson.dumps(cmpl("a")), b""]
    disarm()
    gevent.sleep(0.2)  # a disarmed watch never fires


# shipping a record: the message dicts are what dataclasses.asdict gives -----------------------


def test_record_and_grant_dicts_equal_asdict(serve: Any, clients: list[Any]) -> None:
    from dataclasses import asdict

    from specload.locust.protocol import WIRE_VERSION, RecordMsg, TicketReply
    from specload.sweep.levels import Grant

    payload = sse(cmpl("a")) + sse(cmpl("b")) + sse(cmpl("c", "length")) + sse(usage(3)) + DONE
    rec = run(serve([HEAD_SSE, chunk(payload) + END]), clients, requested=3)
    assert rec.status == OK and rec.itl
    d = rec.to_dict()
    assert d == asdict(rec) and list(d) == list(asdict(rec))
    assert rec.to_json() == orjson.dumps({k: v for k, v in asdict(rec).items() if v is not None})
    assert RecordMsg.of(rec, "t").to_wire() == {
        "v": WIRE_VERSION,
        "record": asdict(rec),
        "ticket": "t",
        "auth": "",
    }
    g = Grant(1, 16, 0, "measure", 7, 100, 0.25, 2.0)
    assert TicketReply("u", g, None, "t").to_wire()["grant"] == asdict(g)
    assert TicketReply.from_wire(TicketReply("u", g, None, "t").to_wire()).grant == g


# the request's own socket work: one send, the head read under the stream's watch, a cheap liveness check


def test_a_request_bigger_than_the_socket_buffer_is_sent_whole(serve: Any, clients: list[Any]) -> None:
    """The first non-blocking send takes what fits; gevent's sendall sends the rest."""
    from specload.client.backends import get_backend
    from specload.client.stream import stream_request
    from tests.test_stream import spec

    srv = serve([HEAD_SSE, chunk(sse(cmpl("a", "length")) + sse(usage(1)) + DONE) + END])
    client = make_client(f"http://127.0.0.1:{srv.port}", 5.0, 2.0)
    clients.append(client)
    b = get_backend("openai")
    prompt = list(range(1000, 1000 + 2_000_000 // 6))  # ~2.3 MB of JSON: many socket buffers
    body = b.body(prompt, 1, "m", 0.0, {})
    rec = stream_request(client, b.path, body, {}, b, spec(1), "w1", 5.0)
    assert rec.status == OK, rec.reason
    assert orjson.loads(srv.requests[0][1]) == body


def test_the_pooled_connection_gets_its_timeout_back(serve: Any, clients: list[Any]) -> None:
    """The watch takes the socket's timeout away for the head and the body; the connection goes back
    to the pool with it (the next request's send relies on it)."""
    payload = sse(cmpl("a")) + sse(cmpl("b", "length")) + sse(usage(2)) + DONE
    srv = serve([HEAD_SSE, chunk(payload) + END])
    client = make_client(f"http://127.0.0.1:{srv.port}", 1.5, 2.0)
    clients.append(client)
    assert run(srv, clients, requested=2, client=client, read_timeout=1.5).status == OK
    pool = client._connection_pool
    sock = pool.get_socket()
    assert sock.gettimeout() == 1.5
    pool.return_socket(sock)


def test_a_head_that_never_comes_leaves_no_watch_behind(serve: Any, clients: list[Any]) -> None:
    """A read timeout before the head is thrown by the stream's watch; the watch is gone afterwards
    (one left armed would throw into the user's greenlet later, anywhere)."""
    from specload.client.http import post

    srv = serve([1.0, HEAD_SSE])
    client = make_client(f"http://127.0.0.1:{srv.port}", 5.0, 2.0)
    clients.append(client)
    t0 = time.perf_counter()
    with pytest.raises(StreamTimeout):
        post(client, "/v1/completions", b"{}", {}, read_timeout=0.2)
    assert 0.15 < time.perf_counter() - t0 < 0.9
    gevent.sleep(0.5)  # no StreamTimeout arrives here


def test_post_is_unwatched_when_the_connection_is_stale() -> None:
    pool = FakePool()
    with pytest.raises(HTTPConnectionClosed):
        StreamResponse(FakeSock([]), pool, read_timeout=0.1)
    gevent.sleep(0.3)  # the watch armed for that head was disarmed: nothing is thrown here


def test_alive_check_is_what_select_said() -> None:
    """Idle and silent: alive; the peer closed it or sent something nobody asked for: not reused."""
    from gevent import socket as gsocket

    from specload.client.http import _alive_check

    asked: list[Any] = []
    alive = _alive_check(lambda s: asked.append(s) or True)
    a, b = gsocket.socketpair()
    try:
        assert alive(a) is True
        b.sendall(b"x")
        gevent.sleep(0.01)
        assert alive(a) is False
        assert a.recv(1) == b"x"  # only peeked: the bytes are still there
        assert alive(a) is True
        b.close()
        gevent.sleep(0.01)
        assert alive(a) is False
    finally:
        a.close()
    assert alive(a) is False  # closed here: no descriptor
    other = object()
    assert alive(other) is True and asked == [other]  # TLS and the like: the pool's own check


def test_alive_check_works_above_select_s_limit() -> None:
    """select() cannot take a descriptor above 1023 (FD_SETSIZE): gevent's select said "dead" for
    every connection of a client with ~1000 users, so each request reconnected. MSG_PEEK can."""
    import os
    import resource

    from gevent import socket as gsocket

    from specload.client.http import _alive_check

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft <= 1100:
        pytest.skip(f"RLIMIT_NOFILE {soft}: no descriptor above 1023 to try")
    a, b = gsocket.socketpair()
    high = gsocket.socket(fileno=os.dup2(a.fileno(), 1100))
    try:
        assert _alive_check(lambda s: False)(high) is True
    finally:
        for s in (high, a, b):
            s.close()
