"""specload.client.stream.stream_request against a real TCP server speaking raw HTTP/1.1.

The server below is a gevent StreamServer on 127.0.0.1 (ephemeral port) that plays a *script*
per request: byte strings are written to the socket as they are (one TCP write each, Nagle off),
numbers are pauses. So every test controls exactly how the SSE bytes are cut across writes and
when each byte leaves, and the timing assertions compare the record with those pauses.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import gevent
import orjson
import pytest
from gevent.pool import Pool
from gevent.server import StreamServer

from specload.client.backends import get_backend
from specload.client.http import make_client, warm_up
from specload.client.stream import Interrupted, RequestSpec, stream_request
from specload.core import histogram
from specload.core.records import (
    FAILED,
    OK,
    PHASE_MEASURE,
    SHORT,
    SRC_CHUNKS,
    SRC_META,
    SRC_USAGE,
    RequestRecord,
    now,
)
from tests.rundelay import RunDelay

TOL = 0.020  # how late (s) the client may stamp bytes the server wrote (and a request reach the server)
EARLY = 0.003  # a timer may fire this much early
SLACK = 0.15  # loose upper bounds on scripted pauses, for a busy machine (the tight checks use TOL)

RST = object()  # script step: abort the connection (TCP RST)
CLOSE = object()  # script step: close the connection (FIN)

HEAD_SSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"transfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"
)


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n" % len(data) + data + b"\r\n"


END = b"0\r\n\r\n"  # last chunk


def sse(obj: Any, sep: bytes = b"\n") -> bytes:
    data = obj if isinstance(obj, bytes) else orjson.dumps(obj)
    return b"data: " + data + sep + sep


DONE = sse(b"[DONE]")


def cmpl(text: str, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1764475200,
        "model": "m",
        "choices": [
            {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        ],
        "usage": None,
    }


def usage(completion: int, prompt: int = 8) -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1764475200,
        "model": "m",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
        },
    }


def error_response(status: int, reason: str, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        % (status, reason.encode(), len(body))
        + body
    )


@dataclass
class ScriptServer:
    scripts: list[list[Any]]  # one per request, the last one repeats
    requests: list[tuple[bytes, bytes]] = field(default_factory=list)  # (head, body)
    connections: int = 0
    received_at: list[float] = field(default_factory=list)  # records.now() when each request was read
    sent_at: list[float] = field(default_factory=list)  # records.now() after each write, all requests
    port: int = 0

    def handle(self, sock: socket.socket, _addr: Any) -> None:
        self.connections += 1
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buf += data
                body, buf = buf[:length], buf[length:]
                self.requests.append((head, body))
                self.received_at.append(now())
                script = self.scripts[min(len(self.requests), len(self.scripts)) - 1]
                for step in script:
                    if step is RST:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        sock.close()
                        return
                    if step is CLOSE:
                        sock.close()
                        return
                    if isinstance(step, int | float):
                        gevent.sleep(step)
                    else:
                        sock.sendall(step)
                        self.sent_at.append(now())
        except OSError:
            return


@pytest.fixture
def serve() -> Iterator[Any]:
    started: list[tuple[StreamServer, Pool]] = []

    def start(*scripts: list[Any]) -> ScriptServer:
        s = ScriptServer(list(scripts))
        pool = Pool()
        srv = StreamServer(("127.0.0.1", 0), s.handle, spawn=pool)
        srv.start()
        s.port = srv.server_port
        started.append((srv, pool))
        return s

    yield start
    for srv, pool in started:
        srv.close()
        pool.kill(block=True, timeout=2)


@pytest.fixture
def clients() -> Iterator[list[Any]]:
    made: list[Any] = []
    yield made
    for c in made:
        c.close()


def spec(requested: int = 5, prompt: int = 8) -> RequestSpec:
    return RequestSpec(
        level=2,
        concurrency=16,
        phase=PHASE_MEASURE,
        seq=7,
        repeat=1,
        requested_output_tokens=requested,
        requested_prompt_tokens=prompt,
    )


def run(
    server: ScriptServer | int,
    clients: list[Any],
    backend: str = "openai",
    requested: int = 5,
    read_timeout: float = 2.0,
    client: Any = None,
) -> RequestRecord:
    port = server if isinstance(server, int) else server.port
    if client is None:
        client = make_client(f"http://127.0.0.1:{port}", read_timeout, 2.0)
        clients.append(client)
        warm_up(client)  # as a Locust user does: connection set-up is not part of any timed request
    b = get_backend(backend)
    prompt: list[int] | str = "1 the of and" if backend == "chat" else [1001, 1002, 1003, 1004]
    body = b.body(prompt, requested, "m", 0.0, {})
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    return stream_request(client, b.path, body, headers, b, spec(requested), "w1", read_timeout)


def check_clock(rec: RequestRecord) -> None:
    """Invariants every record keeps."""
    assert rec.e2e_s == pytest.approx(rec.t_end - rec.t_send, abs=1e-9)
    assert rec.e2e_s >= 0
    if rec.t_first is not None:
        assert rec.t_last is not None
        assert rec.t_send <= rec.t_first <= rec.t_last <= rec.t_end
        assert rec.ttft_s == pytest.approx(rec.t_first - rec.t_send, abs=1e-9)
    else:
        assert rec.t_last is None and rec.ttft_s is None


# the whole happy path, with awkward TCP cuts ------------------------------------------------------


@pytest.mark.parametrize("sep", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_openai_stream_cut_at_awkward_places(serve: Any, clients: list[Any], sep: bytes) -> None:
    c1 = chunk(sse(cmpl(" a"), sep))
    c2 = chunk(
        b": keep-alive" + sep + sep + b"data:" + orjson.dumps(cmpl(" b c")) + sep + sep
    )  # comment, no space
    c3 = chunk(sse(cmpl(" d e", "length"), sep))
    c4 = chunk(sse(usage(5), sep))  # the server counted 5 tokens in 3 content events
    c5 = chunk(sse(b"[DONE]", sep))
    script = [
        HEAD_SSE,
        0.15,  # time to first token
        c1[:7],  # chunk-size line and half of "data:"
        c1[7:] + c2[:30],  # rest of event 1, start of event 2 (cut inside its JSON)
        0.05,  # event 2 is incomplete for 50 ms
        c2[30:],
        0.05,
        c3 + c4 + c5 + END,  # two events, the terminator and the last chunk in one write
    ]
    srv = serve(script)
    rec = run(srv, clients, requested=5)

    assert rec.status == OK, rec.reason
    assert rec.reason is None
    assert rec.http_status == 200
    assert rec.output_tokens == 5
    assert rec.output_tokens_source == SRC_USAGE
    assert rec.prompt_tokens == 8
    assert rec.chunks == 3
    check_clock(rec)
    # Timing. The server logged when each write left it (sent_at[i] is write i of the script:
    # 0 headers, 1 and 2 complete event 1, 3 completes event 2, 4 carries event 3 and the end).
    sent, received = srv.sent_at, srv.received_at[0]
    assert rec.ttft_s >= 0.15 - EARLY  # the script's pause is a floor; a loaded server sends later, so
    # the upper bounds are held to when the server's writes actually left it
    assert -EARLY <= rec.t_first - sent[2] <= TOL  # stamped when event 1 was complete, not before
    assert rec.ttft_s <= (sent[2] - received) + TOL  # TTFT is the server's own delay, within 20 ms
    assert -EARLY <= rec.t_last - sent[4] <= TOL
    assert -EARLY <= rec.t_end - sent[4] <= TOL
    # The record's TPOT is the documented formula, over the server's count, not the chunk count.
    assert rec.tpot_s == pytest.approx((rec.t_last - rec.t_first) / (5 - 1), rel=1e-9)
    assert rec.decode_tok_s == pytest.approx((5 - 1) / (rec.t_last - rec.t_first), rel=1e-9)
    assert rec.per_request_tok_s == pytest.approx(5 / rec.e2e_s, rel=1e-9)
    assert rec.t_last - rec.t_first >= 0.10 - EARLY
    assert rec.itl_max_s >= 0.05 - EARLY
    assert rec.itl_max_s == pytest.approx(max(sent[3] - sent[2], sent[4] - sent[3]), abs=TOL)
    assert 0.25 - EARLY <= rec.e2e_s <= (sent[4] - received) + TOL
    # The spec and the worker are copied into the record.
    assert (rec.level, rec.concurrency, rec.phase, rec.seq, rec.repeat) == (2, 16, PHASE_MEASURE, 7, 1)
    assert (rec.requested_output_tokens, rec.requested_prompt_tokens) == (5, 8)
    assert (rec.backend, rec.worker, rec.spec_verify_ct) == ("openai", "w1", None)

    # What went over the wire.
    ((head, body),) = srv.requests
    assert head.startswith(b"POST /v1/completions HTTP/1.1\r\n")
    sent = orjson.loads(body)
    assert sent["prompt"] == [1001, 1002, 1003, 1004]
    assert sent["stream"] is True and sent["max_tokens"] == 5


def test_usage_missing_falls_back_to_labelled_chunk_count(serve: Any, clients: list[Any]) -> None:
    srv = serve(
        [HEAD_SSE, chunk(sse(cmpl("a")) + sse(cmpl("b"))), chunk(sse(cmpl("c", "length"))), chunk(DONE), END]
    )
    rec = run(srv, clients, requested=5)
    assert rec.status == OK
    assert rec.output_tokens == 3
    assert rec.output_tokens_source == SRC_CHUNKS
    assert rec.chunks == 3
    assert rec.prompt_tokens is None


def test_connection_kept_alive_between_requests(serve: Any, clients: list[Any]) -> None:
    ok = [HEAD_SSE, chunk(sse(cmpl("a")) + sse(cmpl("b", "length")) + sse(usage(2)) + DONE) + END]
    srv = serve(ok)
    client = make_client(f"http://127.0.0.1:{srv.port}", 2.0, 2.0)
    clients.append(client)
    recs = [run(srv, clients, requested=2, client=client) for _ in range(3)]
    assert [r.status for r in recs] == [OK, OK, OK]
    assert [r.output_tokens for r in recs] == [2, 2, 2]
    assert len(srv.requests) == 3
    assert srv.connections == 1


def test_terminating_chunk_after_a_pause_does_not_delay_the_record(serve: Any, clients: list[Any]) -> None:
    srv = serve([HEAD_SSE, chunk(sse(cmpl("a")) + sse(cmpl("b", "length")) + sse(usage(2)) + DONE), 0.2, END])
    rec = run(srv, clients, requested=2)
    assert rec.status == OK
    assert rec.e2e_s < 0.1  # t_end is the [DONE] line, not the lingering last chunk


def test_drained_connection_keeps_its_read_timeout(serve: Any, clients: list[Any]) -> None:
    first = [HEAD_SSE, chunk(sse(cmpl("a")) + sse(cmpl("b", "length")) + sse(usage(2)) + DONE), 0.05, END]
    slow = [1.2, HEAD_SSE, chunk(sse(cmpl("a")) + sse(cmpl("b", "length")) + sse(usage(2)) + DONE) + END]
    srv = serve(first, slow)
    client = make_client(f"http://127.0.0.1:{srv.port}", 3.0, 2.0)
    clients.append(client)
    rec1 = run(srv, clients, requested=2, read_timeout=3.0, client=client)
    assert rec1.status == OK
    rec2 = run(srv, clients, requested=2, read_timeout=3.0, client=client)  # 1.2 s TTFT < 3 s read timeout
    assert rec2.status == OK, rec2.reason


# short streams --------------------------------------------------------------------------------------


def test_stream_without_done_is_short(serve: Any, clients: list[Any]) -> None:
    srv = serve([HEAD_SSE, chunk(sse(cmpl("a b")) + sse(cmpl("c", "length"))), chunk(sse(usage(5))), END])
    rec = run(srv, clients, requested=5)
    assert rec.status == SHORT
    assert rec.reason == "stream ended without its terminator after 5 tokens"
    assert rec.http_status == 200
    assert rec.output_tokens == 5 and rec.chunks == 2
    check_clock(rec)


def test_fewer_tokens_than_requested_is_short(serve: Any, clients: list[Any]) -> None:
    srv = serve(
        [
            HEAD_SSE,
            chunk(sse(cmpl("a")) + sse(cmpl("b")) + sse(cmpl("c", "stop")) + sse(usage(3)) + DONE),
            END,
        ]
    )
    rec = run(srv, clients, requested=5)
    assert rec.status == SHORT
    assert rec.reason == "server counted 3 of 5 tokens asked for"
    assert rec.output_tokens == 3
    assert rec.output_tokens_source == SRC_USAGE


# failures --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"object":"error","message":"The server is overloaded, try again later.","type":"ServiceUnavailableError",'
        b'"param":null,"code":503}',
        b'{"error":{"message":"The server is overloaded, try again later.","type":"ServiceUnavailableError",'
        b'"param":null,"code":503}}',
    ],
    ids=["vllm-flat", "openai-nested"],
)
def test_http_503_with_error_json(serve: Any, clients: list[Any], body: bytes) -> None:
    srv = serve([error_response(503, "Service Unavailable", body)])
    rec = run(srv, clients)
    assert rec.status == FAILED
    assert rec.http_status == 503
    assert rec.reason.startswith("HTTP 503: ")
    assert rec.reason == "HTTP 503: The server is overloaded, try again later."
    assert rec.t_first is None and rec.chunks == 0 and rec.output_tokens == 0
    assert rec.tpot_s is None and rec.itl_max_s is None
    check_clock(rec)


def test_http_error_plain_text_body(serve: Any, clients: list[Any]) -> None:
    srv = serve([error_response(502, "Bad Gateway", b"<html>upstream\n  gone</html>")])
    rec = run(srv, clients)
    assert rec.status == FAILED
    assert rec.reason == "HTTP 502: <html>upstream gone</html>"


@pytest.mark.parametrize("cut", [RST, CLOSE], ids=["reset", "closed"])
def test_connection_cut_mid_stream(serve: Any, clients: list[Any], cut: object) -> None:
    srv = serve([HEAD_SSE, chunk(sse(cmpl("a"))), 0.02, chunk(sse(cmpl("b"))), 0.05, cut])
    rec = run(srv, clients)
    assert rec.status == FAILED
    assert "stream cut after 2 tokens" in rec.reason
    assert rec.chunks == 2
    assert rec.http_status == 200
    check_clock(rec)


def test_read_timeout_mid_stream(serve: Any, clients: list[Any]) -> None:
    srv = serve([HEAD_SSE, chunk(sse(cmpl("a"))), 1.0, chunk(sse(cmpl("b")))])
    rec = run(srv, clients, read_timeout=0.3)
    assert rec.status == FAILED
    assert "no data for 0.3 s" in rec.reason
    assert "after 1 tokens" in rec.reason
    assert rec.chunks == 1
    assert 0.3 - EARLY <= rec.e2e_s <= 0.3 + SLACK
    check_clock(rec)


def test_read_timeout_before_headers(serve: Any, clients: list[Any]) -> None:
    srv = serve([1.0, HEAD_SSE])
    rec = run(srv, clients, read_timeout=0.3)
    assert rec.status == FAILED
    assert rec.http_status is None
    assert "no response for 0.3 s" in rec.reason
    assert 0.3 - EARLY <= rec.e2e_s <= 0.3 + SLACK


def test_malformed_event(serve: Any, clients: list[Any]) -> None:
    bad = b'data: {"choices":[{"text":"zq-broken'
    srv = serve([HEAD_SSE, chunk(sse(cmpl("a"))), chunk(bad + b"\n\n"), chunk(DONE), END])
    rec = run(srv, clients)
    assert rec.status == FAILED
    assert "malformed event" in rec.reason
    assert "after 1 tokens" in rec.reason
    assert "zq-broken" in rec.reason
    assert rec.chunks == 1


def test_error_event_inside_stream(serve: Any, clients: list[Any]) -> None:
    err = {"error": {"object": "error", "message": "engine died", "type": "InternalServerError", "code": 500}}
    srv = serve([HEAD_SSE, chunk(sse(cmpl("a"))), chunk(sse(err)), chunk(DONE), END])
    rec = run(srv, clients)
    assert rec.status == FAILED
    assert rec.reason == "server error in stream after 1 tokens: engine died"


def test_connection_refused(clients: list[Any]) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # bound then closed, never listening: nothing answers on it
    rec = run(port, clients)
    assert rec.status == FAILED
    assert rec.reason == "connection refused"
    assert rec.http_status is None
    assert rec.t_first is None and rec.chunks == 0
    assert rec.e2e_s < 1.0
    check_clock(rec)


@pytest.fixture
def full_backlog() -> Iterator[int]:
    """A port whose accept queue is full: the kernel drops new SYNs, so connecting times out."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(0)
    port = ls.getsockname()[1]
    fillers = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        fillers.append(s)
    gevent.sleep(0.05)
    yield port
    for s in fillers:
        s.close()
    ls.close()


