"""specload itself against a real llama.cpp server: the sweeps a new user would run, checked
against the server's own counts (its usage per request and its /metrics counters)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SHORT = ("--levels", "1,4", "--input-tokens", "128", "--output-tokens", "24", "--metrics-interval", "0.5")


def sweep(url: str, out: Path, *flags: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess[str], Path | None]:
    cmd = [sys.executable, "-m", "specload", "sweep", "--host", url, "--out", str(out), *flags]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    runs = sorted(out.iterdir()) if out.exists() else []
    return proc, (runs[-1] if runs else None)


def records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines() if line]


def measured(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in records(run_dir) if r["phase"] == "measure"]


def check_exact(run_dir: Path, prompt: int, output: int, tolerance: float = 0.0) -> None:
    recs = measured(run_dir)
    assert len(recs) == 4 + 8  # budgets max(4, 2*C) at C=1 and C=4
    assert all(r["status"] == "ok" for r in recs), [r["reason"] for r in recs if r["status"] != "ok"]
    assert all(r["output_tokens"] == output and r["output_tokens_source"] == "usage" for r in recs)
    assert all(abs(r["prompt_tokens"] - prompt) <= tolerance * prompt for r in recs), [r["prompt_tokens"] for r in recs]
    assert all(r["ttft_s"] > 0 and r["tpot_s"] > 0 for r in recs)


def test_default_sweep_uses_the_real_vocabulary(llama_server, tmp_path: Path) -> None:
    srv = llama_server()
    before = srv.metrics()
    proc, run_dir = sweep(srv.url, tmp_path / "out", *SHORT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert run_dir is not None
    check_exact(run_dir, 128, 24)
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["prompts"]["origin"] == "server /tokenize" and meta["prompts"]["kind"] == "ids"
    # The server counted the same tokens: every generated token of the run (probe and warmup included).
    after = srv.metrics()
    generated = sum(r["output_tokens"] for r in records(run_dir)) + 1  # + the probe's one token
    assert after["llamacpp:tokens_predicted_total"] - before.get("llamacpp:tokens_predicted_total", 0) == generated


def test_chat_sweep_lands_on_the_asked_prompt_length(llama_server, tmp_path: Path) -> None:
    srv = llama_server()
    proc, run_dir = sweep(srv.url, tmp_path / "out", *SHORT, "--backend", "chat")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert run_dir is not None
    check_exact(run_dir, 128, 24, tolerance=0.01)
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["prompts"]["kind"] == "text" and meta["prompts"]["overhead_tokens"] > 0  # the chat template's


def test_local_tokenizer_gives_exact_prompts(llama_server, tiny_models, tmp_path: Path) -> None:
    srv = llama_server()
    for backend in ("openai", "chat"):
        proc, run_dir = sweep(srv.url, tmp_path / backend, *SHORT, "--backend", backend,
                              "--tokenizer", str(tiny_models.tokenizer_dir))  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert run_dir is not None
        check_exact(run_dir, 128, 24, tolerance=0.01 if backend == "chat" else 0.0)
        origin = json.loads((run_dir / "run.json").read_text())["prompts"]["origin"]
        assert str(tiny_models.tokenizer_dir) in origin


def test_ids_outside_the_vocabulary_stop_before_any_load_with_the_fixes(llama_server, tmp_path: Path) -> None:
    srv = llama_server()
    before = srv.metrics().get("llamacpp:tokens_predicted_total", 0)
    proc, run_dir = sweep(srv.url, tmp_path / "out", *SHORT, "--token-id-range", "1000:30000")
    assert proc.returncode == 2
    err = proc.stdout + proc.stderr
    assert "invalid tokens" in err.lower() and "--tokenizer" in err and "--token-id-range" in err
    assert run_dir is None  # no run directory for a sweep that never started
    assert srv.metrics().get("llamacpp:tokens_predicted_total", 0) == before


@pytest.mark.parametrize("processes", [None, 2])
def test_sweep_with_worker_processes(llama_server, tmp_path: Path, processes: int | None) -> None:
    srv = llama_server()
    extra = ("--processes", str(processes)) if processes else ()
    proc, run_dir = sweep(srv.url, tmp_path / "out", *SHORT, *extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert run_dir is not None
    check_exact(run_dir, 128, 24)
