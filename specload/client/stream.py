"""One streaming generation request, timed, turned into a RequestRecord.

This is the load generator's hot path. Per wake-up it does one ``recv_into`` and one pass that
strips the HTTP framing and splits the SSE lines (``specload.client.http.StreamResponse``; on plain TCP
in the gevent hub itself, with no greenlet switch), and per ``data:`` line a prefix check, one
``perf_counter`` and the backend parser's single ``orjson.loads``. Each event is stamped as it is
taken from the buffer, before it is parsed, so its own parse cost never shows up in TTFT or
inter-token gaps. Every outcome, including every failure, produces exactly one record: the sweep's
request budget relies on it.
"""

from __future__ import annotations

import errno
import math
import socket
import time
from dataclasses import dataclass
from typing import Any

import orjson
from gevent import GreenletExit
from geventhttpclient import HTTPClient
from geventhttpclient.response import HTTPConnectionClosed, HTTPParseError

from specload.client.backends import Backend, MalformedEvent
from specload.client.http import StreamResponse, describe_connect_error, post, server_message
from specload.core.histogram import FLOOR_S, RATIO, to_pairs
from specload.core.records import (
    FAILED,
    ITL_PER_EVENT,
    ITL_PER_TOKEN,
    OK,
    SHORT,
    SRC_CHUNKS,
    RequestRecord,
    make_record,
    now,
)
from specload.core.text import shorten

_DONE = b"[DONE]"
# What a request on a connection the server already closed raises, before any response byte.
_STALE = (HTTPConnectionClosed, ConnectionResetError, BrokenPipeError)
_ERROR_BODY_LIMIT = 2000
# Tokens read from every stream of this process so far: the web UI's live tok/s while requests are
# still streaming (records only exist once a request ends). One add per event.
streamed_tokens = [0]
# specload.core.histogram's binning, inlined in the read loop (one log per event).
_log = math.log
_FLOOR = FLOOR_S
_INV_FLOOR = 1.0 / FLOOR_S
_INV_LOG_RATIO = 1.0 / math.log(RATIO)


class Interrupted(Exception):
    """The request was cut short because the test is stopping; carries what was measured."""

    def __init__(self, record: RequestRecord) -> None:
        super().__init__(record.reason)
        self.record = record


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """Where a request belongs in the sweep; copied into its record."""

    level: int
    concurrency: int
    phase: str
    seq: int
    repeat: int
    requested_output_tokens: int
    requested_prompt_tokens: int
    t_sched: float | None = None  # rate levels: when the request was due
    rate: float | None = None  # the level's requests/s (None: a concurrency level)
    # The workload's labels (specload.workload.request), copied into the record as they are.
    request_class: str | None = None
    turn: int | None = None
    conversation: str | None = None
    prefix_group: int | None = None


def _describe_read_error(e: BaseException, tokens: int, read_timeout: float) -> str:
    if isinstance(e, TimeoutError | socket.timeout):
        return f"no data for {read_timeout:g} s (read timeout) after {tokens} tokens"
    if isinstance(e, HTTPConnectionClosed | HTTPParseError | ConnectionError) or (
        isinstance(e, OSError) and e.errno in (errno.ECONNRESET, errno.EPIPE)
    ):
        return f"stream cut after {tokens} tokens ({type(e).__name__}: {shorten(str(e), 80)})"
    return f"{type(e).__name__} after {tokens} tokens: {shorten(str(e), 120)}"


def stream_request(
    client: HTTPClient,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    backend: Backend,
    spec: RequestSpec,
    worker: str,
    read_timeout: float,
    connect_timeout: float | None = None,
    text: list[str] | None = None,
) -> RequestRecord:
    """One request, one record, whatever happens: an answer nobody foresaw (or a bug here) becomes a
    failed record with the exception named, so a level never waits for a record that cannot come.

    ``text``: a list that receives the answer's text as it streams (a conversation resends it); None,
    the default, keeps no text."""
    t_send = now()
    try:
        return _stream_request(
            client, path, body, headers, backend, spec, worker, read_timeout, connect_timeout, text
        )
    except Interrupted:
        raise
    except Exception as e:  # noqa: BLE001
        return make_record(
            t_send=t_send,
            t_first=None,
            t_last=None,
            t_end=now(),
            output_tokens=0,
            level=spec.level,
            concurrency=spec.concurrency,
            phase=spec.phase,
            seq=spec.seq,
            backend=backend.name,
            status=FAILED,
            reason=f"unexpected {type(e).__name__}: {shorten(str(e), 120)}",
            http_status=None,
            output_tokens_source=SRC_CHUNKS,
            prompt_tokens=None,
            requested_output_tokens=spec.requested_output_tokens,
            requested_prompt_tokens=spec.requested_prompt_tokens,
            chunks=0,
            itl_max_s=None,
            spec_verify_ct=None,
            worker=worker,
            repeat=spec.repeat,
            t_sched=spec.t_sched,
            rate=spec.rate,
            request_class=spec.request_class,
            turn=spec.turn,
            conversation=spec.conversation,
            prefix_group=spec.prefix_group,
        )


