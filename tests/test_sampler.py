"""The /metrics sampler against pages that are too big, too slow or too costly to parse: a size cap,
a deadline per sample, the work in its own thread, and the missed samples in the report's notes
(reliability review M14)."""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import gevent
import pytest

from specload.analysis.run import load_run
from specload.locust.sampler import MetricsSampler
from tests.rundelay import RunDelay

FIX = Path(__file__).parent / "fixtures" / "foreign" / "specload"
GOOD = b"sglang:num_running_reqs 3\nsglang:num_queue_reqs 1\n"


class _Page(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = "good"

    def log_message(self, *a: Any) -> None:
        pass

    def do_GET(self) -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the sampler gave up on it
            self._answer(type(self).mode)

    def _answer(self, mode: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        if mode == "trickle":  # the headers, then a byte every 2 s: never a whole page
            self.send_header("Content-Length", "100000")
            self.end_headers()
            for _ in range(30):
                self.wfile.write(b"#")
                self.wfile.flush()
                time.sleep(2)
            return
        if mode == "huge":  # 100 MB announced
            self.send_header("Content-Length", str(100 << 20))
            self.end_headers()
            line = b"# junk " + b"x" * 1000 + b"\n"
            for _ in range(100 << 10):
                self.wfile.write(line)
            return
        if mode == "heavy":  # under the cap but costly to parse: 25,000 samples, about 0.3 s of CPU
            body = b"".join(b'sglang:num_queue_reqs{i="%d"} 0\n' % i for i in range(25_000))
            body += b"sglang:num_running_reqs 3\n"
        else:
            body = GOOD
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def page() -> Iterator[tuple[str, type[_Page]]]:
    handler = type("Page", (_Page,), {"mode": "good"})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", handler
    finally:
        srv.shutdown()
        srv.server_close()


def _sampler(host: str, tmp_path: Path, interval: float = 1.0) -> MetricsSampler:
    return MetricsSampler(host, str(tmp_path), lambda: 0, interval=interval, send_key=False)


def _lines(tmp_path: Path) -> list[dict[str, Any]]:
    p = tmp_path / "server_samples.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def test_a_good_page_is_sampled(page: tuple[str, type[_Page]], tmp_path: Path) -> None:
    host, _ = page
    s = _sampler(host, tmp_path)
    assert s.start()
    s.stop()
    got = _lines(tmp_path)
    assert got and got[0]["running"] == 3 and got[0]["queued"] == 1


def test_a_page_over_the_cap_is_no_sample_and_is_not_read(
    page: tuple[str, type[_Page]], tmp_path: Path
) -> None:
    host, handler = page
    handler.mode = "huge"
    s = _sampler(host, tmp_path)
    t, waited = time.monotonic(), RunDelay()  # (less the time a loaded machine kept it from a CPU)
    values, why = s.fetch_or_why()
    assert values is None and why is not None and "over the" in why
    assert time.monotonic() - t - waited.s < 2
    assert not s.start()  # at the start: no server metrics
    assert s.status == "unavailable"


def test_a_trickling_page_ends_at_the_deadline_and_the_sweep_goes_on(
    page: tuple[str, type[_Page]], tmp_path: Path
) -> None:
    """The review's trickling page hung the sweep before level 1, for ever."""
    host, handler = page
    handler.mode = "trickle"
    s = _sampler(host, tmp_path, interval=1.0)
    t, waited = time.monotonic(), RunDelay()
    assert not s.start()
    assert time.monotonic() - t - waited.s < 4  # the 1 s deadline (interval 1 s), not the server's pace


def _largest_gap(work: Any) -> tuple[Any, float]:
    """``work()``'s result and the longest the hub went without running a ticking greenlet meanwhile."""
    stamps: list[float] = []

    def tick() -> None:
        while True:
            stamps.append(time.monotonic())
            gevent.sleep(0.005)

    ticker = gevent.spawn(tick)
    gevent.sleep(0.02)
    try:
        got = work()
    finally:
        stamps.append(time.monotonic())
        ticker.kill()
    return got, max(b - a for a, b in zip(stamps, stamps[1:], strict=False))


def test_the_hub_keeps_running_while_a_heavy_page_is_fetched_and_parsed(
    page: tuple[str, type[_Page]], tmp_path: Path
) -> None:
    """The sample in the sampler's thread against the same work on the hub (as 3a7af2e did it).
    On the hub, the parse holds it for the CPU the parse costs (measured: this thread's CPU time);
    in the sampler's thread, the hub waits only for its turn at the GIL and for a CPU. The latter
    is measured too (RunDelay: this process's run-queue wait), so a loaded machine, which keeps a
    ready thread from running for tens of ms at a time, cannot fail the test; a parse back on the
    hub still shows as a gap of its CPU cost (quiet: ~0.01 s against ~0.3 s of CPU)."""
    host, handler = page
    handler.mode = "heavy"
    s = _sampler(host, tmp_path, interval=5.0)
    s.fetch_or_why()  # (the thread, its hub and its client made: not part of a sample's cost)
    waited = RunDelay()
    (values, why), threaded = _largest_gap(s.fetch_or_why)
    late = waited.s
    assert why is None and values is not None and values["running"] == 3
    on = _sampler(host, tmp_path, interval=5.0)  # (its client made on this hub, as the work is done)
    cpu0 = time.thread_time()
    (values, why), on_hub = _largest_gap(on._fetch_here)
    parse_cpu = time.thread_time() - cpu0
    assert why is None and values is not None
    assert on_hub >= parse_cpu / 2, (on_hub, parse_cpu)  # (the work did hold the hub: the yardstick holds)
    assert threaded - late < parse_cpu / 2, (threaded, late, parse_cpu)


def test_missed_samples_are_counted_and_said_per_level(page: tuple[str, type[_Page]], tmp_path: Path) -> None:
    host, handler = page
    d = tmp_path / "run"
    shutil.copytree(FIX, d)
    meta = json.loads((d / "run.json").read_text())
    first = meta["levels"][0]
    s = MetricsSampler(host, str(d), lambda: first["index"], interval=1.0, send_key=False)
    assert s.start()
    handler.mode = "huge"
    s._take()
    s._take()
    s.stop()
    assert s.missed == {first["index"]: 2}
    run = load_run(d, keep=False)
    said = [n for n in run.notices if "could not keep up" in n]
    assert (
        len(said) == 1
        and said[0].startswith(f"c{first['concurrency']:03d}")
        and "2 sample(s) missed" in said[0]
    )
    assert "over the" in said[0]


def test_a_sample_after_the_idle_thread_ended_is_taken_by_a_new_one(
    page: tuple[str, type[_Page]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sampler's thread ends once idle (nothing to kill at a run's end); a later sample makes a
    new thread and a client of its own (one made on the ended thread's hub cannot be used)."""
    from specload.locust import sampler

    host, _ = page
    monkeypatch.setattr(sampler, "_IDLE_S", 0.3)
    s = _sampler(host, tmp_path, interval=0.1)
    assert s.fetch_or_why()[1] is None
    first = s._client_hub
    time.sleep(1.0)  # (the thread's idle timeout passes)
    values, why = s.fetch_or_why()
    assert why is None and values is not None and values["running"] == 3
    assert s._client_hub is not first
    s.stop()
