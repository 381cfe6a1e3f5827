"""Real llama.cpp server: the fixtures work and the server behaves as specload will rely on.

Raw HTTP only (tests/real/server.py); nothing here imports specload. See tests/real/conftest.py.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time

import pytest

METRIC_TYPES = {
    "llamacpp:prompt_tokens_total": "counter",
    "llamacpp:prompt_tokens_cached_total": "counter",
    "llamacpp:prompt_seconds_total": "counter",
    "llamacpp:tokens_predicted_total": "counter",
    "llamacpp:tokens_predicted_seconds_total": "counter",
    "llamacpp:n_decode_total": "counter",
    "llamacpp:n_tokens_max": "counter",
    "llamacpp:spec_decode_num_draft_tokens_total": "counter",
    "llamacpp:spec_decode_num_accepted_tokens_total": "counter",
    "llamacpp:spec_decode_num_drafts_total": "counter",
    "llamacpp:prompt_tokens_seconds": "gauge",
    "llamacpp:predicted_tokens_seconds": "gauge",
    "llamacpp:requests_processing": "gauge",
    "llamacpp:requests_deferred": "gauge",
    "llamacpp:n_busy_slots_per_decode": "gauge",
}


def prompt_ids(tiny_models, n: int, seed: int = 0) -> list[int]:
    """n ordinary (non-special) token ids of the tiny model's vocabulary."""
    rng = random.Random(seed)
    return [rng.randrange(tiny_models.first_normal_id, tiny_models.n_vocab) for _ in range(n)]


def chatml(messages: list[dict]) -> str:
    """The tiny model's chat template, rendered by hand (with the generation prompt)."""
    return (
        "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        + "<|im_start|>assistant\n"
    )


def test_completions_stream_token_ids_exact_usage(llama_server, tiny_models):
    srv = llama_server()
    for n_in, n_out in [(48, 17), (300, 1), (1000, 200)]:
        ids = prompt_ids(tiny_models, n_in, seed=n_in)
        r = srv.stream(
            "/v1/completions",
            {
                "prompt": ids,
                "max_tokens": n_out,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        assert r.status == 200, r.raw[:500]
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.done, r.events[-3:]
        chunks = r.chunks
        assert all(c["object"] == "text_completion" for c in chunks)
        # one usage, in the last chunk, which also carries finish_reason and the timings
        assert [i for i, c in enumerate(chunks) if "usage" in c] == [len(chunks) - 1]
        last = chunks[-1]
        assert last["choices"][0]["finish_reason"] == "length"
        assert last["usage"]["completion_tokens"] == n_out
        assert last["usage"]["prompt_tokens"] == n_in
        assert last["usage"]["total_tokens"] == n_in + n_out
        assert last["timings"]["predicted_n"] == n_out
        assert last["timings"]["prompt_n"] + last["timings"]["cache_n"] == n_in
        # text chunks: at most one per token (incomplete UTF-8 pieces are merged into the next chunk)
        n_text = sum(1 for c in chunks[:-1] if c["choices"][0]["text"])
        assert 1 <= n_text <= n_out
        assert all("timings" not in c for c in chunks[:-1])


def test_completions_usage_is_sent_even_without_stream_options(llama_server, tiny_models):
    srv = llama_server()
    ids = prompt_ids(tiny_models, 32)
    for opts in ({}, {"stream_options": {"include_usage": False}}):
        r = srv.stream(
            "/v1/completions", {"prompt": ids, "max_tokens": 5, "ignore_eos": True, "stream": True, **opts}
        )
        assert r.status == 200 and r.done
        assert (r.usage["completion_tokens"], r.usage["prompt_tokens"]) == (5, 32)


def test_chat_stream(llama_server, tiny_models):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_models.tokenizer_json))
    srv = llama_server()
    messages = [{"role": "user", "content": "Hello world, the server decodes 1234 tokens."}]
    n_out = 23
    r = srv.stream(
        "/v1/chat/completions",
        {
            "messages": messages,
            "max_tokens": n_out,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert r.status == 200, r.raw[:500]
    assert r.done
    chunks = r.chunks
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    # ... content deltas ..., then a finish chunk with an empty delta, then the usage chunk
    finish = chunks[-2]
    assert finish["choices"][0]["finish_reason"] == "length"
    assert finish["choices"][0]["delta"] == {}
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == n_out
    # the server's prompt count is the tokenizer's count of the rendered chat template
    assert usage_chunk["usage"]["prompt_tokens"] == len(tok.encode(chatml(messages)).ids)
    assert usage_chunk["usage"]["prompt_tokens"] == len(tok.encode(messages[0]["content"]).ids) + 11
    assert usage_chunk["timings"]["predicted_n"] == n_out
    # without include_usage: no usage chunk, the timings ride on the finish chunk
    r = srv.stream(
        "/v1/chat/completions", {"messages": messages, "max_tokens": 4, "ignore_eos": True, "stream": True}
    )
    assert r.status == 200 and r.done
    assert r.usage is None
    assert r.chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert r.chunks[-1]["timings"]["predicted_n"] == 4


def test_tokenizer_and_server_info(llama_server, tiny_models):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_models.tokenizer_json))
    assert tok.get_vocab_size() == tiny_models.n_vocab
    srv = llama_server(parallel=3, ctx_per_slot=2048)
    for text in [
        "Hello world",
        "Numbers 12345 and 3.14159!",
        "Tabs\tand\nnew lines\n\n  indented",
        "Unicode: café, 日本語, 🚀",
        "<|im_start|>user\nhi<|im_end|>",
    ]:
        r = srv.post("/tokenize", {"content": text})
        assert r.status == 200
        assert r.json()["tokens"] == tok.encode(text).ids, text
        assert srv.post("/detokenize", {"tokens": tok.encode(text).ids}).json()["content"] == text
    pieces = srv.post("/tokenize", {"content": "Hello world", "with_pieces": True}).json()["tokens"]
    assert "".join(p["piece"] for p in pieces) == "Hello world" and all(
        set(p) == {"id", "piece"} for p in pieces
    )

    meta = srv.get("/v1/models").json()["data"][0]["meta"]
    assert meta["n_vocab"] == tiny_models.n_vocab
    assert meta["n_ctx"] == 2048  # per slot
    assert meta["n_ctx_train"] == tiny_models.n_ctx_train
    props = srv.get("/props").json()
    assert props["total_slots"] == 3
    assert props["default_generation_settings"]["n_ctx"] == 2048
    assert props["chat_template"] == tiny_models.chat_template
    assert props["bos_token"] == "<|endoftext|>" and props["eos_token"] == "<|im_end|>"
    slots = srv.get("/slots").json()
    assert [s["id"] for s in slots] == [0, 1, 2] and not any(s["is_processing"] for s in slots)
    assert srv.get("/health").json() == {"status": "ok"}


