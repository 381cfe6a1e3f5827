"""Connections to the server under test: one place for URLs, TLS, timeouts and the API key.

The API key is read from the environment here and only ever placed in a request header; it is
never part of anything specload prints or writes.

Private parts of geventhttpclient and gevent this module relies on (tested with geventhttpclient
2.6.1 and gevent 26.9; pyproject.toml allows no other geventhttpclient minor, no other gevent
major), each for a measured saving of client CPU (docs/bench.md) that no public API gives;
tests/test_http_privates.py checks every one of them exists and behaves as assumed, and names the
one that changed:

- ``HTTPClient._connection_pool`` (a ``ConnectionPool``): its ``get_socket``, ``return_socket`` and
  ``release_socket`` are how ``post`` borrows a keep-alive connection without geventhttpclient's
  response parser (the body is read here, ``StreamResponse``).
- ``ConnectionPool._is_socket_alive(sock) -> bool``, replaced per pool by ``_alive_check``: the
  library asks gevent's ``select`` for each reuse (a hub round, ~15 us per request, and no
  descriptor above 1023); one non-blocking ``recv(MSG_PEEK)`` gives the same answer.
- ``HTTPClient._build_request(method, path, body=, headers=) -> str``: the request head exactly as
  the library would send it (Host, User-Agent, proxy form, header checks), built once per (client,
  path, headers) with the Content-Length slot ``_LEN_MARK`` and reused (``_request_head``).
- gevent's ``socket._sock`` (the stdlib socket under a plain TCP gevent socket): the reader's
  ``recv_into`` without gevent's try-first wrapper, which pays a failed system call and a raised
  BlockingIOError on nearly every token; and the peek of ``_alive_check``.
- gevent's ``socket._wait(socket._read_event)``: waiting for readability on the socket's own io
  watcher before that ``recv_into``; ``gevent.socket.wait_read`` makes and closes a watcher per
  call (~4 us more per wait, measured with a socket pair).

The body read in the hub (``StreamResponse.pump``) and the read timeout (``_Watchdog``) use only
gevent's documented low-level API: ``get_hub().loop.io`` and ``loop.timer`` watchers and
``gevent.hub.Waiter``.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import ssl
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson
from gevent import get_hub, getcurrent
from gevent import socket as gevent_socket
from gevent import ssl as gevent_ssl
from gevent.hub import Waiter
from geventhttpclient import HTTPClient
from geventhttpclient.response import HTTPConnectionClosed, HTTPParseError

from specload.core.text import shorten

logger = logging.getLogger("specload")

API_KEY_ENV = ("SPECLOAD_API_KEY", "OPENAI_API_KEY")


def api_key() -> str | None:
    for name in API_KEY_ENV:
        value = os.environ.get(name)
        if value:
            return value
    return None


def base_headers(stream: bool = True, send_key: bool = True) -> dict[str, str]:
    """A request's headers; ``send_key=False`` leaves the API key out (a host the user did not
    start the run with, and did not confirm: see ``key_may_go_to``)."""
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
    headers["Accept"] = "text/event-stream" if stream else "application/json"
    key = api_key() if send_key else None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return headers


def origin_of(url: str) -> tuple[str, str, int] | None:
    """(scheme, host name, port) of a server URL, default ports filled in; None when it is no URL.

    That is the key's scope: a path or a user:password part does not change who receives it."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return parts.scheme, parts.hostname.lower(), port


def key_may_go_to(host: str, configured: str | None, confirmed: bool) -> bool:
    """Whether the API key may be sent to ``host``: always to the host the run was started with
    (``configured``); to any other only when the user confirmed it. A web page that submits the
    web UI's form must not be able to point the operator's key at a server of its choosing."""
    if confirmed:
        return True
    return configured is not None and origin_of(host) is not None and origin_of(host) == origin_of(configured)


