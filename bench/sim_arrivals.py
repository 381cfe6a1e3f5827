"""How late does the simulator's first token come when C clients send at the same instant?

Starts ``python -m specload.sim`` (TTFT 200 ms, ITL 10 ms, 256 running slots, so nothing queues),
opens C keep-alive connections first (as specload's users do before their first timed request), then
sends C streaming /v1/completions requests back to back from one greenlet and measures, per request,
client-observed TTFT (first ``data:`` byte minus that request's own send time) minus the configured
TTFT. Whatever the server spends between "bytes arrived" and "engine admitted" shows up here, and
for simultaneous requests it adds up: the k-th request waits for the k-1 before it.

Then checks the steady-state cost: 128 streams at 100 tok/s each, the simulator's CPU time (from
/proc/PID/stat) over a few seconds in the middle of the streams, as a fraction of one core.

    .venv/bin/python bench/sim_arrivals.py [--conc 1,8,32,64,128] [--reps 3] [--no-cpu]

The client is plain gevent sockets (monkey-patched), so its own per-request cost is a few
microseconds; the simulator is stopped by PID at the end whatever happens.
"""

from __future__ import annotations

import gevent.monkey

gevent.monkey.patch_all()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import gevent  # noqa: E402

from specload.sim.process import stop_process  # noqa: E402

clock = time.perf_counter
TTFT_MS = 200.0
ITL_MS = 10.0


@dataclass
class Sim:
    proc: subprocess.Popen[bytes]
    port: int


def start_sim(extra: list[str]) -> Sim:
    cmd = [sys.executable, "-m", "specload.sim", "--port", "0", "--ttft-ms", str(TTFT_MS)]
    cmd += ["--itl-ms", str(ITL_MS), "--max-running", "256", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    line = b""
    with gevent.Timeout(20, False):
        line = proc.stdout.readline()  # type: ignore[union-attr]
    text = line.decode()
    if "listening on " not in text:
        stop_sim(proc)
        raise RuntimeError(f"simulator did not start: {text!r}")
    return Sim(proc, int(text.strip().rsplit(":", 1)[1]))


def stop_sim(proc: subprocess.Popen[bytes]) -> None:
    stop_process(proc, 5)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def request_bytes(max_tokens: int) -> bytes:
    body = json.dumps({"prompt": [1] * 16, "max_tokens": max_tokens, "stream": True}).encode()
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nAccept-Encoding: identity\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@dataclass
class Result:
    t_send: float = 0.0
    t_first: float = 0.0  # first data: event
    t_last: float = 0.0  # response complete
    status: int = 0
    events: int = 0


def read_stream(sock: socket.socket, res: Result) -> None:
    """Read one chunked SSE response to its terminating chunk; note the first event's arrival."""
    buf = b""
    body_at = -1
    while True:
        data = sock.recv(262144)
        t = clock()
        if not data:
            raise ConnectionError("server closed the connection")
        buf += data
        if body_at < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                continue
            res.status = int(buf.split(b" ", 2)[1])
            body_at = end + 4
        if not res.t_first and buf.find(b"data: ", body_at) >= 0:
            res.t_first = t
        if buf.endswith(b"\r\n0\r\n\r\n"):
            res.t_last = t
            res.events = buf.count(b"data: ", body_at)
            return


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def burst(port: int, conc: int, max_tokens: int) -> list[Result]:
    """C connections opened first, then C requests sent back to back; one Result per request."""
    socks = [connect(port) for _ in range(conc)]
    try:
        gevent.sleep(0.3)  # let the server accept them all and settle
        results = [Result() for _ in range(conc)]
        readers = [gevent.spawn(read_stream, s, r) for s, r in zip(socks, results, strict=True)]
        gevent.sleep(0.05)  # every reader now blocked in recv
        payload = request_bytes(max_tokens)
        for s, r in zip(socks, results, strict=True):
            r.t_send = clock()
            s.sendall(payload)
        gevent.joinall(readers, timeout=60, raise_error=True)
        return results
    finally:
        for s in socks:
            s.close()


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def arrivals(port: int, concs: list[int], reps: int) -> None:
    print(f"TTFT lateness = client-observed TTFT - {TTFT_MS:.0f} ms (ms); {reps} repetitions pooled")
    print(f"{'max_tokens':>10} {'C':>4} {'n':>4} {'p50':>7} {'p99':>7} {'max':>7}   per-rep p50")
    for max_tokens in (2, 50):
        for conc in concs:
            late: list[float] = []
            rep_p50: list[float] = []
            for _ in range(reps):
                rs = burst(port, conc, max_tokens)
                bad = [r for r in rs if r.status != 200 or r.events < max_tokens]
                if bad:
                    raise RuntimeError(f"bad responses: {bad[:3]}")
                xs = [(r.t_first - r.t_send) * 1e3 - TTFT_MS for r in rs]
                late += xs
                rep_p50.append(statistics.median(xs))
                gevent.sleep(0.2)
            reps_txt = " ".join(f"{x:.2f}" for x in rep_p50)
            print(
                f"{max_tokens:>10} {conc:>4} {len(late):>4} {pct(late, 0.5):>7.2f} {pct(late, 0.99):>7.2f} "
                f"{max(late):>7.2f}   {reps_txt}",
                flush=True,
            )


def steady_cpu(sim: Sim, streams: int = 128, seconds: float = 4.0) -> None:
    """CPU share of one core the simulator uses for ``streams`` streams at 1000/ITL_MS tok/s each."""
    max_tokens = int((seconds + 2.0) * 1e3 / ITL_MS)
    socks = [connect(sim.port) for _ in range(streams)]
    try:
        gevent.sleep(0.3)
        results = [Result() for _ in range(streams)]
        readers = [gevent.spawn(read_stream, s, r) for s, r in zip(socks, results, strict=True)]
        payload = request_bytes(max_tokens)
        for s in socks:
            s.sendall(payload)
        gevent.sleep(TTFT_MS / 1e3 + 0.8)  # all streams are past their first token
        c0, t0 = cpu_seconds(sim.proc.pid), clock()
        gevent.sleep(seconds)
        c1, t1 = cpu_seconds(sim.proc.pid), clock()
        gevent.joinall(readers, timeout=60, raise_error=True)
    finally:
        for s in socks:
            s.close()
    rate = streams * 1e3 / ITL_MS
    print(
        f"steady state: {streams} streams x {1e3 / ITL_MS:.0f} tok/s ({rate:.0f} events/s): "
        f"simulator CPU {100 * (c1 - c0) / (t1 - t0):.1f}% of one core",
        flush=True,
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conc", default="1,8,32,64,128", help="comma-separated concurrency levels")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-cpu", action="store_true", help="skip the steady-state CPU check")
    p.add_argument("sim_args", nargs="*", help="extra simulator arguments (after --)")
    args = p.parse_args()
    sim = start_sim(args.sim_args)
    try:
        arrivals(sim.port, [int(c) for c in args.conc.split(",")], args.reps)
        if not args.no_cpu:
            steady_cpu(sim)
    finally:
        stop_sim(sim.proc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
