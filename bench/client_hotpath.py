"""How fast can one specload process read token streams? (the per-SSE-chunk hot path)

A raw gevent server on 127.0.0.1 replays a pre-built response of N events per request as fast as
the socket allows, S streams at once; the client side is specload's own ``stream_request`` (the
exact code Locust users run). It prints events/s and CPU microseconds per event for each backend's
event format, i.e. the ceiling of one load-generating process. Compare it with what a sweep needs:
C streams x per-request tok/s (e.g. 128 x 60 = 7.7k events/s without speculation).

    .venv/bin/python bench/client_hotpath.py [--events 20000] [--streams 1,16]
"""

from __future__ import annotations

import gevent.monkey

gevent.monkey.patch_all()

import argparse  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402
import orjson  # noqa: E402
from gevent.server import StreamServer  # noqa: E402

from specload.client.backends import get_backend  # noqa: E402
from specload.client.http import make_client, warm_up  # noqa: E402
from specload.client.stream import RequestSpec, stream_request  # noqa: E402


def sse(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def build_body(backend: str, n: int) -> bytes:
    events: list[bytes] = []
    if backend == "openai":
        ev = {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "text": " tok", "logprobs": None, "finish_reason": None}],
        }
        events = [sse(ev)] * n
        events.append(
            sse({"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": n}})
        )
    elif backend == "chat":
        ev = {
            "id": "c-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": " tok"}, "finish_reason": None}],
        }
        events = [sse(ev)] * n
        events.append(
            sse({"id": "c-1", "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": n}})
        )
    else:  # sglang: cumulative text, the O(n^2) bytes case
        text = ""
        for k in range(1, n + 1):
            text += " tok"
            events.append(
                sse(
                    {
                        "text": text,
                        "meta_info": {
                            "id": "x",
                            "prompt_tokens": 8,
                            "completion_tokens": k,
                            "finish_reason": None,
                        },
                        "index": 0,
                    }
                )
            )
    events.append(b"data: [DONE]\n\n")
    payload = b"".join(events)
    # One HTTP chunk per 16 KiB, like a server flushing under load.
    parts = [payload[i : i + 16384] for i in range(0, len(payload), 16384)]
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + body


def serve(response: bytes) -> StreamServer:
    def handle(sock, _addr):
        buf = b""
        while True:
            data = sock.recv(65536)
            if not data:
                return
            buf += data
            while b"\r\n\r\n" in buf:
                head, _, rest = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                while len(rest) < length:
                    rest += sock.recv(65536)
                buf = rest[length:]
                sock.sendall(response)

    server = StreamServer(("127.0.0.1", 0), handle)
    server.start()
    return server


def run(backend_name: str, events: int, streams: int) -> tuple[float, float]:
    server = serve(build_body(backend_name, events))
    url = f"http://127.0.0.1:{server.server_port}"
    backend = get_backend(backend_name)
    clients = [make_client(url, 30, 5) for _ in range(streams)]
    for c in clients:
        warm_up(c)
    spec = RequestSpec(0, streams, "measure", 0, 0, events, 8)

    def one(c):
        rec = stream_request(
            c, backend.path, backend.body([1] * 8, events, "m", 0.0, {}), {}, backend, spec, "b", 30
        )
        assert rec.status == "ok" and rec.output_tokens == events, rec.reason
        return rec

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    gevent.joinall([gevent.spawn(one, c) for c in clients], raise_error=True)
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    server.stop()
    total = events * streams
    # The replaying server runs in this process too; its cost is a sendall of pre-built bytes.
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return total / wall, cpu / total * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=20000, help="events per stream")
    ap.add_argument("--streams", default="1,16", help="concurrent streams, comma-separated")
    args = ap.parse_args()
    print(f"{'backend':8} {'streams':>7} {'events/s':>12} {'CPU us/event':>13}")
    for backend in ("openai", "chat", "sglang"):
        for s in (int(x) for x in args.streams.split(",")):
            n = args.events if backend != "sglang" else min(args.events, 2000)  # cumulative text grows O(n^2)
            rate, us = run(backend, n, s)
            print(f"{backend:8} {s:>7} {rate:>12,.0f} {us:>13.2f}")


if __name__ == "__main__":
    main()