def check_host(host: str | None) -> str:
    """The host URL without a trailing slash, or ValueError naming what is wrong with it."""
    if not host:
        raise ValueError("no host given: pass --host http://SERVER:PORT")
    parts = urlsplit(host)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"host {host!r} is not an http:// or https:// URL")
    try:
        parts.port  # noqa: B018 - urllib checks the range when it is read
    except ValueError:
        raise ValueError(f"host {host!r}: the port must be a number within 1..65535") from None
    return host.rstrip("/")


def redact_host(host: str) -> str:
    """The host URL without any user:password part, for files and logs."""
    parts = urlsplit(host)
    if parts.username or parts.password:
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return host


def endpoint(host: str, path: str) -> str:
    """Request path on the server, keeping any path prefix of the host URL (e.g. behind a proxy)."""
    prefix = urlsplit(host).path.rstrip("/")
    return prefix + path


def warm_up(client: HTTPClient) -> None:
    """Open the user's keep-alive connection before its first timed request.

    Name resolution (a thread pool under gevent: several ms when many users start at once), the
    TCP and the TLS handshake are then outside every TTFT, as for a long-running client. A failure
    here is ignored: the timed request will meet it again and record it.
    """
    pool = client._connection_pool
    try:
        sock = pool.get_socket()
    except Exception:  # noqa: BLE001
        return
    pool.return_socket(sock)


def _unverified_context(*_args: object, **_kwargs: object) -> ssl.SSLContext:
    ctx = gevent_ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def make_client(
    host: str, read_timeout: float, connect_timeout: float, insecure: bool = False, concurrency: int = 1
) -> HTTPClient:
    parts = urlsplit(host)
    if not parts.hostname:
        raise ValueError(f"host {host!r} has no host name")
    tls = parts.scheme == "https"
    # geventhttpclient's own `insecure` only skips the host-name check, not the chain.
    unverified = tls and insecure
    client = HTTPClient(
        parts.hostname,
        port=parts.port or (443 if tls else 80),
        network_timeout=read_timeout,
        connection_timeout=connect_timeout,
        concurrency=concurrency,
        ssl=tls,
        insecure=unverified,
        ssl_context_factory=_unverified_context if unverified else None,
    )
    pool = client._connection_pool
    # A deliberate patch of one pool's method (see the module docstring).
    pool._is_socket_alive = _alive_check(pool._is_socket_alive)  # type: ignore[method-assign, assignment]
    return client


