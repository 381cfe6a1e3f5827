"""The prediction on a real engine: vLLM's CPU build with SmolLM2, baseline against ngram (k = 3).

Both arms are swept at every level by `specload experiment` (so that every level has a measurement to
hold the prediction against); the prediction then reads the baseline run and only the ngram run's
probe levels, as `specload predict` would, and its error at every level is printed and written to
predict-error.md in the experiment directory. Whatever the error is, it is reported, not asserted
small: a 135M model on two shared CPU cores is allowed to be hard to predict (docs/experiment.md,
"Predict, then verify", holds the table this test measured).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from specload.analysis import stepcost as sc
from specload.analysis.predict import build, check, run_obs
from specload.analysis.run import load_run
from specload.present.predictview import checked_table, render
from tests.real.ngramexp import run_ngram_experiment

LEVELS = [1, 2, 4, 8]  # the server is capped at 4 running: the last level is past the cap


def test_vllm_ngram_prediction_error_per_level(vllm_venv, smollm2_hf, tmp_path: Path) -> None:
    directory, _ = run_ngram_experiment(
        vllm_venv,
        smollm2_hf,
        tmp_path,
        "smollm2-vllm-predict",
        f"""
        backend = "chat"
        levels = {json.dumps(LEVELS)}
        requests = 8
        output_tokens = 128
        input_tokens = 256
        read_timeout_s = 300.0
        """,
        timeout=2400,
    )
    doc = json.loads((directory / "experiment.json").read_text())
    base_run, spec_run = (load_run(r["run_dir"]) for r in doc["runs"])
    cap = spec_run.cap.value if spec_run.cap is not None else None
    probes = sc.choose_probes(LEVELS, cap)
    probe_run = replace(spec_run, levels=[s for s in spec_run.levels if s.concurrency in probes])
    pred = build([base_run], [probe_run])
    pred.checked = check(pred, run_obs([spec_run]))
    table = checked_table(pred)
    text = (
        f"vLLM CPU, SmolLM2-135M, baseline vs ngram k=3, cap {cap}, probes at C = {probes}\n\n"
        f"{table}\n\n{render(pred)}"
    )
    (directory / "predict-error.md").write_text(text)
    print(text)
    assert [c.concurrency for c in pred.checked] == LEVELS, table
    assert all(c.measured > 0 and c.predicted > 0 for c in pred.checked), table
