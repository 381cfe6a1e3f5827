"""`specload experiment` on vLLM's CPU build with SmolLM2: a baseline arm and an n-gram arm, started,
smoke-checked, swept and compared by specload itself (its own module, so that the other module's
vLLM server is stopped before these two start: two engines on two cores would starve each other)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.real import smollm2, vllm
from tests.real.test_specload_real import REPO


def test_vllm_baseline_and_ngram_arms_with_one_acceptance_length(
    vllm_venv, smollm2_hf, tmp_path: Path
) -> None:
    """The smoke check reads the ngram arm's acceptance by the report's definition, 1 + accepted /
    drafting steps: at most k + 1 = 4 (it once wrote 4.57, output tokens / drafting steps), and the
    same figure the arm's report gives for its requests' definition."""
    server = [
        str(vllm_venv.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(smollm2_hf),
        "--served-model-name", smollm2.SERVED_NAME, "--host", "{host}", "--port", "{port}", "--dtype", "float32",
        "--enforce-eager", "--max-model-len", "4096", "--max-num-seqs", "4", "--seed", "0",
    ]  # fmt: skip
    spec = ["--speculative-config", json.dumps(vllm.NGRAM), "--per-request-spec-decode-metrics", "summary"]
    env = {
        "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
    }  # fmt: skip
    spec_env = dict(env, LD_PRELOAD=str(vllm_venv.iomp)) if vllm_venv.iomp else env
    plan = tmp_path / "exp.toml"
    plan.write_text(
        textwrap.dedent(
            f"""
            name = "smollm2-vllm"
            [sweep]
            backend = "chat"
            levels = [1]
            requests = 4
            output_tokens = 64
            input_tokens = 64
            read_timeout_s = 300.0

            [[arms]]
            label = "baseline"
            command = {json.dumps(server)}
            env = {_inline(env)}
            ready_timeout_s = 600

            [[arms]]
            label = "ngram"
            speculative = true
            command = {json.dumps([*server, *spec])}
            env = {_inline(spec_env)}
            ready_timeout_s = 600
            """
        )
    )
    run_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specload",
            "experiment",
            str(plan),
            "--out",
            str(tmp_path / "out"),
            "--no-plot",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
        env=run_env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (directory,) = (tmp_path / "out").glob("experiment-*")
    doc = json.loads((directory / "experiment.json").read_text())
    assert [r["status"] for r in doc["runs"]] == ["completed"] * 2, doc["runs"]
    base, ngram = (r["smoke"] for r in doc["runs"])
    assert not base["active"] and base["accept_length"] is None, base
    k = vllm.NGRAM["num_speculative_tokens"]
    assert ngram["active"] and 1.0 < ngram["accept_length"] <= k + 1, ngram
    assert ngram["source"] == "metrics.speculative_decoding" and ngram["configured"], ngram
    assert 1.0 < ngram["tokens_per_pass"] <= ngram["accept_length"], ngram
    assert "speculation active (accept length" in proc.stdout, proc.stdout[-2000:]


def _inline(d: dict[str, str]) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in d.items()) + " }"
