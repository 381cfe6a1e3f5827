"""https spoken to a plain-HTTP server, and plain HTTP to a TLS server: the pre-sweep error says which."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from specload.client.probe import ServerUnreachable, get_json


def test_https_to_a_plain_http_server_names_http(sim) -> None:  # type: ignore[no-untyped-def]
    server = sim("--model", "m")
    https = server.url.replace("http://", "https://", 1)
    with pytest.raises(ServerUnreachable) as e:
        get_json(https, "/v1/models", timeout=2, insecure=True)
    # (a server that answers a TLS hello with an HTTP error says "does not speak TLS"; this one waits)
    assert f"if the server speaks plain HTTP on this port, try {server.url}" in str(e.value), e.value


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[str]:
    """A TLS listener (self-signed) that answers nothing but the handshake, as a TLS server would to
    a plain-HTTP request: it reads, finds no TLS record, and closes."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)]
        + ["-days", "1", "-subj", "/CN=127.0.0.1"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                with ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (ssl.SSLError, OSError):
                pass
            finally:
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        listener.close()
        thread.join(timeout=5)


def test_plain_http_to_a_tls_server_names_https(tls_server: str) -> None:
    with pytest.raises(ServerUnreachable) as e:
        get_json(tls_server, "/v1/models", timeout=5)
    https = tls_server.replace("http://", "https://", 1)
    assert f"if the server speaks TLS on this port, try {https}" in str(e.value), e.value


def test_https_to_a_server_that_answers_in_plain_http_says_it_does_not_speak_tls() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def serve() -> None:  # as uvicorn or nginx answer a TLS hello: a plain-HTTP 400
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with pytest.raises(ServerUnreachable) as e:
            get_json(f"https://127.0.0.1:{port}", "/v1/models", timeout=5, insecure=True)
    finally:
        listener.close()
        thread.join(timeout=5)
    assert f"the server does not speak TLS on this port: try http://127.0.0.1:{port}" in str(e.value), e.value
