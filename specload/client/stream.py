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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from gevent import GreenletExit
from geventhttpclient import HTTPClient
from geventhttpclient.response import HTTPConnectionClosed, HTTPParseError

from specload.client.backends import Backend, MalformedEvent, StreamParser
from specload.client.http import StreamResponse, describe_connect_error, post, redact_key, server_message
from specload.core.histogram import FLOOR_S, RATIO, to_pairs
from specload.core.records import (
    FAILED,
    ITL_PER_EVENT,
    ITL_PER_TOKEN,
    OK,
    SHORT,
    SPEC_BOUNDS,
    SRC_CHUNKS,
    STOPPED,
    RequestRecord,
    make_record,
    now,
    spec_broken,
)
from specload.core.text import shorten
from specload.core.tokencap import overrun_cap

_DONE = b"[DONE]"
# What a request on a connection the server already closed raises, before any response byte.
_STALE = (HTTPConnectionClosed, ConnectionResetError, BrokenPipeError)
_ERROR_BODY_LIMIT = 2000
_GZIP_MAGIC = b"\x1f\x8b"
_EVENT_LIMIT = 1 << 20  # an event spread over data: lines is joined up to this many bytes
# After [DONE], how long the terminating chunk may take to come (it follows at once on every server
# we know) before the connection is closed instead of kept: a server that holds it open costs each
# request this long, not a second.
_LINGER_S = 0.05
# Tokens read from every stream of this process so far: the web UI's live tok/s while requests are
# still streaming (records only exist once a request ends). One add per event.
streamed_tokens = [0]
# specload.core.histogram's binning, inlined in the read loop (one log per event).
_log = math.log
_FLOOR = FLOOR_S
_INV_FLOOR = 1.0 / FLOOR_S
_INV_LOG_RATIO = 1.0 / math.log(RATIO)
_perf = time.perf_counter


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
    category: str | None = None  # a categorised dataset's row category
    # Natural output length (--output-mode natural; not copied: run.json's scenario says it): a stream
    # the model ended itself (STOPPED) below requested_output_tokens, its cap, is ok, not short.
    natural: bool = False
    trace_index: int | None = None  # a replayed trace's row, copied into the record


def _malformed(ex: _Exchange, e: MalformedEvent) -> str:
    line = shorten(ex.line.decode("utf-8", "replace"), 100)
    return f"malformed event after {ex.tokens_seen} tokens: {shorten(str(e), 60)} in line {line!r}"


def _describe_read_error(e: BaseException, tokens: int, read_timeout: float) -> str:
    if isinstance(e, TimeoutError | socket.timeout):
        return f"no data for {read_timeout:g} s (read timeout) after {tokens} tokens"
    if isinstance(e, HTTPConnectionClosed | HTTPParseError | ConnectionError) or (
        isinstance(e, OSError) and e.errno in (errno.ECONNRESET, errno.EPIPE)
    ):
        return f"stream cut after {tokens} tokens ({type(e).__name__}: {shorten(str(e), 80)})"
    return f"{type(e).__name__} after {tokens} tokens: {shorten(str(e), 120)}"