def test_errors(llama_server, tiny_models):
    srv = llama_server(ctx_per_slot=512)
    ids = prompt_ids(tiny_models, 8)
    for bad in (tiny_models.n_vocab, 30000, -1):
        r = srv.post("/v1/completions", {"prompt": ids + [bad], "max_tokens": 2, "stream": True})
        assert r.status == 400
        assert r.json() == {
            "error": {
                "code": 400,
                "message": "Prompt contains invalid tokens",
                "type": "invalid_request_error",
            }
        }
    r = srv.post("/v1/completions", {"prompt": prompt_ids(tiny_models, 600), "max_tokens": 2})
    assert r.status == 400
    assert r.json()["error"]["type"] == "exceed_context_size_error"
    assert (r.json()["error"]["n_prompt_tokens"], r.json()["error"]["n_ctx"]) == (600, 512)
    # prompt fits but prompt + max_tokens does not: 200, cut short at the context size
    r = srv.post(
        "/v1/completions", {"prompt": prompt_ids(tiny_models, 500), "max_tokens": 100, "ignore_eos": True}
    )
    assert r.status == 200
    assert r.json()["usage"]["completion_tokens"] == 512 - 500
    assert r.json()["choices"][0]["finish_reason"] == "length"
    r = srv.post("/v1/completions", raw=b'{"prompt": [1, 2,')
    assert r.status == 500 and r.json()["error"]["type"] == "server_error"
    r = srv.post("/v1/completions", {"model": "no-such-model", "prompt": ids, "max_tokens": 2})
    assert r.status == 200  # the model name is not checked


def test_streamed_response_closes_the_connection(llama_server, tiny_models):
    """The server advertises keep-alive but closes the TCP connection after a streamed response."""
    srv = llama_server()
    body = (
        b'{"prompt": %s, "max_tokens": 3, "ignore_eos": true, "stream": true}'
        % str(prompt_ids(tiny_models, 8)).encode()
    )
    req = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    ) + body
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
        s.sendall(req)
        buf = b""
        while not buf.endswith(b"\r\n0\r\n\r\n"):
            d = s.recv(65536)
            assert d, buf
            buf += d
        head = buf.split(b"\r\n\r\n", 1)[0].decode().lower()
        assert head.startswith("http/1.1 200")
        assert "transfer-encoding: chunked" in head and "keep-alive: timeout=5" in head
        assert b"data: [DONE]" in buf
        assert s.recv(10) == b""  # closed by the server right after the last chunk
    # a non-streamed response does keep the connection open
    c = srv.conn()
    try:
        for _ in range(3):
            c.request(
                "POST",
                "/v1/completions",
                body=body.replace(b'"stream": true', b'"stream": false'),
                headers={"Content-Type": "application/json"},
            )
            r = c.getresponse()
            assert r.status == 200 and not r.will_close
            r.read()
    finally:
        c.close()


