"""A server whose streams never end must not hang the sweep (review ab9c161, H4): the probe
before the first level has an overall deadline, and a stream that goes on past the tokens asked
for (by a margin) ends as failed, before the sweep and inside a level alike."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Procs, free_port, specload_cmd, wait_until
from tests.rundelay import RunDelay

SERVER = Path(__file__).parent / "fixtures" / "endless_server.py"


def endless(procs: Procs, mode: str, gap: float) -> str:
    port = free_port()
    p = procs.popen([sys.executable, str(SERVER), str(port), mode, str(gap)])
    wait_until(lambda: "listening on" in procs.log(p), 20, "the endless server")
    return f"http://127.0.0.1:{port}"


def sweep(host: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = specload_cmd(
        "sweep",
        "--host",
        host,
        "--input-tokens",
        "8",
        "--output-tokens",
        "16",
        "--levels",
        "1",
        "--requests-per-level",
        "2",
        "--level-timeout",
        "60",
        "--token-id-range",
        "100:200",
        "--metrics-interval",
        "0",
        "--out",
        str(tmp_path / "out"),
        *extra,
    )
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("mode", ["tokens", "comments"])
def test_a_stream_that_never_ends_stops_the_sweep_at_the_probe(
    procs: Procs, tmp_path: Path, mode: str
) -> None:
    host = endless(procs, mode, 0.05)
    t0 = time.monotonic()
    out = sweep(host, tmp_path, "--read-timeout", "2", "--connect-timeout", "1")
    took = time.monotonic() - t0
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    text = out.stdout + out.stderr
    if mode == "tokens":  # the probe asks for 1 token: cut after 1 + 16
        assert "the server sent more than the 1 tokens asked for" in text, text[-3000:]
    else:  # only keep-alives (SSE comments): no progress, so the read timeout (review 3a7af2e, L7)
        assert "no data for 2 s (read timeout) after 0 tokens" in text, text[-3000:]
    assert took < 60, took
    assert "Traceback" not in text, text[-3000:]


def test_a_stream_past_the_tokens_asked_for_fails_inside_a_level(procs: Procs) -> None:
    """The stream reader itself: 16 asked, the server never stops; cut after 16 + 16 as failed."""
    host = endless(procs, "tokens", 0.01)
    code = f"""
from specload.client.backends import get_backend
from specload.client.http import make_client
from specload.client.stream import RequestSpec, stream_request
b = get_backend("openai")
c = make_client({host!r}, 2.0, 2.0)
spec = RequestSpec(level=0, concurrency=1, phase="measure", seq=0, repeat=0,
                   requested_output_tokens=16, requested_prompt_tokens=4)
rec = stream_request(c, b.path, b.body([1, 2, 3, 4], 16, "m", 0.0, {{}}), {{}}, b, spec, "w", 2.0)
print(rec.status, rec.output_tokens, rec.chunks, "|", rec.reason)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    status, _tokens, chunks, _bar, reason = out.stdout.split(" ", 4)
    assert status == "failed" and int(chunks) == 33, out.stdout
    assert reason.strip() == "the server sent more than the 16 tokens asked for"


def test_sse_comments_alone_end_at_the_read_timeout_and_a_huge_line_fails(procs: Procs) -> None:
    """The review's L7 and L8: a body of SSE comments trickled a byte a second held a request
    until --level-timeout (1 h by default) whatever --read-timeout said; a 50 MB event line cost
    time quadratic in its length in the hub (19-24 s), and a 200 MB one was never read."""
    host = endless(procs, "comments", 0.2)
    code = f"""
import time
from specload.client.backends import get_backend
from specload.client.http import make_client
from specload.client.stream import RequestSpec, stream_request
b = get_backend("openai")
c = make_client({host!r}, 1.0, 2.0)
spec = RequestSpec(level=0, concurrency=1, phase="measure", seq=0, repeat=0,
                   requested_output_tokens=16, requested_prompt_tokens=4)
t = time.monotonic()
rec = stream_request(c, b.path, b.body([1, 2, 3, 4], 16, "m", 0.0, {{}}), {{}}, b, spec, "w", 1.0)
print(round(time.monotonic() - t, 1), rec.status, rec.reason)
"""
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    took, status, reason = out.stdout.split(" ", 2)
    assert status == "failed" and "no data for 1 s (read timeout)" in reason, out.stdout
    assert float(took) < 5 and time.monotonic() - t0 < 30, out.stdout  # not until a level timeout


def test_a_line_is_assembled_in_linear_time_and_capped() -> None:
    from specload.client.http import MAX_LINE_BYTES, LineTooLong, StreamResponse

    resp = StreamResponse.__new__(StreamResponse)
    resp.pending = b""
    resp.t = resp._t_before = 0.0
    resp._mode = 3  # a body read until the connection closes: its bytes as they come
    resp.complete = False
    resp._sock = resp._pool = resp._disarm = None  # (no connection: nothing to give back when it goes)
    piece = b"x" * (64 << 10)
    t, waited = time.monotonic(), RunDelay()
    assert resp._split(b"data: " + piece) == []
    for _ in range((8 << 20) // len(piece)):  # an 8 MB line in 64 KB reads
        assert resp._split(piece) == []
    lines = resp._split(b"\n")
    assert lines is not None and len(lines) == 1 and len(lines[0]) == 6 + len(piece) * 129
    assert time.monotonic() - t - waited.s < 2  # joined once (joined per read: 128 copies of up to 8 MB)
    with pytest.raises(LineTooLong, match="longer than 16 MB"):
        for _ in range(MAX_LINE_BYTES // len(piece) + 2):
            resp._split(piece)