@dataclass(slots=True)
class _Exchange:
    """One request from its send to its record: what the SSE reader (``take``, called by
    ``StreamResponse.pump``, maybe in the hub) updates per event, and all ``_record`` makes the
    record of, in one object that the three steps (send and read, take, record) share."""

    spec: RequestSpec
    backend: Backend
    worker: str
    read_timeout: float
    connect_timeout: float | None
    parser: StreamParser
    feed: Callable[[bytes], int]  # parser.feed, bound once: it is called per event
    t_send_wall: float = 0.0  # records.now() at the send
    t0: float = 0.0  # perf_counter() at the send; the t_*_p below are on that clock
    http_status: int | None = None
    reason: str | None = None  # why the request failed (None: it did not)
    done: bool = False  # [DONE] arrived
    interrupted: bool = False  # the test stopped it: Interrupted carries the record
    chunks: int = 0  # content events
    tokens_seen: int = 0  # tokens those events carried
    first_n: int = 0  # tokens of the first content event
    t_first_p: float | None = None
    t_answer_p: float | None = None  # the first content event that was not reasoning
    last_p: float = 0.0
    t_end_p: float = 0.0
    itl_max: float = 0.0
    itl: dict[int, int] = field(default_factory=dict)  # per-token gap bin -> tokens (specload.core.histogram)
    stray: list[bytes] = field(default_factory=list)  # what a 200 that is no event stream says instead
    line: bytes = b""  # the line a malformed event came in
    # An event whose JSON is not whole yet: legal SSE spreads one event over several ``data:``
    # lines (joined with a newline, ended by a blank line). Only met when a line fails to parse,
    # so the one-line event of every engine costs nothing more.
    partial: bytes = b""
    partial_error: MalformedEvent | None = None

    def take(self, lines: list[bytes]) -> bool:
        """One ``recv``'s lines; True once the stream is over for us ([DONE], an error event).
        It may run in the hub (``StreamResponse.pump``): it never blocks."""
        try:
            for line in lines:
                if line[:5] != b"data:":
                    if self.partial and not line.strip() and self.partial_error is not None:
                        raise self.partial_error  # the event ended, and its lines are no JSON together
                    if line and not self.chunks and len(self.stray) < _ERROR_BODY_LIMIT and line.strip():
                        self.stray.append(line + b"\n")
                    continue  # blank separators, comments, event:/id: fields
                # Stamped per event, before it is parsed, as it is taken from the buffer: events
                # that came in one recv (a fast server, a busy client) keep distinct times in
                # arrival order, so a stream that arrived at once still has a TPOT.
                t = _perf()
                data = line[5:].strip()
                if self.partial:
                    data = self.partial + b"\n" + data
                if data == _DONE:
                    self.done = True
                    return True
                try:
                    n = self.feed(data)
                except MalformedEvent as e:
                    if not str(e).startswith("JSONDecodeError") or len(data) > _EVENT_LIMIT:
                        raise
                    self.partial, self.partial_error, self.line = data, e, line
                    continue  # maybe the event's next data: line completes it
                self.partial = b""
                if n:
                    if self.t_first_p is None:
                        self.t_first_p, self.first_n = t, n
                    else:
                        gap = (t - self.last_p) / n  # an event of n tokens: n gaps of gap each
                        if gap > self.itl_max:
                            self.itl_max = gap
                        b = int(_log(gap * _INV_FLOOR) * _INV_LOG_RATIO) if gap > _FLOOR else 0
                        itl = self.itl
                        itl[b] = itl.get(b, 0) + n
                    if self.t_answer_p is None and not self.parser.in_reasoning:
                        self.t_answer_p = t
                    self.last_p = t
                    self.chunks += 1
                    self.tokens_seen += n
                    streamed_tokens[0] += n
                    if self.tokens_seen > overrun_cap(self.spec.requested_output_tokens):
                        # A stream that never ends must not hold a request (or the probe) for ever.
                        asked = self.spec.requested_output_tokens
                        self.reason = f"the server sent more than the {asked} tokens asked for"
                        return True
                elif self.parser.error is not None:
                    self.reason = f"server error in stream after {self.tokens_seen} tokens: {shorten(redact_key(self.parser.error))}"
                    return True
        except MalformedEvent:
            if not self.partial:  # (an event over several lines: its last data line is named)
                self.line = line
            raise
        return False


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
        payload = orjson.dumps(body)
        parser = backend.parser()
        parser.text = text
        ex = _Exchange(spec, backend, worker, read_timeout, connect_timeout, parser, parser.feed)
        _exchange(ex, client, path, payload, headers)
        rec = _record(ex)
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
            category=spec.category,
            trace_index=spec.trace_index,
        )
    if ex.interrupted:
        raise Interrupted(rec)
    return rec


