"""One write to a gevent socket at the cost of one system call.

gevent's ``sendall`` asks the kernel for the socket's send buffer size (a ``getsockopt``) and goes
through four Python frames on every call, before and after its one ``send``: on the simulator's
per-token path that was ~15 % of its CPU. (The client pays it once per request, a few µs of its
~340: it keeps gevent's ``sendall``.) A message that fits the socket buffer (nearly every stream
event) is sent here with one
non-blocking ``send`` on the OS socket; whatever did not fit goes through gevent's ``sendall``, with
the socket's timeout, as before.
"""

from __future__ import annotations

from typing import Any

from gevent import socket as gevent_socket


def sendall(sock: Any, data: bytes) -> None:
    """``sock.sendall(data)``; on a plain gevent TCP socket (not TLS: its bytes must be encrypted
    first) one ``send`` on the non-blocking OS socket when that takes it all."""
    sent = 0
    if type(sock) is gevent_socket.socket:
        try:
            sent = sock._sock.send(data)
        except BlockingIOError:
            sent = 0
        if sent == len(data):
            return
    sock.sendall(memoryview(data)[sent:] if sent else data)
