"""``specload experiment`` waits for an arm's server that is still loading its model (HTTP 503) as
``specload sweep`` does (``--loading-timeout``, a line saying so), instead of failing it at the arm's
``ready_timeout_s`` as "not healthy" (review 3a7af2e newcomer N3, in the experiment)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from specload.workload.vocab import invalid_prompt_hint
from tests.conftest import Procs, specload_cmd

ONE_LEVEL = ["--levels", "1", "--requests-per-level", "2", "--output-tokens", "8", "--input-tokens", "32"]


def _plan(tmp_path: Path, loading_s: float) -> Path:
    sim = [
        "{python}",
        "-m",
        "specload.sim",
        "--port",
        "{port}",
        "--model",
        "m",
        "--ttft-ms",
        "5",
        "--itl-ms",
        "1",
    ]
    path = tmp_path / "exp.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            [sweep]
            backend = "openai"
            [[arms]]
            label = "loads"
            command = {json.dumps([*sim, "--loading-s", str(loading_s)])}
            ready_timeout_s = 1.5
            [[arms]]
            label = "other"
            command = {json.dumps(sim)}
            """
        )
    )
    return path


def _run(procs: Procs, tmp_path: Path, *flags: str) -> tuple[int, str, dict]:
    proc = procs.popen(
        specload_cmd(
            "experiment", str(_plan(tmp_path, 4.0)), "--out", str(tmp_path / "out"), "--no-plot", *flags
        )
    )
    code = proc.wait(timeout=120)
    (directory,) = (tmp_path / "out").glob("experiment-*")
    return code, procs.log(proc), json.loads((directory / "experiment.json").read_text())


def test_an_arm_whose_server_loads_longer_than_its_ready_time_is_waited_for(
    tmp_path: Path, procs: Procs
) -> None:
    code, log, doc = _run(procs, tmp_path, *ONE_LEVEL)
    assert code == 0, log[-3000:]
    assert "specload: loads: the server is loading its model (" in log and "HTTP 503" in log
    assert "specload: loads: the server finished loading after" in log
    assert [r["status"] for r in doc["runs"]] == ["completed", "completed"]
    assert doc["runs"][0]["health_s"] > 3.0  # the 4 s of loading, past the arm's 1.5 s ready time


def test_a_server_loading_past_the_loading_timeout_is_not_ready_and_says_so(
    tmp_path: Path, procs: Procs
) -> None:
    code, log, doc = _run(procs, tmp_path, *ONE_LEVEL, "--loading-timeout", "1")
    assert code == 3, log[-3000:]
    assert "loads: the server was still loading its model after 1 s" in log
    assert "raise --loading-timeout (now 1 s)" in log
    assert [r["status"] for r in doc["runs"]] == ["not-ready", "pending"]


def test_the_vocabulary_hint_only_for_a_vocabulary_error_on_token_ids_not_the_server_s_own() -> None:
    vocab = "HTTP 400: token id 200000 is out of vocabulary"
    assert "--token-id-range" in (invalid_prompt_hint(vocab, "--token-id-range") or "")
    assert "--tokenizer" in (invalid_prompt_hint(vocab, "default range (unverified)") or "")
    # ids the server's own /tokenize gave cannot be outside its vocabulary; a refused max_tokens or a
    # limit on the answer is not about the prompt's ids at all
    assert invalid_prompt_hint(vocab, "server /tokenize") is None
    assert invalid_prompt_hint("HTTP 400: max_tokens 1 is out of range", "--token-id-range") is None
    assert invalid_prompt_hint("HTTP 422: temperature out of range", "default range (unverified)") is None
    assert invalid_prompt_hint(vocab, "one-token words (server /tokenize)") is None