def _exchange(ex: _Exchange, client: HTTPClient, path: str, payload: bytes, headers: dict[str, str]) -> None:
    """Send the request and read its answer into ``ex``; every failure ends up in ``ex.reason``."""
    read_timeout = ex.read_timeout
    resp: StreamResponse | None = None
    ex.t_send_wall, ex.t0 = now(), _perf()
    try:
        try:
            resp = post(client, path, payload, headers, read_timeout)
        except _STALE:
            # A keep-alive connection the server had closed just after its last response (llama.cpp
            # does this after every streamed response while it advertises keep-alive). The request
            # never reached a live connection, so it is sent again on a new one, timed from there.
            ex.t_send_wall, ex.t0 = now(), _perf()
            resp = post(client, path, payload, headers, read_timeout)
    except GreenletExit:
        ex.reason, ex.interrupted = "interrupted (test stopped) before the response", True
    except Exception as e:  # noqa: BLE001 - every failure becomes a record
        ex.reason = describe_connect_error(e, read_timeout, ex.connect_timeout, _perf() - ex.t0)
    if resp is None:
        ex.t_end_p = _perf()
        return
    ex.http_status = resp.status
    if resp.status != 200:
        try:
            raw = resp.read(_ERROR_BODY_LIMIT)
        except Exception:  # noqa: BLE001
            raw = b""
        ex.reason = f"HTTP {resp.status}: {server_message(resp.status, raw)}"
        resp.release()
        ex.t_end_p = _perf()
        return
    disarm = resp.watch(read_timeout)
    try:
        resp.pump(ex.take)
        if not ex.done and ex.reason is None and not ex.chunks and resp.pending:
            ex.stray.append(resp.pending)  # the body ended with a line without its newline
    except MalformedEvent as e:
        ex.partial = b""
        ex.reason = _malformed(ex, e)
    except GreenletExit:
        ex.reason, ex.interrupted = f"interrupted (test stopped) after {ex.tokens_seen} tokens", True
    except Exception as e:  # noqa: BLE001
        ex.reason = _describe_read_error(e, ex.tokens_seen, read_timeout)
    finally:
        disarm()
    ex.t_end_p = _perf()
    if ex.reason is None and ex.partial and ex.partial_error is not None:  # (the body ended mid-event)
        ex.reason = _malformed(ex, ex.partial_error)
    if ex.reason is None and not ex.done and not ex.chunks and any(s.strip() for s in ex.stray):
        body = b"".join(ex.stray)
        if body.lstrip()[:5] == b"data:" and b"\rdata:" in body:  # (legal SSE no engine sends)
            ex.reason = (
                "HTTP 200 with SSE lines ended by CR alone: specload reads LF or CRLF line ends "
                "(every engine it knows sends those)"
            )
        elif body.lstrip()[:2] == _GZIP_MAGIC:  # (its bytes would reach the log and report.md)
            ex.reason = (
                "HTTP 200 with a gzip-compressed body: specload reads the event stream uncompressed; "
                "turn the server's (or its proxy's) compression off for text/event-stream"
            )
        else:
            ex.reason = f"HTTP 200 without an event stream: {server_message(200, body[:_ERROR_BODY_LIMIT])}"
    _finish(resp, ex.done and ex.reason is None)


def _finish(resp: StreamResponse, clean: bool) -> None:
    """Give the connection back for reuse only when the HTTP message really ended."""
    if clean:
        # The terminating chunk follows [DONE] at once on every server we know; do not wait
        # a full read timeout for one that lingers.
        resp.drain(_LINGER_S)
    resp.release()


