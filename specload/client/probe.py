"""Questions asked of the server outside the load: is it there, which model does it serve.

Used once before a sweep (from the process that runs the sweep), never on the hot path.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable
from typing import Any, TypeVar

import gevent
import orjson

from specload.client.http import base_headers, describe_connect_error, endpoint, make_client, server_message


class ServerUnreachable(RuntimeError):
    """The host did not answer at all; nothing can be measured."""


class NoCompleteAnswer(RuntimeError):
    """A question asked before the sweep got no complete answer within its overall deadline."""


# A question before the sweep may take this many read timeouts in all: the read timeout alone is a
# silence timer, which a server that sends a byte now and then (SSE comments, endless tokens) resets.
DEADLINE_READ_TIMEOUTS = 3

T = TypeVar("T")


def pre_sweep_deadline(read_timeout: float, connect_timeout: float) -> float:
    return connect_timeout + DEADLINE_READ_TIMEOUTS * read_timeout


def within(seconds: float, what: str, ask: Callable[[], T]) -> T:
    """``ask()``, or NoCompleteAnswer once ``seconds`` have passed (its connection is dropped)."""
    try:
        with gevent.Timeout(seconds):
            return ask()
    except gevent.Timeout:
        raise NoCompleteAnswer(f"{what}: no complete answer within {seconds:g} s") from None


def get_json(
    host: str, path: str, timeout: float = 10.0, insecure: bool = False, send_key: bool = True
) -> tuple[int, Any]:
    """GET a JSON endpoint: (status, parsed body or None). Raises ServerUnreachable on no answer."""
    return _call(host, "GET", path, None, timeout, insecure, send_key)


def post_json(
    host: str, path: str, body: Any, timeout: float = 10.0, insecure: bool = False, send_key: bool = True
) -> tuple[int, Any]:
    """POST a JSON body: (status, parsed reply or None). Raises ServerUnreachable on no answer."""
    return _call(host, "POST", path, orjson.dumps(body), timeout, insecure, send_key)


def _call(
    host: str, method: str, path: str, payload: bytes | None, timeout: float, insecure: bool, send_key: bool
) -> tuple[int, Any]:
    """A non-200 status comes with the server's message in place of the body."""
    client = make_client(host, timeout, timeout, insecure)
    headers = base_headers(stream=False, send_key=send_key)

    def ask() -> tuple[Any, bytes]:
        resp = client.request(method, endpoint(host, path), body=payload, headers=headers)
        raw = resp.read()
        resp.release()
        return resp, raw

    try:
        resp, raw = within(pre_sweep_deadline(timeout, timeout), f"{host}{path}", ask)
    except NoCompleteAnswer as e:
        raise ServerUnreachable(str(e)) from None
    except Exception as e:  # noqa: BLE001
        why = describe_connect_error(e, timeout)
        raise ServerUnreachable(f"{host}{path}: {why}{scheme_hint(host, e)}") from None
    finally:
        client.close()
    if resp.status_code != 200:
        return resp.status_code, server_message(resp.status_code, raw)
    try:
        return 200, orjson.loads(raw)
    except orjson.JSONDecodeError:
        return 200, None


_NOT_TLS = ("wrong version", "record layer", "http request", "packet length")  # OpenSSL's words


def scheme_hint(host: str, e: BaseException) -> str:
    """A hint when the failure looks like https spoken to a plain-HTTP server, or the reverse: the
    error alone (an SSL record error, a closed connection, a reply that is no HTTP) does not say it."""
    text = f"{type(e).__name__} {e}".lower()
    http = host.replace("https://", "http://", 1)
    if host.startswith("https://") and isinstance(e, ssl.SSLError) and any(w in text for w in _NOT_TLS):
        return f"; the server does not speak TLS on this port: try {http}"
    if host.startswith("https://") and isinstance(e, TimeoutError | socket.timeout):
        # a plain-HTTP server that waits for a request line never answers a TLS hello
        return f"; if the server speaks plain HTTP on this port, try {http}"
    closed = isinstance(e, ConnectionResetError | BrokenPipeError) or "parse" in text or "closed" in text
    if host.startswith("http://") and closed and not isinstance(e, TimeoutError | socket.timeout):
        return f"; if the server speaks TLS on this port, try {host.replace('http://', 'https://', 1)}"
    return ""


class StillLoading(RuntimeError):
    """The server answered 503 (loading its model) until the deadline passed."""


# While a server loads its model it answers 503: llama.cpp on every endpoint ("Loading model"), SGLang
# and vLLM on /health or /v1/models. Any other status (a 404 for a missing /health too) is "loaded".
LOADING_STATUS = 503
LOADING_PATHS = ("/health", "/v1/models")
LOADING_POLL_S = 1.0
LOADING_SAY_EVERY_S = 30.0


def wait_while_loading(
    host: str,
    deadline_s: float,
    say: Callable[[str], None],
    timeout: float = 10.0,
    insecure: bool = False,
    send_key: bool = True,
    poll_s: float = LOADING_POLL_S,
) -> float:
    """Seconds waited until neither /health nor /v1/models answers 503; StillLoading past ``deadline_s``.

    A 503 before the sweep is a server loading its weights (minutes on a large model), not one that
    is wrong: without this wait the model lookup or the prompt probe fails on it with a misleading
    hint. ``say`` gets one line when the wait starts, one every 30 s, and one when it ends."""
    start = time.monotonic()
    said = None
    while True:
        loading = _loading_answer(host, timeout, insecure, send_key)
        waited = time.monotonic() - start
        if loading is None:
            if said is not None:
                say(f"the server finished loading after {waited:.1f} s")
            return waited
        if waited >= deadline_s:
            raise StillLoading(
                f"the server was still loading its model after {waited:.0f} s ({loading}); "
                f"wait for it or raise --loading-timeout (now {deadline_s:g} s)"
            )
        if said is None or waited - said >= LOADING_SAY_EVERY_S:
            state = "is loading its model" if said is None else f"is still loading after {waited:.0f} s"
            say(f"the server {state} ({loading}); waiting up to {deadline_s:g} s (--loading-timeout)")
            said = waited
        time.sleep(min(poll_s, max(deadline_s - waited, 0.0)))


def _loading_answer(host: str, timeout: float, insecure: bool, send_key: bool) -> str | None:
    """'path: HTTP 503: message' for the first endpoint that answers 503, else None."""
    for path in LOADING_PATHS:
        status, body = get_json(host, path, timeout, insecure, send_key)
        if status == LOADING_STATUS:
            return f"{path}: HTTP {status}: {body}"
    return None


def server_back(host: str, timeout: float = 2.0, insecure: bool = False, send_key: bool = True) -> str | None:
    """None when the server answers HTTP again after an outage; else why not (for the log).

    ``/health`` exists on SGLang, vLLM and llama.cpp; any answer below 500 means the process is
    back and listening (a proxy's 404 included), while 502-504 is a gateway or a server still
    loading its model (llama.cpp answers 503 until the weights are in)."""
    try:
        status, body = get_json(host, "/health", timeout, insecure, send_key)
    except ServerUnreachable as e:
        return str(e)
    return None if status < 500 else f"HTTP {status}: {body}"
