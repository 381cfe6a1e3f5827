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
    else:  # only keep-alives: the deadline, 1 + 3 x 2 s
        assert "the probe request to http://127.0.0.1" in text and "no complete answer within 7 s" in text, (
            text[-3000:]
        )
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