def _record(ex: _Exchange) -> RequestRecord:
    spec, backend, parser = ex.spec, ex.backend, ex.parser
    tokens_seen, reason = ex.tokens_seen, ex.reason
    if parser.output_tokens is not None:
        out, source = parser.output_tokens, backend.token_source
    else:
        out, source = tokens_seen, SRC_CHUNKS
    asked, finish = spec.requested_output_tokens, parser.finish_reason
    if source != SRC_CHUNKS and out > asked:
        # A server claiming more than it was asked for (or could have sent) is not believed: the
        # request fails, and only what streamed, at most what was asked, enters the level's tokens.
        if reason is None:
            reason = f"server claimed {out} tokens, more than the {asked} asked for; counted the {tokens_seen} streamed"
        out, source = min(tokens_seen, asked), SRC_CHUNKS
    # A stream cut past the cap (one event may claim any number of tokens) counts at most the cap:
    # no record of this client carries more (specload.analysis.validity holds records read to it).
    out = min(out, overrun_cap(asked))
    # Speculative counts that cannot be true are refused the same way: the request fails, naming the
    # bound, and the record carries none of them (validity holds records read back to the same bounds).
    refused = _spec_refused(parser, out if source != SRC_CHUNKS else None)
    if refused is not None and reason is None:
        reason = refused
    if reason is not None:
        status = FAILED
    elif not ex.done:
        status, reason = SHORT, f"stream ended without its terminator after {out} tokens"
    elif source != SRC_CHUNKS and out < asked and not (spec.natural and str(finish) in STOPPED):
        ended = f" (finish_reason {shorten(str(finish), 20)!r})" if spec.natural else ""
        status, reason = SHORT, f"server counted {out} of {asked} tokens asked for{ended}"
    else:
        status = OK
    t_send_wall, t0, t_first_p = ex.t_send_wall, ex.t0, ex.t_first_p
    return make_record(
        t_send=t_send_wall,
        t_first=None if t_first_p is None else t_send_wall + (t_first_p - t0),
        t_last=None if t_first_p is None else t_send_wall + (ex.last_p - t0),
        t_end=t_send_wall + (ex.t_end_p - t0),
        output_tokens=out,
        level=spec.level,
        concurrency=spec.concurrency,
        phase=spec.phase,
        seq=spec.seq,
        backend=backend.name,
        status=status,
        reason=reason,
        http_status=ex.http_status,
        output_tokens_source=source,
        prompt_tokens=parser.prompt_tokens,
        requested_output_tokens=spec.requested_output_tokens,
        requested_prompt_tokens=spec.requested_prompt_tokens,
        chunks=ex.chunks,
        itl_max_s=ex.itl_max if ex.chunks > 1 else None,
        itl=to_pairs(ex.itl) if ex.itl else None,
        itl_unit=ITL_PER_TOKEN if backend.counts_tokens_per_event or parser.counted_events else ITL_PER_EVENT,
        first_event_tokens=ex.first_n or None,
        spec_verify_ct=None if refused else parser.spec_verify_ct,
        worker=ex.worker,
        repeat=spec.repeat,
        t_sched=spec.t_sched,
        rate=spec.rate,
        request_class=spec.request_class,
        turn=spec.turn,
        conversation=spec.conversation,
        prefix_group=spec.prefix_group,
        cached_tokens=parser.cached_tokens,
        **({} if refused else _spec_fields(parser)),
        category=spec.category,
        trace_index=spec.trace_index,
        finish_reason=None if finish is None else shorten(str(finish), 40),
        **_reasoning(ex, t_send_wall, t0),
    )


def _spec_fields(parser: StreamParser) -> dict[str, Any]:
    return {
        "spec_drafted": parser.spec_drafted,
        "spec_accepted": parser.spec_accepted,
        "spec_hist": parser.spec_hist,
        "spec_along": parser.spec_along,
        "spec_source": parser.spec_source,
    }


def _spec_refused(parser: StreamParser, out: int | None) -> str | None:
    """Why the response's speculative counts cannot be true (records.SPEC_BOUNDS), or None. ``out``:
    the server's count of output tokens (None: only events were counted, which may carry several)."""
    steps, drafted, accepted = parser.spec_verify_ct, parser.spec_drafted, parser.spec_accepted
    if steps is None and drafted is None and accepted is None:
        return None
    k = len(parser.spec_hist) - 1 if parser.spec_hist else None
    nan = float("nan")
    i = int(spec_broken(*(nan if v is None else v for v in (out, steps, drafted, accepted, k)))[0])
    if i < 0:
        return None
    return (
        f"server claimed speculative counts that cannot be true ({SPEC_BOUNDS[i]}): "
        f"{accepted} accepted of {drafted} drafted in {steps} verify steps, K {k}, for {out} output tokens "
        f"({parser.spec_source})"
    )


def _reasoning(ex: _Exchange, t_send_wall: float, t0: float) -> dict[str, Any]:
    """A reasoning stream's fields (docs/metrics.md, "Reasoning streams"); none for any other stream."""
    parser = ex.parser
    if not parser.reasoning_events and not parser.reasoning_tokens:
        return {}
    counted = parser.reasoning_tokens is None
    # Reasoning the server counted but streamed as content (no reasoning delta) hides where the
    # answer began: no first answer token then.
    answer_p = ex.t_answer_p if parser.reasoning_events else None
    return {
        "t_first_answer": None if answer_p is None else t_send_wall + (answer_p - t0),
        "reasoning_tokens": parser.reasoning_events if counted else parser.reasoning_tokens,
        "reasoning_tokens_source": SRC_CHUNKS if counted else ex.backend.token_source,
    }
