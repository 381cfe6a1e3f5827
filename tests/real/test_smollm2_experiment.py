"""`specload experiment` on vLLM's CPU build with SmolLM2: a baseline arm and an n-gram arm, started,
smoke-checked, swept and compared by specload itself (its own module, so that the other module's
vLLM server is stopped before these two start: two engines on two cores would starve each other)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.real import vllm
from tests.real.ngramexp import run_ngram_experiment


def test_vllm_baseline_and_ngram_arms_with_one_acceptance_length(
    vllm_venv, smollm2_hf, tmp_path: Path
) -> None:
    """The smoke check reads the ngram arm's acceptance by the report's definition, 1 + accepted /
    drafting steps: at most k + 1 = 4 (it once wrote 4.57, output tokens / drafting steps), and the
    same figure the arm's report gives for its requests' definition."""
    directory, proc = run_ngram_experiment(
        vllm_venv,
        smollm2_hf,
        tmp_path,
        "smollm2-vllm",
        """
        backend = "chat"
        levels = [1]
        requests = 4
        output_tokens = 64
        input_tokens = 64
        read_timeout_s = 300.0
        """,
        timeout=1200,
    )
    doc = json.loads((directory / "experiment.json").read_text())
    assert [r["status"] for r in doc["runs"]] == ["completed"] * 2, doc["runs"]
    base, ngram = (r["smoke"] for r in doc["runs"])
    assert not base["active"] and base["accept_length"] is None, base
    k = vllm.NGRAM["num_speculative_tokens"]
    assert ngram["active"] and 1.0 < ngram["accept_length"] <= k + 1, ngram
    assert ngram["source"] == "metrics.speculative_decoding" and ngram["configured"], ngram
    assert 1.0 < ngram["tokens_per_pass"] <= ngram["accept_length"], ngram
    assert "speculation active (accept length" in proc.stdout, proc.stdout[-2000:]