def test_metrics_running_and_deferred(llama_server, tiny_models):
    srv = llama_server(parallel=2)
    m0 = srv.metrics()
    text = srv.get("/metrics").body.decode()
    for name, typ in METRIC_TYPES.items():
        assert f"# TYPE {name} {typ}\n" in text, name
    assert m0["llamacpp:requests_processing"] == 0 and m0["llamacpp:requests_deferred"] == 0

    seen: set[tuple[float, float]] = set()
    results: list[dict] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            m = srv.metrics()
            seen.add((m["llamacpp:requests_processing"], m["llamacpp:requests_deferred"]))
            time.sleep(0.02)

    def one(i: int) -> None:
        r = srv.stream(
            "/v1/completions",
            {
                "prompt": prompt_ids(tiny_models, 64, seed=i),
                "max_tokens": 400,
                "ignore_eos": True,
                "stream": True,
            },
        )
        results.append(r.usage)

    sampler = threading.Thread(target=sample)
    sampler.start()
    workers = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    done.set()
    sampler.join()
    assert [u["completion_tokens"] for u in results] == [400] * 4
    assert max(p for p, _ in seen) == 2
    assert max(d for _, d in seen) >= 1
    m1 = srv.metrics()
    assert m1["llamacpp:tokens_predicted_total"] - m0["llamacpp:tokens_predicted_total"] == 1600
    assert m1["llamacpp:prompt_tokens_total"] - m0["llamacpp:prompt_tokens_total"] == 4 * 64
    assert m1["llamacpp:requests_processing"] == 0 and m1["llamacpp:requests_deferred"] == 0


@pytest.mark.parametrize("synth_len,n_max", [(2.5, 3), (3.0, 4)])
def test_speculative_server_reports_drafts(llama_server, tiny_models, synth_len, n_max):
    srv = llama_server(speculative=True, spec_synth_len=synth_len, spec_draft_n_max=n_max)
    assert all(s["speculative"] for s in srv.get("/slots").json())
    m0 = srv.metrics()
    n_out = 150
    draft_n = accepted = 0
    for i in range(4):
        # a request seed makes the synthetic acceptance draws (and so every count below) reproducible
        r = srv.stream(
            "/v1/completions",
            {
                "prompt": prompt_ids(tiny_models, 64, seed=i),
                "max_tokens": n_out,
                "ignore_eos": True,
                "stream": True,
                "seed": 1000 + i,
                "stream_options": {"include_usage": True},
            },
        )
        assert r.status == 200 and r.done
        assert r.usage["completion_tokens"] == n_out
        t = r.timings
        assert t["predicted_n"] == n_out
        assert 0 < t["draft_n_accepted"] <= t["draft_n"] <= n_max * n_out
        draft_n += t["draft_n"]
        accepted += t["draft_n_accepted"]
    m1 = srv.metrics()

    def delta(name: str) -> float:
        return m1[name] - m0.get(name, 0.0)

    # the counters advance when a request finishes, by exactly its timings' draft figures
    assert delta("llamacpp:spec_decode_num_draft_tokens_total") == draft_n
    assert delta("llamacpp:spec_decode_num_accepted_tokens_total") == accepted
    drafts = delta("llamacpp:spec_decode_num_drafts_total")
    assert 0 < drafts <= draft_n
    per_pos = [
        delta(f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}')
        for i in range(n_max)
    ]
    assert sum(per_pos) == accepted
    assert per_pos == sorted(per_pos, reverse=True)  # a position is reached only through the ones before it
    # mean acceptance length, as the server defines it (target token included)
    mean_len = 1 + accepted / drafts
    assert abs(mean_len - synth_len) < 0.25, (mean_len, synth_len)


def test_baseline_server_has_no_draft_fields(llama_server, tiny_models):
    # -md alone loads the draft model but does not speculate: --spec-type is what turns it on
    srv = llama_server("-md", str(tiny_models.draft))
    r = srv.stream(
        "/v1/completions",
        {"prompt": prompt_ids(tiny_models, 16), "max_tokens": 20, "ignore_eos": True, "stream": True},
    )
    assert r.status == 200 and "draft_n" not in r.timings
    assert srv.metrics()["llamacpp:spec_decode_num_drafts_total"] == 0
    assert not any(s["speculative"] for s in srv.get("/slots").json())


def test_build_is_cached(llama_server_bin):
    from tests.real import llamacpp

    if os.environ.get("SPECLOAD_LLAMA_SERVER"):
        pytest.skip("SPECLOAD_LLAMA_SERVER is set: the cache is not used")
    t0 = time.monotonic()
    assert llamacpp.build() == llama_server_bin
    assert time.monotonic() - t0 < 5
