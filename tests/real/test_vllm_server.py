"""specload against a real vLLM engine (the CPU build, a tiny random-weight Llama), checked against the
engine's own counts: its usage per request, its /metrics counters, its per-request speculative metrics.

Each server is started once per session (conftest.py); every sweep here is a few dozen short requests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from specload.analysis.acceptance import TOLERANCE
from specload.core.records import SPEC_VLLM
from tests.real.test_specload_real import REPO, measured, records, sweep

# The default sweep's shape (reference budgets max(4, 2*C), a warmup, /metrics sampling), small.
SMALL = ("--levels", "1,4", "--input-tokens", "64", "--output-tokens", "32", "--metrics-interval", "0.5")
GEN = "vllm:generation_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


def family(metrics: dict[str, float], name: str) -> float:
    """A metric summed over its labels (vLLM labels every sample with engine and model_name)."""
    return sum(v for k, v in metrics.items() if k.split("{", 1)[0] == name)


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return family(after, name) - family(before, name)


def run_sweep(srv: Any, out: Path, *flags: str, timeout: float = 600) -> Path:
    proc, run_dir = sweep(srv.url, out, *flags, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert run_dir is not None
    return run_dir


def report_json(run_dir: Path) -> dict[int, dict[str, Any]]:
    """``specload report --format json`` of one run: {concurrency: level}."""
    out = subprocess.run(
        [sys.executable, "-m", "specload", "report", str(run_dir), "--format", "json", "--no-write"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return {row["concurrency"]: row for row in json.loads(out.stdout)}


def check_ok(run_dir: Path, n: int, output: int) -> list[dict[str, Any]]:
    recs = measured(run_dir)
    assert len(recs) == n
    assert all(r["status"] == "ok" for r in recs), [r["reason"] for r in recs if r["status"] != "ok"]
    assert all(r["output_tokens"] == output and r["output_tokens_source"] == "usage" for r in recs), [
        (r["output_tokens"], r["output_tokens_source"]) for r in recs
    ]
    assert all(r["ttft_s"] > 0 and r["tpot_s"] > 0 for r in recs)
    return recs


def test_default_sweep_counts_what_the_engine_generated(vllm_baseline, tmp_path: Path) -> None:
    srv = vllm_baseline
    before = srv.metrics()
    run_dir = run_sweep(srv, tmp_path / "out", *SMALL)
    after = srv.metrics()
    recs = check_ok(run_dir, 4 + 8, 32)  # budgets max(4, 2*C) at C=1 and C=4
    assert all(r["prompt_tokens"] == 64 for r in recs), [r["prompt_tokens"] for r in recs]
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["prompts"]["kind"] == "ids"
    # Every token the engine generated during the run is one specload counted, plus the probe's one
    # token before the load.
    generated = sum(r["output_tokens"] for r in records(run_dir)) + 1
    assert delta(before, after, GEN) == generated, (delta(before, after, GEN), generated)


def test_chat_through_the_models_own_template(vllm_baseline, vllm_model, tmp_path: Path) -> None:
    srv = vllm_baseline
    before = srv.metrics()
    run_dir = run_sweep(srv, tmp_path / "out", *SMALL, "--backend", "chat")
    after = srv.metrics()
    recs = check_ok(run_dir, 4 + 8, 32)
    # The prompt is text sized to 64 tokens with the template counted; the engine's usage decides.
    assert all(abs(r["prompt_tokens"] - 64) <= 2 for r in recs), [r["prompt_tokens"] for r in recs]
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["prompts"]["kind"] == "text" and meta["prompts"]["overhead_tokens"] > 0
    generated = sum(r["output_tokens"] for r in records(run_dir)) + 1  # + the probe's token
    assert delta(before, after, GEN) == generated, (delta(before, after, GEN), generated)
    # The template the engine applied is the model's own (ChatML from tokenizer_config.json).
    r = srv.post(
        "/v1/chat/completions",
        {
            "model": srv.model,
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 1,
            "ignore_eos": True,
        },
    )
    assert r.status == 200, r.body[:500]
    tok = srv.post(
        "/tokenize",
        {"model": srv.model, "prompt": "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"},
    )
    assert tok.status == 200, tok.body[:500]
    assert r.json()["usage"]["prompt_tokens"] == tok.json()["count"]
    assert vllm_model.chat_template.startswith("{%- for message in messages")


def counters_accept_length(before: dict[str, float], after: dict[str, float]) -> float:
    """The engine's own mean acceptance length over a window: 1 + accepted / drafts (the bonus token included)."""
    return 1 + delta(before, after, ACCEPTED) / delta(before, after, DRAFTS)


