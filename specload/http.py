"""Connections to the server under test: one place for URLs, TLS, timeouts and the API key.

The API key is read from the environment here and only ever placed in a request header; it is
never part of anything specload prints or writes.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
from urllib.parse import urlsplit, urlunsplit

import orjson
from gevent import ssl as gevent_ssl
from geventhttpclient import HTTPClient

from specload.text import shorten

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
    kwargs: dict[str, object] = {}
    if parts.scheme == "https":
        kwargs["ssl"] = True
        if insecure:
            # geventhttpclient's own `insecure` only skips the host-name check, not the chain.
            kwargs["insecure"] = True
            kwargs["ssl_context_factory"] = _unverified_context
    return HTTPClient(
        parts.hostname,
        port=parts.port or (443 if parts.scheme == "https" else 80),
        network_timeout=read_timeout,
        connection_timeout=connect_timeout,
        concurrency=concurrency,
        **kwargs,
    )


# what went wrong, in words -----------------------------------------------------------------------


def server_message(status: int, raw: bytes) -> str:
    """The human part of an HTTP error body (OpenAI/vLLM/SGLang error JSON, or plain text)."""
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
