"""specload.sim.sendall: one system call when the message fits, gevent's sendall for the rest."""

from __future__ import annotations

import os

import gevent
from gevent import socket as gevent_socket

from specload.sim.sendall import sendall


def _pair(sndbuf: int | None = None) -> tuple[gevent_socket.socket, gevent_socket.socket]:
    a, b = gevent_socket.socketpair()
    if sndbuf is not None:
        a.setsockopt(gevent_socket.SOL_SOCKET, gevent_socket.SO_SNDBUF, sndbuf)
    return a, b


def _read_all(sock: gevent_socket.socket, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        part = sock.recv(65536)
        if not part:
            break
        got += part
    return bytes(got)


def test_a_message_larger_than_the_socket_buffer_arrives_whole_and_in_order() -> None:
    a, b = _pair(16384)
    try:
        data = os.urandom(4 << 20)  # far more than the send buffer: the rest goes through gevent
        reader = gevent.spawn(_read_all, b, len(data))
        sendall(a, data)
        assert reader.get(timeout=10) == data
    finally:
        a.close()
        b.close()


def test_small_messages_are_sent_at_once_without_gevent(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    a, b = _pair()

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("gevent's sendall was used for a message that fits")

    monkeypatch.setattr(gevent_socket.socket, "sendall", refuse)
    try:
        for i in range(100):
            sendall(a, b"data: %d\n\n" % i)
        want = b"".join(b"data: %d\n\n" % i for i in range(100))
        assert _read_all(b, len(want)) == want
    finally:
        a.close()
        b.close()


def test_anything_but_a_plain_gevent_socket_goes_through_its_own_sendall() -> None:
    sent: list[bytes] = []

    class Wrapped:  # e.g. a TLS socket: its bytes must be encrypted first, never written raw
        def sendall(self, data: bytes) -> None:
            sent.append(bytes(data))

    sendall(Wrapped(), b"hello")
    assert sent == [b"hello"]
