"""`specload experiment` replaying a short window of the real Azure code trace against vLLM's CPU build
with SmolLM2: a baseline arm and an n-gram arm get the same requests at the same due times, and the
comparison pairs them request by request (its own module, so that no other vLLM server runs meanwhile:
two engines on two cores would starve each other)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.real import smollm2, vllm
from tests.real.test_smollm2_experiment import _inline
from tests.real.test_specload_real import REPO

AZURE_CODE = REPO / "tests" / "fixtures" / "traces" / "azure2023_code_head300.csv"
WINDOW = 12  # 1.4 s of the trace: 32k prompt tokens (34 to 7,433 a request), 165 output tokens


def test_vllm_baseline_and_ngram_replay_one_trace_window_paired(
    vllm_venv, smollm2_hf, tmp_path: Path
) -> None:
    """Every request of the window is paired; the paired median E2E difference has a narrower 95 %
    interval than the difference of the arms' medians (the requests' own E2E spans their 200-fold
    prompt lengths, the same request's difference does not), and comparison.md shows both."""
    server = [
        str(vllm_venv.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(smollm2_hf),
        "--served-model-name", smollm2.SERVED_NAME, "--host", "{host}", "--port", "{port}", "--dtype", "float32",
        "--enforce-eager", "--max-model-len", "8192", "--max-num-seqs", "4", "--seed", "0",
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
            name = "smollm2-trace"
            [sweep]
            backend = "openai"
            trace = {json.dumps(str(AZURE_CODE))}
            trace_format = "azure"
            trace_requests = {WINDOW}
            trace_speedup = 0.2
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
        timeout=1800,
        env=run_env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (directory,) = (tmp_path / "out").glob("experiment-*")
    doc = json.loads((directory / "experiment.json").read_text())
    (paired,) = doc["comparison"]["paired"]
    assert (paired["base"], paired["new"]) == ("baseline", "ngram")
    assert paired["window"] == WINDOW and paired["paired"] == WINDOW, paired
    e2e = next(f for f in paired["figures"] if f["key"] == "e2e")
    ci, unpaired = e2e["diff_ci"], e2e["unpaired_ci"]
    assert ci["hi"] - ci["lo"] < unpaired["hi"] - unpaired["lo"], e2e
    md = (directory / "comparison.md").read_text()
    assert "## Paired by trace request: ngram vs baseline (baseline)" in md
    assert "Δ paired median (95% CI)" in md and "Δ unpaired, of medians (95% CI)" in md