def test_connect_timeout_is_named_as_such(full_backlog: int, clients: list[Any]) -> None:
    client = make_client(f"http://127.0.0.1:{full_backlog}", 1.0, 0.3)
    clients.append(client)
    b = get_backend("openai")
    rec = stream_request(client, b.path, b.body([1], 5, "m", 0.0, {}), {}, b, spec(), "w1", 1.0, 0.3)
    assert rec.status == FAILED
    assert rec.http_status is None
    assert rec.e2e_s < 0.3 + SLACK  # it was the 0.3 s connect timeout that fired
    assert "0.3 s" in rec.reason, rec.reason


def test_stopping_the_user_mid_stream_raises_interrupted(serve: Any, clients: list[Any]) -> None:
    srv = serve([HEAD_SSE, chunk(sse(cmpl("a")) + sse(cmpl("b"))), 5.0, END])
    g = gevent.spawn(run, srv, clients)
    gevent.sleep(0.15)
    g.kill(block=True, timeout=2)
    assert isinstance(g.exception, Interrupted)
    rec = g.exception.record
    assert rec.status == FAILED
    assert rec.reason == "interrupted (test stopped) after 2 tokens"
    assert rec.chunks == 2


# chat and SGLang ---------------------------------------------------------------------------------------


def chat(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1764475200,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def test_chat_role_chunk_is_not_first_token(serve: Any, clients: list[Any]) -> None:
    srv = serve(
        [
            HEAD_SSE,
            chunk(sse(chat({"role": "assistant", "content": ""}))),  # at once, before any token
            0.2,
            chunk(sse(chat({"content": "Hi"}))),
            0.02,
            chunk(sse(chat({"content": " there"}))),
            chunk(sse(chat({"content": ""}, "length"))),
            chunk(sse({**chat({}), "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 2}})),
            chunk(DONE),
            END,
        ]
    )
    rec = run(srv, clients, backend="chat", requested=2)
    assert rec.status == OK, rec.reason
    assert rec.ttft_s >= 0.19
    assert rec.ttft_s <= 0.2 + SLACK
    sent = srv.sent_at  # 1: role chunk, 2: first content
    assert -EARLY <= rec.t_first - sent[2] <= TOL
    assert rec.t_first - sent[1] >= 0.19
    assert rec.chunks == 2
    assert rec.output_tokens == 2 and rec.prompt_tokens == 12
    assert rec.backend == "chat"
    assert orjson.loads(srv.requests[0][1])["messages"] == [{"role": "user", "content": "1 the of and"}]
    assert srv.requests[0][0].startswith(b"POST /v1/chat/completions ")


def sgl(completion: int, finish: str | None = None, svc: int | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": "9c1",
        "finish_reason": None if finish is None else {"type": finish, "length": completion},
        "prompt_tokens": 8,
        "completion_tokens": completion,
        "cached_tokens": 0,
    }
    if svc is not None:
        meta["spec_verify_ct"] = svc
    return {"text": "x" * completion, "output_ids": list(range(completion)), "meta_info": meta}


def test_sglang_multi_token_event_divides_the_gap(serve: Any, clients: list[Any]) -> None:
    srv = serve(
        [
            HEAD_SSE,
            0.05,
            chunk(sse(sgl(1, svc=1))),
            0.15,
            chunk(sse(sgl(4, svc=2))),  # 3 tokens after 150 ms: 50 ms per token
            0.02,
            chunk(sse(sgl(5, "length", svc=3))),  # 1 token after 20 ms
            chunk(DONE),
            END,
        ]
    )
    rec = run(srv, clients, backend="sglang", requested=5)
    assert rec.status == OK, rec.reason
    assert rec.output_tokens == 5
    assert rec.output_tokens_source == SRC_META
    assert rec.prompt_tokens == 8
    assert rec.spec_verify_ct == 3
    assert rec.chunks == 3
    # Largest gap per token is 150 ms / 3, not the raw 150 ms.
    sent = srv.sent_at  # 1, 2, 3: the three events
    assert rec.itl_max_s >= 0.05 - EARLY
    assert rec.itl_max_s < 0.1
    assert rec.itl_max_s == pytest.approx(max((sent[2] - sent[1]) / 3, sent[3] - sent[2]), abs=TOL)
    assert rec.tpot_s == pytest.approx((rec.t_last - rec.t_first) / 4, rel=1e-9)
    assert 0.05 - EARLY <= rec.ttft_s <= 0.05 + SLACK
    assert -EARLY <= rec.t_first - sent[1] <= TOL
    sent = orjson.loads(srv.requests[0][1])
    assert sent["input_ids"] == [1001, 1002, 1003, 1004]
    assert sent["sampling_params"]["max_new_tokens"] == 5
    assert srv.requests[0][0].startswith(b"POST /generate ")


# A lying or broken server: exactly one record per request, and the reason says what was wrong ------------


def test_usage_count_as_a_string_is_a_failed_record_not_a_crash(serve: Any, clients: list[Any]) -> None:
    bad = usage(5)
    bad["usage"]["completion_tokens"] = "5"
    srv = serve([HEAD_SSE, chunk(sse(cmpl("a")) + sse(cmpl("b", "length")) + sse(bad) + DONE) + END])
    rec = run(srv, clients)
    assert rec.status == FAILED and "completion_tokens is '5', not a count" in (rec.reason or ""), rec.reason


def test_null_error_field_is_no_error(serve: Any, clients: list[Any]) -> None:
    ev = cmpl("a", "length")
    ev["error"] = None
    u = usage(1)
    srv = serve([HEAD_SSE, chunk(sse(ev) + sse(u) + DONE) + END])
    rec = run(srv, clients, requested=1)
    assert rec.status == OK, rec.reason


@pytest.mark.parametrize(
    ("ctype", "body", "quoted"),
    [
        (b"application/json", b'{"error": {"message": "model is loading"}}', "model is loading"),
        (b"text/html", b"<html><body><h1>502 Bad Gateway</h1></body></html>", "502 Bad Gateway"),
    ],
    ids=["error-json", "html"],
)
def test_http_200_that_is_no_event_stream_fails_with_the_message(
    serve: Any, clients: list[Any], ctype: bytes, body: bytes, quoted: str
) -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: %b\r\ncontent-length: %d\r\n\r\n" % (ctype, len(body))
    rec = run(serve([head + body]), clients)
    assert rec.status == FAILED and rec.reason is not None
    assert rec.reason.startswith("HTTP 200 without an event stream") and quoted in rec.reason, rec.reason


def test_an_exception_nobody_foresaw_still_makes_one_record(
    serve: Any, clients: list[Any], monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    import specload.client.stream as stream

    def boom(*_a: Any, **_k: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(stream, "_record", boom)
    srv = serve([HEAD_SSE, chunk(sse(cmpl("a", "length")) + sse(usage(1)) + DONE) + END])
    rec = run(srv, clients, requested=1)
    assert rec.status == FAILED and rec.reason == "unexpected RuntimeError: a bug"
    assert (rec.level, rec.seq, rec.worker) == (2, 7, "w1")


def test_a_server_claiming_more_tokens_than_asked_is_not_believed(serve: Any, clients: list[Any]) -> None:
    srv = serve(
        [HEAD_SSE, chunk(sse(cmpl("a")) + sse(cmpl("b", "length")) + sse(usage(34_000_000_000)) + DONE) + END]
    )
    rec = run(srv, clients, requested=5)
    assert rec.status == FAILED
    assert (
        rec.reason == "server claimed 34000000000 tokens, more than the 5 asked for; counted the 2 streamed"
    )
    assert (rec.output_tokens, rec.output_tokens_source) == (2, SRC_CHUNKS)  # what enters Agg tok/s


# inter-token gaps and per-token figures (metrics audit F5-F7) --------------------------------------


def test_a_chunk_counted_record_has_no_tpot(serve: Any, clients: list[Any]) -> None:
    # No usage: the count is the chunks'. A chunk may hold several tokens, so TPOT stays empty.
    srv = serve([HEAD_SSE, chunk(sse(cmpl("a")) + sse(cmpl("b")) + sse(cmpl("c", "length")) + DONE) + END])
    rec = run(srv, clients, requested=3)
    assert rec.output_tokens_source == SRC_CHUNKS
    assert (rec.tpot_s, rec.per_request_tok_s, rec.decode_tok_s) == (None, None, None)


def test_sglang_records_every_gap_per_token(serve: Any, clients: list[Any]) -> None:
    srv = serve(
        [
            HEAD_SSE,
            0.02,
            chunk(sse(sgl(2))),  # the first event carries 2 tokens
            0.12,
            chunk(sse(sgl(5))),  # 3 tokens after 120 ms: three gaps of 40 ms
            0.01,
            chunk(sse(sgl(6, "length"))),  # 1 token after 10 ms
            chunk(DONE),
            END,
        ]
    )
    waited = RunDelay()
    rec = run(srv, clients, backend="sglang", requested=6)
    late = waited.s  # what the machine's load may have added to a gap (tests/rundelay.py)
    assert rec.status == OK, rec.reason
    assert rec.itl_unit == "token" and rec.first_event_tokens == 2
    hist = histogram.merge([rec.itl])
    assert histogram.count(hist) == 4  # 6 tokens, 2 of them in the first event
    assert 0.040 - 0.015 <= histogram.quantile(hist, 100) <= 0.040 + 0.015 + late, late
    assert 0.010 - 0.008 <= histogram.quantile(hist, 25) <= 0.010 + 0.008 + late, late
    assert rec.tpot_s == pytest.approx((rec.t_last - rec.t_first) / 4, rel=1e-9)


def test_openai_gaps_are_per_event(serve: Any, clients: list[Any]) -> None:
    srv = serve(
        [
            HEAD_SSE,
            0.01,
            chunk(sse(cmpl("a"))),
            0.03,
            chunk(sse(cmpl("b"))),
            0.03,
            chunk(sse(cmpl("c", "length")) + sse(usage(3)) + DONE) + END,
        ]
    )
    rec = run(srv, clients, requested=3)
    assert rec.status == OK and rec.itl_unit == "event" and rec.first_event_tokens == 1
    assert histogram.count(histogram.merge([rec.itl])) == 2


# the body read in the hub (StreamResponse.pump) -----------------------------------------------------


def test_events_are_read_in_the_hub_on_plain_tcp(serve: Any, clients: list[Any], monkeypatch: Any) -> None:
    """On plain TCP the events are read by an io watcher's callback in the hub, while the request's
    greenlet sleeps through the body: two greenlet switches per wake-up were ~6 us of client CPU per
    token (docs/bench.md). Only the bytes that came with the response head are read in the greenlet."""
    from gevent import get_hub, getcurrent

    from specload.client.backends.openai import CompletionsParser

    where: list[str] = []
    real = CompletionsParser.read

    def read(self: Any, ev: dict[str, Any]) -> int:
        where.append("hub" if getcurrent() is get_hub() else "greenlet")
        return real(self, ev)

    monkeypatch.setattr(CompletionsParser, "read", read)
    n = 20
    script: list[Any] = [HEAD_SSE, 0.01]
    for i in range(n):
        script += [chunk(sse(cmpl(str(i)))), 0.002]  # one write and one wake-up per event
    srv = serve(script + [chunk(sse(usage(n)) + DONE) + END])
    rec = gevent.spawn(run, srv, clients, "openai", n).get(timeout=10)
    assert rec.status == OK and rec.chunks == n and rec.output_tokens == n
    assert sum(c for _b, c in rec.itl) == n - 1
    assert where == ["hub"] * (n + 1)


def test_a_bug_met_while_reading_in_the_hub_is_one_failed_record(
    serve: Any, clients: list[Any], monkeypatch: Any
) -> None:
    """An exception in the hub's callback is raised in the request's greenlet, and the hub and the
    connection pool go on: the next request on the same client is read as usual."""
    from specload.client.backends.openai import CompletionsParser

    calls = [0]
    real = CompletionsParser.read

    def read(self: Any, ev: dict[str, Any]) -> int:
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("a bug in the parser")
        return real(self, ev)

    monkeypatch.setattr(CompletionsParser, "read", read)
    events = [HEAD_SSE] + [x for i in range(5) for x in (chunk(sse(cmpl(str(i)))), 0.01)]
    srv = serve(events + [chunk(sse(usage(5)) + DONE) + END])
    client = make_client(f"http://127.0.0.1:{srv.port}", 2.0, 2.0)
    clients.append(client)
    rec = run(srv, clients, requested=5, client=client)
    assert rec.status == FAILED and rec.reason == "RuntimeError after 2 tokens: a bug in the parser"
    assert rec.chunks == 2
    rec2 = run(srv, clients, requested=5, client=client)
    assert rec2.status == OK and rec2.chunks == 5 and rec2.output_tokens == 5
    gevent.sleep(0.05)  # a watcher left started would now spin or fire into a finished greenlet


def test_streams_read_in_the_hub_keep_their_own_times(serve: Any, clients: list[Any]) -> None:
    """Eight streams at once, each paced differently: every record's TTFT and gaps are its own."""
    pauses = [0.005 * (k + 1) for k in range(8)]
    servers = []
    for p in pauses:
        script: list[Any] = [HEAD_SSE, 0.03]
        for i in range(6):
            script += [chunk(sse(cmpl(str(i)))), p]
        servers.append(serve(script + [chunk(sse(usage(6)) + DONE) + END]))
    waited = RunDelay()  # servers and clients share this thread's hub
    t0 = time.monotonic()
    jobs = [gevent.spawn(run, s, clients, "openai", 6) for s in servers]
    # Each stream takes under 0.3 s and every read has a 2 s timeout: 10 s is a hang, unless the
    # machine's load kept this process from a CPU that long (tests/rundelay.py).
    while not all(j.ready() for j in jobs) and time.monotonic() - t0 < 10 + waited.s:
        gevent.joinall(jobs, timeout=0.5, raise_error=True)
    unfinished = [p for p, j in zip(pauses, jobs, strict=True) if not j.ready()]
    assert not unfinished, (unfinished, time.monotonic() - t0, waited.s)
    tol = TOL + waited.s  # plus what the machine's load made the hub wait for a CPU (tests/rundelay.py)
    for p, job in zip(pauses, jobs, strict=True):
        rec = job.value
        assert rec.status == OK and rec.chunks == 6
        check_clock(rec)
        assert 0.03 - EARLY <= rec.ttft_s <= 0.03 + tol, (rec.ttft_s, tol)
        # five gaps of p each between the six events
        assert 5 * p - EARLY <= rec.t_last - rec.t_first <= 5 * p + tol, (rec.t_last - rec.t_first, tol)