def _alive_check(slow: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """The pool's check of an idle keep-alive connection before its reuse, as one non-blocking
    ``recv(MSG_PEEK)`` on a plain TCP socket: geventhttpclient asks gevent's ``select`` (watchers and
    a hub round for every request, ~15 us of client CPU), and ``select`` fails for descriptors
    above 1023. Same answer: alive exactly when nothing is readable (no FIN, no stray bytes)."""

    def alive(sock: Any) -> bool:
        if type(sock) is not gevent_socket.socket:
            return slow(sock)
        try:
            sock._sock.recv(1, _PEEK)
        except BlockingIOError:
            return True
        except (OSError, ValueError, AttributeError):
            return False
        return False  # b"": the server closed it; bytes: something nobody asked for

    return alive


_PEEK = socket.MSG_PEEK | socket.MSG_DONTWAIT


# what went wrong, in words -----------------------------------------------------------------------


_BEARER = re.compile(r"(?i)\b(bearer)\s+[^\s\"',;]+")


def redact_key(text: str) -> str:
    """``text`` without the API key in use or any bearer token: a server may echo the request's
    Authorization header in an error, and every reason goes to records, run.json, report and log."""
    key = api_key()
    if key and len(key) >= 4:
        text = text.replace(key, "<redacted>")
    return _BEARER.sub(r"\1 <redacted>", text)


def server_message(status: int, raw: bytes) -> str:
    """The human part of an HTTP error body (OpenAI/vLLM/SGLang error JSON, or plain text), with
    any key it echoes redacted (before it is shortened: a cut key would escape the redaction)."""
    if raw:
        raw = redact_key(raw.decode("utf-8", "replace")).encode()
    try:
        obj = orjson.loads(raw)
        if isinstance(obj, dict):
            err = obj.get("error", obj)
            if isinstance(err, dict):
                msg = err.get("message") or err.get("detail") or err.get("msg")
                if msg:
                    return shorten(str(msg))
            elif isinstance(err, str):
                return shorten(err)
            if "detail" in obj:
                return shorten(str(obj["detail"]))
    except orjson.JSONDecodeError:
        pass
    return shorten(raw.decode("utf-8", "replace")) or "(empty body)"


def describe_connect_error(
    e: BaseException, timeout: float, connect_timeout: float | None = None, elapsed: float | None = None
) -> str:
    """Why no response arrived. Both timeouts raise the same error; the time it took tells which fired."""
    if isinstance(e, TimeoutError | socket.timeout):
        if (
            connect_timeout is not None
            and elapsed is not None
            and abs(elapsed - connect_timeout) < abs(elapsed - timeout)
        ):
            return f"no connection within {connect_timeout:g} s (connect timeout)"
        return f"no response for {timeout:g} s (timeout before the response headers)"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    return f"{type(e).__name__}: {shorten(str(e), 120)}"


# the streaming exchange: request out, response head in, body read straight from the socket ------
#
# geventhttpclient sends the request and gives the body through ``readline``: per call it feeds the
# bytes of a ``recv`` to its llhttp parser, copies them into a body buffer, then slices one line out
# of it and deletes it from the front. On the per-token path that, and a libev timer armed and
# disarmed around every blocking ``recv`` (the socket's read timeout), was most of the client's CPU.
# Here one ``recv_into`` a preallocated buffer is followed by one pass that strips the HTTP/1.1
# chunked framing and splits the SSE lines; the read timeout is one lazy timer per stream that only
# fires (and re-arms itself) when the stream may have been silent for the whole timeout. On a plain
# TCP socket all of that runs in the hub, in an io watcher's callback (``StreamResponse.pump``), so a
# wake-up costs no greenlet switch. The connection pool, the request head's construction and TLS
# stay geventhttpclient's.

_RECV_SIZE = 65536
_MAX_HEAD = 65536  # a response head larger than this is not an HTTP server we can talk to
_MAX_CHUNK_LINE = 4096  # chunk size line with extensions
_HEX = b"0123456789abcdefABCDEF"
_LEN_MARK = "31415926535897932384"  # a Content-Length value no request ever has: the template's slot
_HEAD_CACHE_SIZE = 64

# body framing
_NONE, _CHUNKED, _LENGTH, _CLOSE = 0, 1, 2, 3
# The longest body line read: an SSE event line longer than this fails its request (one event of
# tokens is a few hundred bytes; the longest real ones, with logprobs, well under a megabyte).
MAX_LINE_BYTES = 16 << 20


class LineTooLong(ValueError):
    """A body line past MAX_LINE_BYTES: not assembled further (its request fails, naming it)."""


def _no_event(first_continues: bytes | None, lines: list[bytes]) -> bool:
    """Whether body lines carry nothing but SSE comments and blank lines: no progress of the
    stream, so no reason to keep waiting (a server trickling comments holds a request no longer
    than the read timeout). ``first_continues``: the pending line the first one continues, if any."""
    for i, line in enumerate(lines):
        head = first_continues if i == 0 and first_continues else line
        if head[:1] != b":" and line.strip():
            return False
    return True


# chunked decoder states
_C_DATA, _C_CRLF, _C_SIZE, _C_TRAILER, _C_END = 0, 1, 2, 3, 4


_local = threading.local()
# Per client: (path, headers) -> the request head around its Content-Length value.
_heads: weakref.WeakKeyDictionary[HTTPClient, dict[Any, tuple[bytes, bytes]]] = weakref.WeakKeyDictionary()


class StreamTimeout(TimeoutError):
    """No byte of the body arrived for the read timeout (thrown into the reading greenlet)."""


def _request_head(client: HTTPClient, path: str, headers: dict[str, str], length: int) -> bytes:
    """The request head geventhttpclient would send (Host, User-Agent, proxy form, header checks),
    built once per (client, path, headers) and reused with only the Content-Length changed."""
    key = (path, tuple(headers.items()))
    cache = _heads.get(client)
    if cache is None:
        cache = _heads[client] = {}
    parts = cache.get(key)
    if parts is None:
        fields = {k: v for k, v in headers.items() if k.lower() != "content-length"}
        fields["Content-Length"] = _LEN_MARK
        text = client._build_request("POST", path, body=b"", headers=fields)
        pre, post = text.encode("latin-1").rsplit(_LEN_MARK.encode(), 1)  # after every header of ours
        parts = (pre, post)
        if len(cache) >= _HEAD_CACHE_SIZE:
            cache.clear()
        cache[key] = parts
    return b"%b%d%b" % (parts[0], length, parts[1])


def post(
    client: HTTPClient, path: str, payload: bytes, headers: dict[str, str], read_timeout: float | None = None
) -> StreamResponse:
    """Send one POST on a pooled connection and read the response head.

    Raises what the socket raises (timeouts, resets) and HTTPConnectionClosed when the connection
    closed before any response byte: a keep-alive connection the server had already closed, which
    the caller may retry once on a new one. The connection goes back to the pool (or is closed)
    through the returned response's ``release``; on an exception here it is closed already.

    ``read_timeout``: the response's read timeout is watched from the end of the send, for the head
    and the body alike (``StreamResponse.watch``); None keeps the socket's own timeout until the
    caller's ``watch``."""
    pool = client._connection_pool
    sock = pool.get_socket()
    try:
        sock.sendall(_request_head(client, path, headers, len(payload)) + payload)
        return StreamResponse(sock, pool, read_timeout)
    except BaseException:
        pool.release_socket(sock)
        raise


class StreamResponse:
    """One HTTP/1.1 response read straight from its socket: the head parsed here, the body decoded
    (chunked, Content-Length or until close) in one pass per ``recv`` and handed out as lines."""

    __slots__ = (
        "_sock",
        "_pool",
        "_buf",
        "_view",
        "status",
        "keep_alive",
        "complete",
        "t",
        "_parts",
        "_parts_len",
        "_t_before",
        "_mode",
        "_left",
        "_state",
        "_raw",
        "_extra",
        "_early",
        "_raw_sock",
        "_drained",
        "_disarm",
    )

    def __init__(self, sock: Any, pool: Any, read_timeout: float | None = None) -> None:
        self._sock = sock
        self._pool = pool
        self._disarm: Callable[[], None] | None = None
        bufs = _local.__dict__.get("bufs")
        if bufs is None:
            b = bytearray(_RECV_SIZE)
            bufs = _local.bufs = (b, memoryview(b))
        # One receive buffer per thread, shared by all its streams: every recv_into is copied out
        # before the greenlet can yield, and a buffer per request would cost its allocation.
        self._buf: bytearray
        self._view: memoryview
        self._buf, self._view = bufs
        self.status = 0
        self.keep_alive = False
        self.complete = False  # the whole message was read
        self.t = time.perf_counter()  # when the stream last made progress (bytes other than comments)
        self._t_before = self.t  # ``t`` before the last recv (put back when it held comments alone)
        # the start of a line whose end has not arrived, in the pieces it came in (joined once, when
        # its end comes: joined at each recv, a long line cost time quadratic in its length)
        self._parts: list[bytes] = []
        self._parts_len = 0
        self._mode = _NONE
        self._left = 0  # chunked: bytes left in the current chunk; Content-Length: in the body
        self._state = _C_SIZE
        self._raw = b""  # chunked: framing bytes that await the rest of their line
        self._extra = False  # bytes past the end of the message: the connection is not reusable
        self._early = b""  # body bytes that came with the head, decoded by the first read
        # a plain gevent TCP socket (not TLS) lets the reader wait for readability itself
        self._raw_sock: socket.socket | None = sock._sock if type(sock) is gevent_socket.socket else None
        self._drained = True
        try:
            if read_timeout is not None:
                self.watch(read_timeout)  # no libev timer per wait for the head, as for the body
            self._read_head()
        except BaseException:
            self._unwatch()
            self._sock = self._pool = None  # the caller (post) closes the connection, once
            raise

    # -- receiving

    def _recv(self) -> bytes:
        """One ``recv`` (or the body bytes that came with the head); b"" at the end of the connection.

        On a plain TCP socket whose last ``recv`` emptied the kernel's buffer, wait until it is
        readable first, then read: gevent's own ``recv_into`` tries the read first and so pays a
        failed system call and a raised BlockingIOError on nearly every token of a stream."""
        if self._early:
            data, self._early = self._early, b""
            return data
        sock = self._sock
        raw = self._raw_sock
        if raw is not None and self._drained and sock.timeout is None:
            sock._wait(sock._read_event)
            try:
                n = raw.recv_into(self._buf)
            except BlockingIOError:  # woken without data after all: gevent's way
                n = sock.recv_into(self._buf)
        else:
            n = sock.recv_into(self._buf)
        self._t_before, self.t = self.t, time.perf_counter()
        if n:
            self._drained = n < _RECV_SIZE
            return self._view[:n].tobytes()
        return b""

    def _read_head(self) -> None:
        data = b""
        while True:
            got = self._recv()
            if not got:
                if not data:
                    raise HTTPConnectionClosed("connection closed.")
                raise HTTPParseError("connection closed before the end of the response head")
            data += got
            while True:
                end = data.find(b"\r\n\r\n")
                n = 4
                lf = data.find(b"\n\n", 0, end if end >= 0 else len(data))
                if lf >= 0:
                    end, n = lf, 2
                if end < 0:
                    if len(data) > _MAX_HEAD:
                        raise HTTPParseError("response head too large")
                    break
                head, data = data[:end], data[end + n :]
                if self._parse_head(head):
                    self._early = data
                    return

    def _parse_head(self, head: bytes) -> bool:
        """Take a response head; False for an interim (1xx) response, whose final one follows."""
        lines = head.split(b"\n")
        status = lines[0].rstrip(b"\r").split(None, 2)
        if (
            len(status) < 2
            or not status[0].startswith(b"HTTP/")
            or len(status[1]) != 3
            or not status[1].isdigit()
        ):
            raise HTTPParseError(f"not an HTTP response: {shorten(repr(lines[0]), 80)}")
        code = int(status[1])
        if code < 200:
            return False
        self.status = code
        version = status[0]
        te = cl = conn = None
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise HTTPParseError(f"malformed header line {shorten(repr(line), 80)}")
            name = name.strip().lower()
            if name == b"transfer-encoding":
                te = value.strip().lower() if te is None else te + b"," + value.strip().lower()
            elif name == b"content-length":
                v = value.strip()
                if not v.isdigit() or (cl is not None and cl != int(v)):
                    raise HTTPParseError(f"bad Content-Length {shorten(repr(value), 40)}")
                cl = int(v)
            elif name == b"connection":
                conn = value.strip().lower() if conn is None else conn + b"," + value.strip().lower()
        tokens = {c.strip() for c in conn.split(b",")} if conn is not None else set()
        self.keep_alive = b"keep-alive" in tokens if version == b"HTTP/1.0" else b"close" not in tokens
        if code in (204, 304):
            self._mode, self.complete = _NONE, True
        elif te is not None:
            if te.rsplit(b",", 1)[-1].strip() == b"chunked":
                self._mode, self._state = _CHUNKED, _C_SIZE
            else:
                self._mode, self.keep_alive = _CLOSE, False
        elif cl is not None:
            self._mode, self._left = _LENGTH, cl
            self.complete = cl == 0
        else:
            self._mode, self.keep_alive = _CLOSE, False
        return True

    # -- the body

    def _decode(self, data: bytes) -> bytes:
        """The body bytes in ``data`` (framing removed); sets ``complete`` at the end of the message."""
        mode = self._mode
        if mode == _CHUNKED:
            return self._dechunk(data)
        if mode == _LENGTH:
            left = self._left
            if len(data) >= left:
                if len(data) > left:
                    self._extra = True
                self._left = 0
                self.complete = True
                return data[:left]
            self._left = left - len(data)
            return data
        if mode == _CLOSE:
            return data
        self._extra = True  # a body after a message that has none
        return b""

    def _dechunk(self, data: bytes) -> bytes:
        if self._state == _C_SIZE and not self._raw:
            # The common case: a recv of exactly one whole chunk (a server flushes one per event).
            i = data.find(b"\n")
            if 0 < i <= 16:
                size = data[:i].rstrip(b"\r")
                if size and not size.translate(None, _HEX):
                    end = i + 1 + int(size, 16)
                    if end > i + 1 and len(data) == end + 2 and data[end:] == b"\r\n":
                        return data[i + 1 : end]
        raw = self._raw + data if self._raw else data
        n = len(raw)
        pos = 0
        out: list[bytes] = []
        state, left = self._state, self._left
        while pos < n:
            if state == _C_DATA:
                end = pos + left
                if end > n:
                    out.append(raw[pos:])
                    left = end - n
                    pos = n
                    break
                out.append(raw[pos:end])
                pos, left, state = end, 0, _C_CRLF
            elif state == _C_CRLF:
                if n - pos < 2:
                    break
                if raw[pos : pos + 2] != b"\r\n":
                    if raw[pos : pos + 1] != b"\n":
                        raise HTTPParseError("chunk data not followed by CRLF")
                    pos += 1
                else:
                    pos += 2
                state = _C_SIZE
            elif state == _C_SIZE:
                i = raw.find(b"\n", pos)
                if i < 0:
                    if n - pos > _MAX_CHUNK_LINE:
                        raise HTTPParseError("chunk size line too long")
                    break
                size = raw[pos:i].split(b";", 1)[0].strip()
                if not size or size.translate(None, _HEX) or len(size) > 16:
                    raise HTTPParseError(f"bad chunk size {shorten(repr(raw[pos:i]), 40)}")
                left = int(size, 16)
                pos = i + 1
                state = _C_DATA if left else _C_TRAILER
            elif state == _C_TRAILER:
                i = raw.find(b"\n", pos)
                if i < 0:
                    if n - pos > _MAX_HEAD:
                        raise HTTPParseError("trailer too long")
                    break
                line = raw[pos:i]
                pos = i + 1
                if line == b"" or line == b"\r":
                    state = _C_END
                    self.complete = True
            else:  # _C_END: bytes after the message
                self._extra = True
                pos = n
        self._state, self._left = state, left
        self._raw = raw[pos:] if pos < n else b""
        if len(out) == 1:
            return out[0]
        return b"".join(out)

    @property
    def pending(self) -> bytes:
        """The start of a line whose end has not arrived (b"" when none)."""
        parts = self._parts
        if len(parts) > 1:
            self._parts = parts = [b"".join(parts)]
        return parts[0] if parts else b""

    @pending.setter
    def pending(self, value: bytes) -> None:
        self._parts = [value] if value else []
        self._parts_len = len(value)

    def lines(self) -> list[bytes] | None:
        """The body's next complete lines (without their newline), after at most one ``recv``;
        None at the end of the body (a line without its newline is then left in ``pending``).

        Raises HTTPConnectionClosed when the connection ends before the message does."""
        pending = self.pending
        if b"\n" in pending:
            lines = pending.split(b"\n")
            self.pending = lines.pop()
            return lines
        if self.complete:
            return None
        return self._split(self._recv())

    def _split(self, data: bytes) -> list[bytes] | None:
        """``lines`` after its ``recv``: the body's complete lines in ``data`` and what was pending."""
        if not data:
            if self._mode == _CLOSE:
                self.complete = True
                return None
            raise HTTPConnectionClosed("connection closed before the end of the response body")
        body = self._decode(data)
        parts = self._parts
        if b"\n" not in body:
            if body:
                if _no_event(parts[0] if parts else None, [body]):
                    self.t = self._t_before  # a comment's bytes: no progress
                parts.append(body)
                self._parts_len += len(body)
                if self._parts_len > MAX_LINE_BYTES:
                    self.pending = b""
                    raise LineTooLong(f"a line of the body longer than {MAX_LINE_BYTES >> 20} MB")
            return []
        lines = body.split(b"\n")
        if _no_event(parts[0] if parts else None, lines):
            self.t = self._t_before  # comments and blank lines alone: no progress
        if parts:
            lines[0] = b"".join(parts) + lines[0]  # one join per line: linear in its length
            if len(lines[0]) > MAX_LINE_BYTES:
                self.pending = b""
                raise LineTooLong(f"a line of the body longer than {MAX_LINE_BYTES >> 20} MB")
        self.pending = lines.pop()
        return lines

    def _lines_now(self, raw: socket.socket) -> list[bytes] | None:
        """``lines`` for a socket (``raw``, the stdlib one under ours) that was just found readable:
        one non-blocking ``recv``, never a wait (it runs in the hub; ``pump`` stops the watcher once
        the message is complete). [] when there was nothing after all."""
        try:
            n = raw.recv_into(self._buf)
        except BlockingIOError:
            return []
        self._t_before, self.t = self.t, time.perf_counter()
        return self._split(self._view[:n].tobytes() if n else b"")

    def pump(self, take: Callable[[list[bytes]], bool]) -> None:
        """Hand the body's lines to ``take``, as they arrive, until it returns True or the body ends.

        Raises what ``lines`` raises, and what ``take`` raises. On a plain TCP socket under the read
        timeout's watch (``watch``), the reading runs in the hub, in a libev io watcher's callback:
        the ``recv``, the decoding and ``take`` happen as soon as the socket is readable, and this
        greenlet sleeps until the stream is over: two greenlet switches and one watcher per request
        instead of per wake-up, up to a third less client CPU per streamed token at a real server's
        pace (docs/bench.md, "Reading in the hub"). ``take`` must therefore never block or switch."""
        lines: list[bytes] | None
        # What is here already (body bytes that came with the head), and TLS (whose own buffer can
        # hold data the socket no longer signals) or a socket with its own timeout: read here.
        while (
            self._early
            or self.complete
            or b"\n" in self.pending
            or self._raw_sock is None
            or self._sock.timeout is not None
        ):
            lines = self.lines()
            if lines is None or take(lines):
                return
        raw = self._raw_sock
        hub = get_hub()
        waiter = Waiter(hub)
        watcher = hub.loop.io(raw.fileno(), 1)
        lines_now = self._lines_now

        def ready() -> None:
            try:
                got = lines_now(raw)
                if got is None or take(got) or self.complete:
                    watcher.stop()
                    waiter.switch(None)
            except BaseException:  # noqa: BLE001 - raised in the reader's greenlet, not the hub
                watcher.stop()
                waiter.throw(*sys.exc_info())

        watcher.start(ready)
        try:
            waiter.get()
        finally:
            watcher.stop()  # also when the greenlet was killed or timed out meanwhile
            watcher.close()

    def read(self, limit: int) -> bytes:
        """Up to ``limit`` bytes of the body (an error message), reading until the end or the limit."""
        got = [self.pending]
        size = len(self.pending)
        self.pending = b""
        while size < limit and not self.complete:
            data = self._recv()
            if not data:
                if self._mode != _CLOSE:
                    self.keep_alive = False
                self.complete = self._mode == _CLOSE
                break
            body = self._decode(data)
            got.append(body)
            size += len(body)
        return b"".join(got)[:limit]

    def drain(self, timeout: float) -> None:
        """Read what is left of the message, waiting at most ``timeout`` per ``recv`` (the last chunk
        normally follows [DONE] at once): the connection can then be reused."""
        sock = self._sock
        if sock is None or self.complete:
            return
        self._unwatch()
        old = sock.gettimeout()
        sock.settimeout(timeout)
        try:
            while not self.complete:
                data = self._recv()
                if not data:
                    self.complete = self._mode == _CLOSE
                    self.keep_alive = False
                    return
                self._decode(data)
        except Exception:  # noqa: BLE001 - a connection that did not end cleanly is closed, not reused
            self.keep_alive = False
        finally:
            sock.settimeout(old)

    def release(self) -> None:
        """Give the connection back for reuse exactly when the message ended cleanly and the server
        keeps it open; close it otherwise. Idempotent."""
        self._unwatch()
        sock, pool = self._sock, self._pool
        self._sock = self._pool = None
        if sock is None or pool is None:
            return
        if self.complete and self.keep_alive and not self._extra and not self._raw and not self._early:
            pool.return_socket(sock)
        else:
            pool.release_socket(sock)

    def __del__(self) -> None:
        self.release()  # a reader that met a bug still gives its connection back (closed)

    # -- the read timeout

    def watch(self, timeout: float) -> Callable[[], None]:
        """Arm the stream's read timeout: StreamTimeout is thrown into this greenlet once no byte
        arrived for ``timeout`` s. The socket's own timeout (a libev timer started and stopped
        around every blocking ``recv``) is switched off meanwhile; the returned function disarms the
        watch and gives the socket its timeout back (so does ``release``). Armed already (by
        ``post``): the same watch, and its disarm."""
        if self._disarm is not None:
            return self._disarm
        sock = self._sock
        if sock is None:
            return _nothing
        old = sock.gettimeout()
        sock.settimeout(None)
        watchdog = _Watchdog(self, getcurrent(), timeout)

        def disarm() -> None:
            watchdog.close()
            self._disarm = None
            if self._sock is not None:
                self._sock.settimeout(old)

        self._disarm = disarm
        return disarm

    def _unwatch(self) -> None:
        if self._disarm is not None:
            self._disarm()


def _nothing() -> None:
    return None


class _Watchdog:
    """One libev timer per stream, armed for the whole timeout from the last bytes' arrival: when it
    fires early (bytes came meanwhile) it re-arms itself for the rest, else it interrupts the reader."""

    __slots__ = ("_resp", "_greenlet", "_timeout", "_timer", "_loop")

    def __init__(self, resp: StreamResponse, greenlet: Any, timeout: float) -> None:
        self._resp, self._greenlet, self._timeout = resp, greenlet, timeout
        self._loop = get_hub().loop
        self._timer: Any = None
        self._arm(timeout)

    def _arm(self, delay: float) -> None:
        self._timer = self._loop.timer(max(delay, 0.0), ref=False)
        self._timer.start(self._fire)

    def _fire(self) -> None:
        self._timer.close()
        self._timer = None
        rest = self._timeout - (time.perf_counter() - self._resp.t)
        if rest > 0.0005:
            self._arm(rest)
        else:
            self._greenlet.throw(StreamTimeout("read timeout"))

    def close(self) -> None:
        if self._timer is not None:
            self._timer.close()
            self._timer = None
