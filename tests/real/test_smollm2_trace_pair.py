"""`specload experiment` replaying a short window of the real Azure code trace against vLLM's CPU build
with SmolLM2: a baseline arm and an n-gram arm get the same requests at the same due times, and the
comparison pairs them request by request (its own module, so that no other vLLM server runs meanwhile:
two engines on two cores would starve each other)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.real.ngramexp import run_ngram_experiment
from tests.real.test_specload_real import REPO

AZURE_CODE = REPO / "tests" / "fixtures" / "traces" / "azure2023_code_head300.csv"
WINDOW = 12  # 1.4 s of the trace: 32k prompt tokens (34 to 7,433 a request), 165 output tokens


def test_vllm_baseline_and_ngram_replay_one_trace_window_paired(
    vllm_venv, smollm2_hf, tmp_path: Path
) -> None:
    """Every request of the window is paired; the paired median E2E difference has a narrower 95 %
    interval than the difference of the arms' medians (the requests' own E2E spans their 200-fold
    prompt lengths, the same request's difference does not), and comparison.md shows both."""
    directory, _ = run_ngram_experiment(
        vllm_venv,
        smollm2_hf,
        tmp_path,
        "smollm2-trace",
        f"""
        backend = "openai"
        trace = {json.dumps(str(AZURE_CODE))}
        trace_format = "azure"
        trace_requests = {WINDOW}
        trace_speedup = 0.2
        read_timeout_s = 300.0
        """,
        timeout=1800,
        max_model_len=8192,
    )
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
