"""A minimal HTTP/1.1 server for the simulator, on gevent's ``StreamServer``.

Why not pywsgi: it spends about 0.25 ms of CPU per request before the application sees it (a
buffered readline per header line, ``email`` header parsing, a WSGI environ), and requests that
arrive together are handled one after another, so the k-th of C simultaneous requests reached the
engine k * 0.25 ms late and every client-observed TTFT grew with the concurrency. Here a request
costs one ``recv`` (usually holding head and body), a split of the head into lines and a look at the
headers that matter (Content-Length, Transfer-Encoding, Connection, Expect), ~15 us of Python, and
one ``sendall`` per response head or body chunk. Nor h11: it parses the same request in about seven
times the time of the few small functions below (~50 us against ~7 us, measured on a busy 2-core
box), and httptools would add a compiled dependency for what is some sixty lines here.

And since whatever is left still adds up over simultaneous requests, each request carries the time
it arrived (:attr:`Request.arrived`): the kernel's receive timestamp of its last bytes (Linux
SO_TIMESTAMPNS), not the moment its turn came, so an application that counts from ``arrived`` is
not shifted by the requests handled before it. Without kernel timestamps, the time its last bytes
were read. The server knows nothing about what the application does with time.

What it supports, and nothing more:

- HTTP/1.1 with keep-alive by default (``Connection: close`` honoured), pipelined requests served in
  order; HTTP/1.0 minimally: one request per connection, a streamed body is sent raw until close.
- Request bodies by Content-Length only: ``Transfer-Encoding`` on a request gets 411 and the
  connection is closed (its framing is unknown). ``Expect: 100-continue`` is answered. CRLF line
  endings only, no obsolete line folding; anything malformed gets 400 and the connection is closed.
- Responses with a Content-Length (:class:`Response`) or streamed with chunked transfer encoding
  (:class:`Stream`: one chunk, one ``sendall`` per item of the iterator, as soon as it is yielded).
  TCP_NODELAY is set on every connection, so a chunk leaves at once.
- TLS when given an ``ssl_context`` (https): the handshake runs in the connection's greenlet, and a
  failed one (a client that rejects the certificate) just drops that connection. Kernel receive
  timestamps cannot be read through TLS, so there a request arrives when its last bytes are read.
- Of the request headers, only ``Authorization`` is kept (:attr:`Request.authorization`), for an
  application that checks API keys.

The application is a callable ``app(request) -> Response | Stream | None``; None (or having called
:meth:`Request.abort`) means "send nothing, drop the connection".
"""

from __future__ import annotations

import contextlib
import socket
import struct
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, TextIO
from urllib.parse import unquote_to_bytes

from gevent.server import StreamServer

from specload.sim.sendall import sendall

MAX_HEAD = 64 * 1024  # request line + headers; more gets 431
MAX_BODY = 256 * 1024 * 1024  # more gets 413
RECV_SIZE = 256 * 1024

# RFC 9110 token characters: a method made only of these is well formed.
_TCHARS = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

# Kernel receive timestamps (Linux SO_TIMESTAMPNS, a struct timespec of two longs on CLOCK_REALTIME):
# the moment the request's bytes reached the socket, however many requests were handled before it.
# The option number is 35 on the 64-bit architectures listed; elsewhere (or if the kernel gives no
# stamp) the time the request's last bytes were read is used instead.
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", None)
if _SO_TIMESTAMPNS is None and sys.platform == "linux" and struct.calcsize("l") == 8:
    import platform

    if platform.machine() in ("x86_64", "aarch64", "arm64", "ppc64le", "riscv64", "s390x"):
        _SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("ll")
_ANC_SIZE = 64
_LAST_CHUNK = b"0\r\n\r\n"


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def _status_line(status: int) -> bytes:
    return f"HTTP/1.1 {status} {_phrase(status)}\r\n".encode()


_STATUS_LINES = {s.value: _status_line(s.value) for s in HTTPStatus}


