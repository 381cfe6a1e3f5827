"""The private parts of geventhttpclient and gevent that specload.client.http relies on (its module
docstring says why each one): each still exists and behaves as the client assumes.

A new release of either library that renames or changes one of them fails here, with the
attribute and the installed version named, before it fails as a mysterious stream error (or, for
the alive check, silently costs every request its saving).
"""

from __future__ import annotations

import _socket
import inspect
import socket
import time
from collections.abc import Iterator
from typing import Any

import gevent
import geventhttpclient
import pytest
from gevent import socket as gsocket
from gevent.hub import Waiter, get_hub
from gevent.server import StreamServer
from geventhttpclient import HTTPClient
from geventhttpclient.connectionpool import ConnectionPool

from specload.client import http
from specload.client.http import make_client

VERSIONS = f"geventhttpclient {geventhttpclient.__version__}, gevent {gevent.__version__}"


def need(obj: Any, name: str, used_for: str) -> Any:
    """``obj.name``, or a failure that names the attribute, the versions and what it is for."""
    owner = obj.__name__ if isinstance(obj, type) else type(obj).__name__
    assert hasattr(obj, name), f"{owner}.{name} is gone ({VERSIONS}); specload.client.http uses it {used_for}"
    return getattr(obj, name)


@pytest.fixture
def server() -> Iterator[tuple[int, list[Any]]]:
    """A listener on 127.0.0.1 that keeps each connection open without a word; its sockets, to close."""
    conns: list[Any] = []

    def handle(sock: Any, _addr: Any) -> None:
        conns.append(sock)
        while sock.recv(65536):
            pass

    srv = StreamServer(("127.0.0.1", 0), handle)
    srv.start()
    yield srv.server_port, conns
    srv.stop(timeout=1)


def test_the_client_has_a_connection_pool_with_the_three_calls(server: tuple[int, list[Any]]) -> None:
    port, _ = server
    client = HTTPClient("127.0.0.1", port=port)
    try:
        pool = need(client, "_connection_pool", "to borrow a keep-alive connection (post)")
        assert isinstance(pool, ConnectionPool), (
            f"HTTPClient._connection_pool is a {type(pool).__name__}, not a ConnectionPool ({VERSIONS})"
        )
        for name in ("get_socket", "return_socket", "release_socket"):
            assert callable(need(pool, name, "to borrow and give back connections")), name
        sock = pool.get_socket()
        assert type(sock) is gsocket.socket, (
            f"ConnectionPool.get_socket gave a {type(sock)!r}, not a gevent socket ({VERSIONS}): "
            "the reader's fast path (socket._sock) would be skipped"
        )
        pool.return_socket(sock)
        assert pool.get_socket() is sock, f"ConnectionPool does not reuse a returned socket ({VERSIONS})"
        pool.release_socket(sock)
    finally:
        client.close()


def test_the_pool_asks_is_socket_alive_before_a_reuse(server: tuple[int, list[Any]]) -> None:
    """make_client's patch replaces the check the pool really calls, and its answer decides reuse."""
    port, conns = server
    method = need(ConnectionPool, "_is_socket_alive", "(patched by make_client) to check a reused connection")
    params = list(inspect.signature(method).parameters)
    assert params == ["self", "sock"], f"ConnectionPool._is_socket_alive takes {params} now ({VERSIONS})"
    client = make_client(f"http://127.0.0.1:{port}", 5.0, 5.0)
    try:
        pool = client._connection_pool
        assert "_is_socket_alive" in vars(pool), "make_client did not patch the pool's _is_socket_alive"
        ours = pool._is_socket_alive
        asked: list[bool] = []

        def counting(sock: Any) -> bool:
            asked.append(ours(sock))
            return asked[-1]

        pool._is_socket_alive = counting  # type: ignore[method-assign]
        sock = pool.get_socket()
        pool.return_socket(sock)
        assert pool.get_socket() is sock and asked == [True], (
            f"ConnectionPool.get_socket no longer calls _is_socket_alive on a reuse ({VERSIONS}): asked {asked}"
        )
        pool.return_socket(sock)
        deadline = time.monotonic() + 2
        while not conns and time.monotonic() < deadline:
            gevent.sleep(0.01)
        conns[0].close()  # the server ends the idle connection: the next get must not reuse it
        gevent.sleep(0.05)
        fresh = pool.get_socket()
        assert asked == [True, False] and fresh is not sock, (
            f"a connection _is_socket_alive called dead was reused ({VERSIONS}): asked {asked}"
        )
        pool.release_socket(fresh)
    finally:
        client.close()