def _stream_request(
    client: HTTPClient,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    backend: Backend,
    spec: RequestSpec,
    worker: str,
    read_timeout: float,
    connect_timeout: float | None = None,
    text: list[str] | None = None,
) -> RequestRecord:
    payload = orjson.dumps(body)
    parser = backend.parser()
    parser.text = text
    feed = parser.feed
    perf = time.perf_counter
    http_status: int | None = None
    reason: str | None = None
    done = False
    chunks = 0
    tokens_seen = 0
    t_first_p: float | None = None
    first_n = 0
    last_p = 0.0
    itl_max = 0.0
    itl: dict[int, int] = {}  # per-token gap bin -> tokens (specload.core.histogram)
    streamed = streamed_tokens
    t_send_wall = now()
    t0 = perf()
    resp: StreamResponse | None = None
    interrupted = False
    try:
        try:
            resp = post(client, path, payload, headers, read_timeout)
        except _STALE:
            # A keep-alive connection the server had closed just after its last response (llama.cpp
            # does this after every streamed response while it advertises keep-alive). The request
            # never reached a live connection, so it is sent again on a new one, timed from there.
            t_send_wall, t0 = now(), perf()
            resp = post(client, path, payload, headers, read_timeout)
    except GreenletExit:
        reason, interrupted = "interrupted (test stopped) before the response", True
    except Exception as e:  # noqa: BLE001 - every failure becomes a record
        reason = describe_connect_error(e, read_timeout, connect_timeout, perf() - t0)
    t_end_p: float | None = None
    if resp is not None:
        http_status = resp.status
        if http_status != 200:
            try:
                raw = resp.read(_ERROR_BODY_LIMIT)
            except Exception:  # noqa: BLE001
                raw = b""
            reason = f"HTTP {http_status}: {server_message(http_status, raw)}"
            resp.release()
        else:
            line = b""
            stray: list[bytes] = []

            def take(lines: list[bytes]) -> bool:
                """One ``recv``'s lines; True once the stream is over for us ([DONE], an error event).
                It may run in the hub (``StreamResponse.pump``): it never blocks."""
                nonlocal line, done, reason, chunks, tokens_seen, t_first_p, first_n, last_p, itl_max
                for line in lines:
                    if line[:5] != b"data:":
                        if not chunks and len(stray) < _ERROR_BODY_LIMIT and line.strip():
                            stray.append(line + b"\n")  # what a 200 that is no event stream says instead
                        continue  # blank separators, comments, event:/id: fields
                    # Stamped per event, before it is parsed, as it is taken from the buffer: events
                    # that came in one recv (a fast server, a busy client) keep distinct times in
                    # arrival order, so a stream that arrived at once still has a TPOT.
                    t = perf()
                    data = line[5:].strip()
                    if data == _DONE:
                        done = True
                        return True
                    n = feed(data)
                    if n:
                        if t_first_p is None:
                            t_first_p, first_n = t, n
                        else:
                            gap = (t - last_p) / n  # an event of n tokens: n gaps of gap each
                            if gap > itl_max:
                                itl_max = gap
                            b = int(_log(gap * _INV_FLOOR) * _INV_LOG_RATIO) if gap > _FLOOR else 0
                            itl[b] = itl.get(b, 0) + n
                        last_p = t
                        chunks += 1
                        tokens_seen += n
                        streamed[0] += n
                    elif parser.error is not None:
                        reason = f"server error in stream after {tokens_seen} tokens: {shorten(parser.error)}"
                        return True
                return False

            disarm = resp.watch(read_timeout)
            try:
                resp.pump(take)
                if not done and reason is None and not chunks and resp.pending:
                    stray.append(resp.pending)  # the body ended with a line without its newline
            except MalformedEvent as e:
                reason = f"malformed event after {tokens_seen} tokens: {shorten(str(e), 60)} in line {shorten(line.decode('utf-8', 'replace'), 100)!r}"
            except GreenletExit:
                reason, interrupted = f"interrupted (test stopped) after {tokens_seen} tokens", True
            except Exception as e:  # noqa: BLE001
                reason = _describe_read_error(e, tokens_seen, read_timeout)
            finally:
                disarm()
            t_end_p = perf()
            if reason is None and not done and not chunks and any(s.strip() for s in stray):
                body_text = server_message(200, b"".join(stray)[:_ERROR_BODY_LIMIT])
                reason = f"HTTP 200 without an event stream: {body_text}"
            _finish(resp, done and reason is None)
    if t_end_p is None:
        t_end_p = perf()
    rec = _record(
        spec,
        backend,
        parser,
        worker,
        http_status,
        reason,
        done,
        chunks,
        tokens_seen,
        t_send_wall,
        t0,
        t_first_p,
        last_p,
        t_end_p,
        itl_max,
        first_n,
        itl,
    )
    if interrupted:
        raise Interrupted(rec)
    return rec