def test_baseline_and_ngram_acceptance_from_the_counters(vllm_baseline, vllm_ngram, tmp_path: Path) -> None:
    flags = ("--levels", "1,4", "--input-tokens", "64", "--output-tokens", "64", "--metrics-interval", "0.2")
    runs = {}
    windows = {}
    for label, srv in (("baseline", vllm_baseline), ("ngram", vllm_ngram)):
        before = srv.metrics()
        runs[label] = run_sweep(srv, tmp_path / label, *flags, "--label", label)
        windows[label] = (before, srv.metrics())
        check_ok(runs[label], 4 + 8, 64)
    assert delta(*windows["baseline"], DRAFTS) == 0
    engine = counters_accept_length(*windows["ngram"])
    # ngram drafts from the context; a random model's greedy output repeats, so nearly every draft is accepted.
    assert 1.5 < engine <= 4.0, engine
    base, spec = report_json(runs["baseline"]), report_json(runs["ngram"])
    assert sorted(base) == sorted(spec) == [1, 4]
    per_level = {}
    for c in (1, 4):
        assert base[c]["accept_length"] is None and base[c]["accept_length_source"] is None, base[c]
        per_level[c] = spec[c]["accept_length"]
        assert per_level[c] is not None and per_level[c] > 1, (c, per_level)
        # the ngram server sends metrics.speculative_decoding: the per-request figure comes first
        assert spec[c]["accept_length_source"] == SPEC_VLLM, spec[c]["accept_length_source"]
    # specload reads the same counters per level (deltas between its samples at the level's edges), so
    # the whole run's figure (the levels and their warmups) lies within the levels' range, give or
    # take the warmups.
    assert 0.9 * min(per_level.values()) <= engine <= 1.1 * max(per_level.values()), (per_level, engine)