class _DateHeader:
    """``Date: ...\\r\\n`` for the responses, formatted at most once a second."""

    __slots__ = ("_second", "_line")

    def __init__(self) -> None:
        self._second = 0
        self._line = b""

    def __call__(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._line = b"Date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
        return self._line


class Request:
    """One parsed request: ``path`` percent-decoded, ``arrived`` when its last bytes came in (on the
    server's clock, see the module docstring)."""

    __slots__ = (
        "method",
        "path",
        "query",
        "version",
        "body",
        "arrived",
        "keep_alive",
        "aborted",
        "authorization",
        "_sock",
    )

    def __init__(
        self,
        method: str,
        path: str,
        query: bytes,
        version: str,
        body: bytes,
        arrived: float,
        keep_alive: bool,
        sock: Any,
        authorization: bytes | None = None,
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.version = version
        self.body = body
        self.arrived = arrived
        self.keep_alive = keep_alive
        self.aborted = False
        self.authorization = authorization  # the raw Authorization header value, None when absent
        self._sock = sock

    def abort(self) -> None:
        """Drop the connection now, leaving the response unfinished (a simulated network failure)."""
        self.aborted = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)


class Response:
    """A whole response, sent with a Content-Length in one write."""

    __slots__ = ("status", "body", "content_type")

    def __init__(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.status = status
        self.body = body
        self.content_type = content_type


class StreamHead:
    """Status and headers of a streamed response, encoded once and shared by every such response."""

    __slots__ = ("prefix",)

    def __init__(self, status: int, headers: Iterable[tuple[str, str]]) -> None:
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers)
        self.prefix = _status_line(status) + lines.encode("latin-1")


class Stream:
    """A streamed response: ``head`` goes out first, then every non-empty item of ``chunks``.

    The head is written before the first item is asked for, so a client sees the status even while
    the application blocks on the first item. ``chunks.close()`` is called however the stream ends
    (completed, client gone, connection aborted), so a generator's ``finally`` always runs.
    """

    __slots__ = ("head", "chunks")

    def __init__(self, head: StreamHead, chunks: Iterable[bytes]) -> None:
        self.head = head
        self.chunks = chunks


App = Callable[[Request], "Response | Stream | None"]


def _plain_error(status: int, message: str) -> bytes:
    return message.encode()


def _arrival(anc: list[tuple[int, int, bytes]], clock: Callable[[], float]) -> float:
    """The kernel's receive timestamp in ``anc``, moved onto ``clock``; 0.0 when there is none.

    The stamp is wall-clock time; its age (wall now - stamp) is subtracted from ``clock()`` now, so
    the two clocks never need to agree on an origin. An age that makes no sense is ignored.
    """
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            now = clock()
            age = time.time() - (sec + nsec * 1e-9)
            if 0.0 <= age < 10.0:
                return now - age
            return now if -0.001 < age < 0.0 else 0.0
    return 0.0


class _BadRequest(Exception):
    """A request the server cannot frame or parse: answered with ``status``, then the connection closes."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Reader:
    """The receiving side of one connection: the bytes read ahead, and when the last read arrived.

    One ``recv`` normally brings a whole request, head and body. With kernel timestamps (``stamped``)
    each read is a ``recvmsg`` whose stamp, moved onto ``clock``, becomes :attr:`arrived`.
    """

    __slots__ = ("sock", "buf", "arrived", "_stamped", "_clock")

    def __init__(self, sock: Any, stamped: bool, clock: Callable[[], float]) -> None:
        self.sock = sock
        self.buf = b""
        self.arrived = 0.0  # arrival of the last read's bytes on clock; 0.0 = unknown (or none yet)
        self._stamped = stamped
        self._clock = clock

    def _recv(self, size: int) -> bytes:
        if self._stamped:
            data, anc, _, _ = self.sock.recvmsg(size, _ANC_SIZE)
            self.arrived = _arrival(anc, self._clock) if anc else 0.0
        else:
            data = self.sock.recv(size)
            self.arrived = 0.0
        return data

    def read_head(self) -> list[bytes] | None:
        """The next request head as lines, request line first; None when the client closed first."""
        self.arrived = 0.0  # a head already buffered was not read for this request
        buf = self.buf
        if buf[:1] in (b"\r", b"\n"):
            buf = buf.lstrip(b"\r\n")  # stray CRLF between requests (RFC 9112 2.2)
        end = buf.find(b"\r\n\r\n")
        while end < 0:
            if len(buf) > MAX_HEAD:
                raise _BadRequest(431, "request head too large")
            data = self._recv(RECV_SIZE)
            if not data:
                return None
            buf = buf + data if buf else data
            if buf[:1] in (b"\r", b"\n"):
                buf = buf.lstrip(b"\r\n")
            end = buf.find(b"\r\n\r\n")
        self.buf = buf[end + 4 :]
        return buf[:end].split(b"\r\n")

    def read_body(self, length: int, expect_continue: bool) -> bytes | None:
        """The ``length`` bytes of body that follow the head; None when the client closed first."""
        if length <= 0:
            return b""
        if length > MAX_BODY:
            raise _BadRequest(413, f"request body over {MAX_BODY} bytes")
        buf = self.buf
        if len(buf) < length:
            if expect_continue and not buf:
                sendall(self.sock, _CONTINUE)
            pieces = [buf]
            have = len(buf)
            while have < length:
                data = self._recv(max(RECV_SIZE, length - have))
                if not data:
                    return None
                pieces.append(data)
                have += len(data)
            buf = b"".join(pieces)
        self.buf = buf[length:]
        return buf[:length]


@dataclass(slots=True)
class _Head:
    """What the server needs from a request head."""

    method: bytes
    target: bytes
    version: bytes
    keep_alive: bool
    length: int = -1  # Content-Length; -1 when absent
    expect_continue: bool = False
    authorization: bytes | None = None


def _parse_head(lines: list[bytes]) -> _Head:
    """The request line and the headers that matter (Content-Length, Transfer-Encoding, Connection,
    Expect, Authorization); anything malformed raises :class:`_BadRequest`."""
    head = _parse_request_line(lines[0])
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name[:1] in b" \t" or name[-1:] in b" \t":
            raise _BadRequest(400, "malformed header line")
        n = name.lower()
        if n == b"content-length":
            value = value.strip()
            if not value.isdigit() or (head.length >= 0 and int(value) != head.length):
                raise _BadRequest(400, "invalid Content-Length")
            head.length = int(value)
        elif n == b"transfer-encoding":
            raise _BadRequest(411, "request bodies must be sent with a Content-Length")
        elif n == b"connection":
            tokens = [t.strip() for t in value.lower().split(b",")]
            if b"close" in tokens:
                head.keep_alive = False
        elif n == b"expect":
            head.expect_continue = value.strip().lower() == b"100-continue"
        elif n == b"authorization":
            head.authorization = value.strip()
    return head


def _parse_request_line(line: bytes) -> _Head:
    parts = line.split(b" ")
    if len(parts) != 3:
        raise _BadRequest(400, "malformed request line")
    method, target, version = parts
    if version == b"HTTP/1.1":
        keep_alive = True
    elif version == b"HTTP/1.0":
        keep_alive = False
    elif version.startswith(b"HTTP/") and len(version) == 8:
        raise _BadRequest(505, f"HTTP version {version.decode('latin-1')} is not supported")
    else:
        raise _BadRequest(400, "malformed request line")
    if not method or method.strip(_TCHARS) or not target:
        raise _BadRequest(400, "malformed request line")
    return _Head(method, target, version, keep_alive)


def _origin_target(target: bytes) -> tuple[bytes, bytes]:
    """(path, query) of a request target: origin-form, or absolute-form as a proxy would send it.
    The path is percent-decoded."""
    if target[:1] != b"/":
        if target.startswith((b"http://", b"https://")):
            slash = target.find(b"/", target.find(b"//") + 2)
            target = target[slash:] if slash >= 0 else b"/"
        elif target != b"*":
            raise _BadRequest(400, "malformed request target")
    path, _, query = target.partition(b"?")
    if b"%" in path:
        path = unquote_to_bytes(path)
    return path, query


class HTTPServer(StreamServer):
    """Serves ``app`` over HTTP/1.1; ``port=0`` picks a free port (see ``server_port`` once started).

    ``error_body(status, message)`` renders the server's own errors (malformed request, 411, ...)
    in the application's error format, as JSON; ``clock`` stamps :attr:`Request.arrived`.
    ``ssl_context`` (a ``gevent.ssl.SSLContext`` holding the certificate) serves https instead.
    """

    def __init__(
        self,
        listener: Any,
        app: App,
        *,
        clock: Callable[[], float] = time.perf_counter,
        error_body: Callable[[int, str], bytes] | None = None,
        log: TextIO | None = None,
        backlog: int = 1024,
        kernel_timestamps: bool = True,
        ssl_context: Any = None,
    ) -> None:
        if ssl_context is not None:
            # Handshake in handle(), where a client that rejects the certificate is an OSError like any.
            super().__init__(
                listener, backlog=backlog, ssl_context=ssl_context, do_handshake_on_connect=False
            )
        else:
            super().__init__(listener, backlog=backlog)
        self.app = app
        self.clock = clock
        self.kernel_timestamps = kernel_timestamps
        self.error_body = error_body or _plain_error
        self.error_type = "application/json" if error_body else "text/plain; charset=utf-8"
        self.log = log
        self._date = _DateHeader()

    # -- connection loop ---------------------------------------------------------------------------

    def handle(self, sock: Any, address: Any) -> None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stamped = False
        # recvmsg (and so the kernel's timestamps) is not available through TLS.
        if _SO_TIMESTAMPNS is not None and self.kernel_timestamps and not self.ssl_enabled:
            try:
                sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                stamped = True
            except OSError:
                pass
        try:
            if self.ssl_enabled:
                sock.do_handshake()  # ssl.SSLError (an OSError) when the client rejects the certificate
            self._serve(sock, address, stamped)
        except OSError:
            pass  # the client went away (or the connection was aborted)
        finally:
            sock.close()

    def _serve(self, sock: Any, address: Any, stamped: bool) -> None:
        reader = _Reader(sock, stamped, self.clock)
        ready = float("-inf")  # when this connection could take its next request
        while True:
            try:
                request = self._read_request(reader, ready)
            except _BadRequest as e:
                self._fail(sock, e.status, e.message)
                return
            if request is None or not self._respond(sock, request, address):
                return
            ready = self.clock()

    def _read_request(self, reader: _Reader, ready: float) -> Request | None:
        """The connection's next request; None when the client closed it first.

        The request's arrival is the kernel's timestamp of the read that completed it (head and
        body), but no earlier than ``ready``, the end of the previous response on this connection (a
        request pipelined behind that one only gets its turn then); one already buffered, or read
        without a timestamp, counts as arriving now.
        """
        lines = reader.read_head()
        if lines is None:
            return None
        head = _parse_head(lines)
        body = reader.read_body(head.length, head.expect_continue)
        if body is None:
            return None
        arrived = reader.arrived
        if not arrived:
            arrived = self.clock()
        elif arrived < ready:
            arrived = ready
        path, query = _origin_target(head.target)
        return Request(
            head.method.decode("ascii"),
            path.decode("latin-1"),
            query,
            head.version.decode("ascii"),
            body,
            arrived,
            head.keep_alive,
            reader.sock,
            head.authorization,
        )

    # -- responses ---------------------------------------------------------------------------------

    def _respond(self, sock: Any, request: Request, address: Any) -> bool:
        """Run the app and write its answer; True when the connection may serve another request."""
        try:
            resp = self.app(request)
        except Exception:  # noqa: BLE001 - a bug in the app: log it, answer 500, drop the connection
            traceback.print_exc(file=sys.stderr)
            request.keep_alive = False
            resp = Response(500, self.error_body(500, "Internal Server Error"), self.error_type)
        if request.aborted or resp is None:
            return False
        if isinstance(resp, Stream):
            ok, size = self._write_stream(sock, request, resp)
        else:
            self._write_whole(sock, request, resp)
            ok, size = True, len(resp.body)
        if self.log is not None:
            status = int(resp.head.prefix[9:12]) if isinstance(resp, Stream) else resp.status
            self._log(address, request, status, size)
        return ok and request.keep_alive

    def _write_whole(self, sock: Any, request: Request, resp: Response) -> None:
        status_line = _STATUS_LINES.get(resp.status) or _status_line(resp.status)
        body = resp.body
        head = b"%bContent-Type: %b\r\nContent-Length: %d\r\n%b%b\r\n" % (
            status_line,
            resp.content_type.encode("latin-1"),
            len(body),
            b"" if request.keep_alive else b"Connection: close\r\n",
            self._date(),
        )
        sendall(sock, head if request.method == "HEAD" else head + body)

    def _write_stream(self, sock: Any, request: Request, resp: Stream) -> tuple[bool, int]:
        """Write a streamed response; returns (completed, body bytes) and always closes the chunks."""
        chunks = resp.chunks
        size = 0
        try:
            if request.version == "HTTP/1.0":
                # No chunked encoding in HTTP/1.0: the body ends when the connection closes.
                request.keep_alive = False
                sendall(sock, resp.head.prefix + b"Connection: close\r\n" + self._date() + b"\r\n")
                if request.method == "HEAD":
                    return True, 0
                for data in chunks:
                    if data:
                        sendall(sock, data)
                        size += len(data)
                return not request.aborted, size
            close = b"" if request.keep_alive else b"Connection: close\r\n"
            sendall(sock, resp.head.prefix + close + self._date() + b"Transfer-Encoding: chunked\r\n\r\n")
            if request.method == "HEAD":
                return True, 0
            for data in chunks:
                if data:  # an empty chunk would end the body
                    sendall(sock, b"%x\r\n%b\r\n" % (len(data), data))
                    size += len(data)
            if request.aborted:
                return False, size
            sendall(sock, _LAST_CHUNK)
            return True, size
        except OSError:
            return False, size
        finally:
            close_chunks = getattr(chunks, "close", None)
            if close_chunks is not None:
                close_chunks()

    def _fail(self, sock: Any, status: int, message: str) -> None:
        """Answer a request the server cannot frame or parse; the caller then closes the connection."""
        body = self.error_body(status, message)
        head = b"%bContent-Type: %b\r\nContent-Length: %d\r\nConnection: close\r\n%b\r\n" % (
            _STATUS_LINES.get(status) or _status_line(status),
            self.error_type.encode(),
            len(body),
            self._date(),
        )
        with contextlib.suppress(OSError):
            sendall(sock, head + body)

    def _log(self, address: Any, request: Request, status: int, size: int) -> None:
        client = address[0] if isinstance(address, tuple) else str(address)
        stamp = time.strftime("%d/%b/%Y %H:%M:%S")
        ms = (self.clock() - request.arrived) * 1e3
        self.log.write(  # type: ignore[union-attr]
            f'{client} - - [{stamp}] "{request.method} {request.path} {request.version}" '
            f"{status} {size} {ms:.1f}ms\n"
        )