def _finish(resp: StreamResponse, clean: bool) -> None:
    """Give the connection back for reuse only when the HTTP message really ended."""
    if clean:
        # The terminating chunk follows [DONE] at once on every server we know; do not wait
        # a full read timeout for one that lingers.
        resp.drain(1.0)
    resp.release()


def _record(
    spec: RequestSpec,
    backend: Backend,
    parser: Any,
    worker: str,
    http_status: int | None,
    reason: str | None,
    done: bool,
    chunks: int,
    tokens_seen: int,
    t_send_wall: float,
    t0: float,
    t_first_p: float | None,
    last_p: float,
    t_end_p: float,
    itl_max: float,
    first_n: int = 0,
    itl: dict[int, int] | None = None,
) -> RequestRecord:
    if parser.output_tokens is not None:
        out, source = parser.output_tokens, backend.token_source
    else:
        out, source = tokens_seen, SRC_CHUNKS
    asked = spec.requested_output_tokens
    if reason is None and source != SRC_CHUNKS and out > asked:
        # A server claiming more than it was asked for (or could have sent) is not believed: the
        # request fails, and only what streamed, at most what was asked, enters the level's tokens.
        reason = f"server claimed {out} tokens, more than the {asked} asked for; counted the {tokens_seen} streamed"
        out, source = min(tokens_seen, asked), SRC_CHUNKS
    if reason is not None:
        status = FAILED
    elif not done:
        status, reason = SHORT, f"stream ended without its terminator after {out} tokens"
    elif source != SRC_CHUNKS and out < spec.requested_output_tokens:
        status, reason = SHORT, f"server counted {out} of {spec.requested_output_tokens} tokens asked for"
    else:
        status = OK
    return make_record(
        t_send=t_send_wall,
        t_first=None if t_first_p is None else t_send_wall + (t_first_p - t0),
        t_last=None if t_first_p is None else t_send_wall + (last_p - t0),
        t_end=t_send_wall + (t_end_p - t0),
        output_tokens=out,
        level=spec.level,
        concurrency=spec.concurrency,
        phase=spec.phase,
        seq=spec.seq,
        backend=backend.name,
        status=status,
        reason=reason,
        http_status=http_status,
        output_tokens_source=source,
        prompt_tokens=parser.prompt_tokens,
        requested_output_tokens=spec.requested_output_tokens,
        requested_prompt_tokens=spec.requested_prompt_tokens,
        chunks=chunks,
        itl_max_s=itl_max if chunks > 1 else None,
        itl=to_pairs(itl) if itl else None,
        itl_unit=ITL_PER_TOKEN if backend.counts_tokens_per_event else ITL_PER_EVENT,
        first_event_tokens=first_n or None,
        spec_verify_ct=parser.spec_verify_ct,
        worker=worker,
        repeat=spec.repeat,
        t_sched=spec.t_sched,
        rate=spec.rate,
        request_class=spec.request_class,
        turn=spec.turn,
        conversation=spec.conversation,
        prefix_group=spec.prefix_group,
        cached_tokens=parser.cached_tokens,
    )