def test_per_request_spec_decode_metrics_agree_with_the_counters(vllm_ngram) -> None:
    """``--per-request-spec-decode-metrics summary``: the final usage chunk of a stream (and a plain
    response) carries ``metrics.speculative_decoding``; alone on the server, one request's fields equal
    the counters' deltas over it (tolerance 0: same engine, same steps). specload does not read these
    yet; this pins the names and meaning it will rely on."""
    srv = vllm_ngram
    prompt = list(range(300, 364))
    body = {
        "model": srv.model,
        "prompt": prompt,
        "max_tokens": 64,
        "min_tokens": 64,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    for stream in (True, False):
        before = srv.metrics()
        if stream:
            res = srv.stream(
                "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}}
            )
            assert res.status == 200 and res.done, res.raw[-500:]
            final = [e for e in res.chunks if e.get("usage")]
            assert len(final) == 1 and final[0]["choices"] == []
            payload = final[0]
        else:
            r = srv.post("/v1/completions", body, timeout=120)
            assert r.status == 200, r.body[:500]
            payload = r.json()
        after = srv.metrics()
        assert payload["usage"]["completion_tokens"] == 64
        sd = payload["metrics"]["speculative_decoding"]
        assert set(sd) >= {
            "mean_acceptance_length",
            "draft_acceptance_rate",
            "acceptance_histogram",
            "num_spec_steps",
            "num_accepted_draft_tokens",
            "num_draft_tokens",
            "num_spec_tokens",
        }, sd
        assert sd["num_spec_tokens"] == 3 and len(sd["acceptance_histogram"]) == 4
        assert sum(sd["acceptance_histogram"]) == sd["num_spec_steps"] > 0
        assert sum(j * n for j, n in enumerate(sd["acceptance_histogram"])) == sd["num_accepted_draft_tokens"]
        assert sd["num_spec_steps"] == delta(before, after, DRAFTS), (sd, stream)
        assert sd["num_accepted_draft_tokens"] == delta(before, after, ACCEPTED), (sd, stream)
        assert sd["num_draft_tokens"] == delta(before, after, DRAFT_TOKENS), (sd, stream)
        assert abs(sd["mean_acceptance_length"] - counters_accept_length(before, after)) < 1e-9
        assert (
            abs(sd["draft_acceptance_rate"] - sd["num_accepted_draft_tokens"] / sd["num_draft_tokens"]) < 1e-9
        )
        # Every step yields its accepted drafts plus one token of its own; the prefill yields the first.
        assert sd["num_spec_steps"] + sd["num_accepted_draft_tokens"] <= 64


def test_max_num_seqs_caps_the_running_requests(vllm_capped, tmp_path: Path) -> None:
    """--max-num-seqs 2 at C=4: the engine runs 2 and queues the rest (the report's Srv run / queue max).

    16 requests of 128 tokens: the engine keeps one core, and the server's frontend, the client and
    its /metrics sampler share the other, so the samples come late (5 in a 10 s level at worst, of
    one every 0.1 s); in a level of 8 requests of 64 tokens one run's samples all read 0."""
    flags = ("--levels", "4", "--requests-per-level", "16", "--input-tokens", "64", "--output-tokens", "128")
    run_dir = run_sweep(
        vllm_capped, tmp_path / "out", *flags, "--metrics-interval", "0.1", "--label", "capped"
    )
    check_ok(run_dir, 16, 128)
    level = report_json(run_dir)[4]
    assert level["server_running_max"] == 2, level
    assert 1 <= level["server_queued_max"] <= 2, level
    assert level["accept_length"] is None


def test_acceptance_from_the_responses_and_from_the_counters_agree(vllm_ngram, tmp_path: Path) -> None:
    """A sweep of the ngram server: every acceptance figure from its per-request metrics, the same
    figures from its counters beside them (per position too), within the tolerance, and no note; ITL per token, from the
    running usage of every event (stream_options.continuous_usage_stats)."""
    flags = ("--levels", "1,4", "--input-tokens", "64", "--output-tokens", "64", "--metrics-interval", "0.2")
    run_dir = run_sweep(vllm_ngram, tmp_path / "ngram", *flags)
    recs = check_ok(run_dir, 4 + 8, 64)
    assert all(r["spec_source"] == SPEC_VLLM and r["spec_verify_ct"] > 0 for r in recs), recs[0]
    assert all(r["itl_unit"] == "token" for r in recs)
    for c, lv in report_json(run_dir).items():
        a = lv["acceptance"]
        keys = ("length", "rate", "tokens_per_pass", "histogram", "per_position")
        assert a["sources"] == dict.fromkeys(keys, SPEC_VLLM), a
        assert a["counter_length"] is not None and a["counter_rate"] is not None, a
        assert abs(a["counter_length"] - a["length"]) <= TOLERANCE * a["length"], (c, a)
        assert abs(a["counter_rate"] - a["rate"]) <= TOLERANCE * a["rate"], (c, a)
        assert a["note"] is None, a["note"]
        hist = a["histogram"]
        assert len(hist) == 4 and sum(j * n for j, n in enumerate(hist)) == a["accepted"], a
        assert a["length"] == 1 + a["accepted"] / sum(hist)
        # at least k accepted: never more often than at least k - 1
        assert 1 >= a["per_position"][0] >= a["per_position"][1] >= a["per_position"][2] >= 0, a
        # the per-position counters (vllm:spec_decode_num_accepted_tokens_per_pos_total) beside them,
        # position by position within the tolerance (the note above would name a position beyond it)
        ctr = a["counter_per_position"]
        assert len(ctr) == len(a["per_position"]) == 3, a
        assert all(
            abs(x - y) <= TOLERANCE * max(y, 1e-9) or abs(x - y) < 0.01
            for x, y in zip(ctr, a["per_position"], strict=True)
        ), a