def test_build_request_gives_the_head_with_our_content_length_slot() -> None:
    client = HTTPClient("127.0.0.1", port=8000)
    build = need(client, "_build_request", "to build the request head once per path (_request_head)")
    text = build(
        "POST",
        "/v1/completions",
        body=b"",
        headers={"Content-Type": "application/json", "Content-Length": http._LEN_MARK},
    )
    assert isinstance(text, str), (
        f"HTTPClient._build_request returns {type(text).__name__}, not str ({VERSIONS})"
    )
    lines = text.split("\r\n")
    assert lines[0] == "POST /v1/completions HTTP/1.1", (
        f"_build_request's request line: {lines[0]!r} ({VERSIONS})"
    )
    assert text.endswith("\r\n\r\n"), f"_build_request's head does not end the header block ({VERSIONS})"
    assert text.count(http._LEN_MARK) == 1 and f"Content-Length: {http._LEN_MARK}" in lines, (
        f"_build_request does not keep our Content-Length value as given ({VERSIONS}): {text!r}"
    )
    assert "Host: 127.0.0.1:8000" in lines and "Content-Type: application/json" in lines, text
    head = http._request_head(client, "/v1/completions", {"Content-Type": "application/json"}, 1234)
    assert head == text.replace(http._LEN_MARK, "1234").encode("latin-1")


def test_a_gevent_socket_has_its_stdlib_socket_and_read_watcher() -> None:
    a, b = gsocket.socketpair()
    try:
        assert type(a) is gsocket.socket, f"gevent.socket.socketpair gave {type(a)!r} ({VERSIONS})"
        raw = need(a, "_sock", "for recv_into without gevent's try-first wrapper, and the alive check's peek")
        assert isinstance(raw, _socket.socket) and raw.fileno() == a.fileno(), (
            f"gevent socket._sock is {raw!r}, not the stdlib socket of the same descriptor ({VERSIONS})"
        )
        event = need(a, "_read_event", "to wait for readability on the socket's own watcher")
        wait = need(a, "_wait", "to wait for readability before a recv_into")
        assert a.timeout == a.gettimeout(), f"gevent socket.timeout is not its timeout ({VERSIONS})"
        sent: list[bool] = []

        def send() -> None:
            sent.append(True)
            b.sendall(b"x")

        gevent.spawn_later(0.05, send)
        a.settimeout(None)
        wait(event)  # returns only once the other greenlet has sent (not by the wall clock: a loaded
        # machine's loop time lags, and a timer can fire early against perf_counter)
        assert sent, f"socket._wait(_read_event) did not wait ({VERSIONS})"
        assert raw.recv(1, socket.MSG_DONTWAIT) == b"x", "readable after _wait, yet nothing to read"
    finally:
        a.close()
        b.close()


def test_the_hub_gives_io_and_timer_watchers_and_a_waiter() -> None:
    """pump's io watcher and Waiter, _Watchdog's unreferenced timer: documented gevent, checked anyway."""
    a, b = gsocket.socketpair()
    hub = get_hub()
    try:
        waiter = Waiter(hub)
        watcher = hub.loop.io(a.fileno(), 1)
        watcher.start(lambda: waiter.switch("read"))
        gevent.spawn_later(0.02, b.sendall, b"x")
        assert waiter.get() == "read"
        watcher.stop()
        watcher.close()
        fired: list[bool] = []
        timer = hub.loop.timer(0.01, ref=False)
        timer.start(lambda: fired.append(True))
        gevent.sleep(0.05)
        timer.close()
        assert fired == [True], f"loop.timer(ref=False) did not fire ({VERSIONS})"
    finally:
        a.close()
        b.close()
