"""What the real llama.cpp server does (tests/real/FINDINGS.md), reproduced by the simulator, and
specload coping with it in real sweeps: exact prompt and output counts, no failed request."""

from __future__ import annotations

import http.client
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from specload.client.introspect import parse_metrics
from specload.core.records import read_records
from tests.conftest import specload_cmd

LLAMA_LIKE = (
    "--vocab-size",
    "4096",
    "--chat-template-tokens",
    "11",
    "--close-after-stream",
    "--metrics-style",
    "llamacpp",
    "--ttft-ms",
    "20",
    "--itl-ms",
    "2",
)


def post(url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    host, port = url.rsplit("/", 1)[-1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, json.loads(r.read())
    finally:
        c.close()


def test_tokenize_counts_one_token_per_word_within_the_vocabulary(sim) -> None:
    s = sim(*LLAMA_LIKE)
    status, reply = post(s.url, "/tokenize", {"content": " the quick brown fox", "add_special": False})
    assert status == 200 and len(reply["tokens"]) == 4
    assert all(3 <= t < 4096 for t in reply["tokens"])
    assert post(s.url, "/tokenize", {"prompt": "the quick"})[1]["tokens"] == reply["tokens"][:2]


def test_ids_outside_the_vocabulary_get_llamacpps_400(sim) -> None:
    s = sim(*LLAMA_LIKE)
    status, reply = post(s.url, "/v1/completions", {"prompt": [5, 4096], "max_tokens": 2})
    assert status == 400 and reply["error"]["message"] == "Prompt contains invalid tokens"
    assert post(s.url, "/v1/completions", {"prompt": [5, 4095], "max_tokens": 2})[0] == 200


def test_streamed_response_closes_a_connection_that_said_keep_alive(sim) -> None:
    s = sim(*LLAMA_LIKE)
    host, port = s.url.rsplit("/", 1)[-1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=10)
    body = json.dumps({"prompt": [5, 6], "max_tokens": 3, "stream": True})
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Connection") is None and b"[DONE]" in r.read()
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        c.getresponse()
    c.close()


@pytest.mark.parametrize("backend", ["openai", "chat"])
def test_sweep_against_a_llamacpp_like_server_is_exact(sim, tmp_path: Path, backend: str) -> None:
    s = sim(*LLAMA_LIKE)
    out = subprocess.run(
        specload_cmd(
            "sweep",
            "--host",
            s.url,
            "--backend",
            backend,
            "--levels",
            "1,4",
            "--input-tokens",
            "100",
            "--output-tokens",
            "20",
            "--out",
            str(tmp_path),
            "--metrics-interval",
            "0.2",
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    recs = read_records(str(run_dir / "records.jsonl"))
    assert len(recs) == 4 + 8
    # Every connection was closed after its stream: each next request met a stale one, and was resent.
    assert all(r.status == "ok" and r.prompt_tokens == 100 and r.output_tokens == 20 for r in recs), [
        (r.status, r.reason, r.prompt_tokens) for r in recs
    ]
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["prompts"]["origin"].endswith("/tokenize") or "/tokenize" in meta["prompts"]["origin"]
    assert meta["prompts"]["overhead_tokens"] == (11 if backend == "chat" else 0)
    samples = [json.loads(line) for line in (run_dir / "server_samples.jsonl").read_text().splitlines()]
    # llamacpp:requests_processing was read (0 between requests: whether a sample lands on a running
    # one depends on the machine's timing, so only that it was read is checked)
    assert samples and all(isinstance(x["running"], int | float) for x in samples), samples[:3]


def test_llamacpp_metric_names_are_read() -> None:
    page = (
        "llamacpp:requests_processing 4\nllamacpp:requests_deferred 2\n"
        "llamacpp:spec_decode_num_drafts_total 7\nllamacpp:spec_decode_num_draft_tokens_total 19\n"
        "llamacpp:spec_decode_num_accepted_tokens_total 12\n"
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 6\n'
    )
    m = parse_metrics(page)
    assert (m["running"], m["queued"]) == (4, 2)
    assert (m["spec_num_drafts"], m["spec_num_draft_tokens"], m["spec_num_accepted_tokens"]) == (7, 19, 12)


def test_secrets_a_server_reports_are_scrubbed() -> None:
    from specload.client.introspect import REDACTED, scrub_secrets

    info = {
        "api_key": "sk-live-123",
        "admin_api_key": None,
        "ssl_keyfile_password": "pw",
        "max_total_num_tokens": 9,
        "tokenizer_path": "/m",
        "nested": [{"hf_token": "hf_abc"}, "Bearer sk-live-123"],
        "max_running_requests": 48,
    }
    out = scrub_secrets(info, "sk-live-123")
    assert out["api_key"] == out["ssl_keyfile_password"] == out["nested"][0]["hf_token"] == REDACTED
    assert out["admin_api_key"] is None  # nothing to hide
    assert out["nested"][1] == f"Bearer {REDACTED}"
    assert (out["max_total_num_tokens"], out["tokenizer_path"], out["max_running_requests"]) == (9, "/m", 48)
