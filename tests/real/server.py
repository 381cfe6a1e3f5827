"""Start and talk to a real ``llama-server`` process (raw HTTP, standard library only).

``start_llama_server`` runs the binary on 127.0.0.1 with an ephemeral port, output to a log file
(never a pipe), waits for ``/health`` to answer 200 (bounded), and returns a ``LlamaServer``;
``LlamaServer.stop`` stops it by PID (SIGTERM, then SIGKILL). Nothing here imports specload.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ServerStartError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Response:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class StreamResult:
    """One streamed (SSE) response: every ``data:`` payload in order, parsed unless ``[DONE]``."""

    status: int
    headers: dict[str, str]
    events: list[Any] = field(default_factory=list)  # parsed JSON objects, and the string "[DONE]"
    raw: bytes = b""
    reused_connection_ok: bool | None = None

    @property
    def chunks(self) -> list[dict]:
        return [e for e in self.events if isinstance(e, dict)]

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1] == "[DONE]"

    @property
    def usage(self) -> dict | None:
        for e in reversed(self.chunks):
            if e.get("usage"):
                return e["usage"]
        return None

    @property
    def timings(self) -> dict | None:
        for e in reversed(self.chunks):
            if e.get("timings"):
                return e["timings"]
        return None


def parse_sse(raw: bytes) -> list[Any]:
    events: list[Any] = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        data = [line[5:].lstrip() for line in block.split(b"\n") if line.startswith(b"data:")]
        if not data:
            continue
        payload = b"\n".join(data)
        events.append("[DONE]" if payload.strip() == b"[DONE]" else json.loads(payload))
    return events


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {'name' or 'name{labels}': value} (samples only, no HELP/TYPE)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        out[name.strip()] = float(value)
    return out


@dataclass
class LlamaServer:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    args: list[str]
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def conn(self, timeout: float = 60.0) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 60.0,
    ) -> Response:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        hdrs = {"Content-Type": "application/json"} if data is not None else {}
        hdrs.update(headers or {})
        c = self.conn(timeout)
        try:
            c.request(method, path, body=data, headers=hdrs)
            r = c.getresponse()
            return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        finally:
            c.close()

    def get(self, path: str, **kw: Any) -> Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Response:
        return self.request("POST", path, body, **kw)

    def stream(
        self, path: str, body: dict, timeout: float = 120.0, conn: http.client.HTTPConnection | None = None
    ) -> StreamResult:
        """POST a streaming request and read the whole SSE body (on ``conn`` if given, kept open)."""
        c = conn or self.conn(timeout)
        try:
            c.request(
                "POST",
                path,
                body=json.dumps(body).encode(),
                headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
            )
            r = c.getresponse()
            raw = r.read()
            headers = {k.lower(): v for k, v in r.getheaders()}
            res = StreamResult(r.status, headers, raw=raw)
            if r.status == 200 and headers.get("content-type", "").startswith("text/event-stream"):
                res.events = parse_sse(raw)
            return res
        finally:
            if conn is None:
                c.close()

    def metrics(self) -> dict[str, float]:
        r = self.get("/metrics")
        if r.status != 200:
            raise RuntimeError(f"/metrics: HTTP {r.status}: {r.body[:200]!r}")
        return parse_metrics(r.body.decode())

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> int | None:
        """Stop the process by PID: SIGTERM, then SIGKILL after ``timeout`` s. Returns its exit code."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode


def start_logged(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A server process in its own session, dying with the test process, its command line first
    in ``log`` and its output after it."""
    with open(log, "wb") as out:
        out.write(("$ " + " ".join(args) + "\n").encode())
        out.flush()
        return subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )


def _die_with_parent() -> None:  # runs in the child between fork and exec
    """Linux: the server gets SIGTERM if the test process dies without tearing down (e.g. SIGKILL)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _wait_healthy(srv: LlamaServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if srv.proc.poll() is not None:
            raise ServerStartError(f"llama-server exited with {srv.proc.returncode}: {last}")
        try:
            r = srv.get("/health", timeout=5)
            if r.status == 200:
                return
            last = f"/health: HTTP {r.status} {r.body[:200]!r}"
        except OSError as e:
            last = f"/health: {e}"
        time.sleep(0.2)
    raise ServerStartError(f"llama-server not healthy after {timeout:.0f} s ({last})")


def start_llama_server(
    binary: Path,
    model: Path,
    extra_args: Sequence[str] = (),
    *,
    log_dir: Path,
    parallel: int = 4,
    ctx_per_slot: int = 4096,
    threads: int | None = None,
    health_timeout: float = 120.0,
    attempts: int = 3,
) -> LlamaServer:
    """Start llama-server and wait until /health is 200; on failure it is stopped and an error raised.

    ``-c`` is ``parallel * ctx_per_slot`` (each slot gets ``ctx_per_slot`` tokens). ``extra_args``
    come last, so they can override anything before them.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    last_err: Exception | None = None
    for attempt in range(attempts):  # retry only when the port was taken between probe and bind
        port = free_port()
        args = [
            str(binary),
            "-m",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--parallel",
            str(parallel),
            "--cont-batching",
            "-c",
            str(parallel * ctx_per_slot),
            "--metrics",
            "--slots",
            "--no-webui",
            "-t",
            str(threads or min(os.cpu_count() or 2, 4)),
            *extra_args,
        ]
        log = log_dir / f"llama-server-{port}.log"
        srv = LlamaServer(start_logged(args, log), port, log, args)
        try:
            _wait_healthy(srv, health_timeout)
            return srv
        except ServerStartError as e:
            srv.stop()
            text = srv.log_text()
            tail = "\n".join(text.splitlines()[-30:])
            last_err = ServerStartError(f"{e}\n--- {log} (tail) ---\n{tail}")
            if "bind" in text.lower() and "address" in text.lower() and attempt + 1 < attempts:
                continue
            raise last_err from None
    assert last_err is not None
    raise last_err


@contextlib.contextmanager
def running(binary: Path, model: Path, extra_args: Sequence[str] = (), **kw: Any) -> Iterator[LlamaServer]:
    srv = start_llama_server(binary, model, extra_args, **kw)
    try:
        yield srv
    finally:
        srv.stop()
