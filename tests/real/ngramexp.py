"""`specload experiment` on vLLM's CPU build with SmolLM2, a baseline arm against an n-gram arm: the plan
and the run that every such real test shares (the arms' command lines, their environment, the
experiment as a user starts it), so each test says only its [sweep] and what it checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from tests.real import smollm2, vllm
from tests.real.test_specload_real import REPO


def _inline(d: dict[str, str]) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in d.items()) + " }"


def ngram_plan(vllm_venv: Any, model: Path, name: str, sweep: str, max_model_len: int = 4096) -> str:
    """The experiment file: ``sweep`` is the [sweep] table's body (TOML lines)."""
    server = [
        str(vllm_venv.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", smollm2.SERVED_NAME, "--host", "{host}", "--port", "{port}", "--dtype", "float32",
        "--enforce-eager", "--max-model-len", str(max_model_len), "--max-num-seqs", "4", "--seed", "0",
    ]  # fmt: skip
    spec = ["--speculative-config", json.dumps(vllm.NGRAM), "--per-request-spec-decode-metrics", "summary"]
    env = {
        "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
    }  # fmt: skip
    spec_env = dict(env, LD_PRELOAD=str(vllm_venv.iomp)) if vllm_venv.iomp else env
    arms = textwrap.dedent(
        f"""
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
    return f'name = "{name}"\n[sweep]\n{textwrap.dedent(sweep).strip()}\n{arms}'


def run_ngram_experiment(
    vllm_venv: Any,
    model: Path,
    tmp_path: Path,
    name: str,
    sweep: str,
    timeout: float,
    max_model_len: int = 4096,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """Runs the experiment as a user would (``python -m specload experiment FILE``) and returns its
    directory and the finished process; fails the test when it did not exit 0."""
    plan = tmp_path / "exp.toml"
    plan.write_text(ngram_plan(vllm_venv, model, name, sweep, max_model_len))
    run_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "specload", "experiment", str(plan), "--out", str(out), "--no-plot"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=run_env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (directory,) = out.glob("experiment-*")
    return directory, proc
