"""The verdict on a real vLLM engine: its running cap, which it does not say outside dev mode, is
inferred from its gauges and named in the report and the comparison; two single runs of it are
told as measurements, not findings (docs/metrics.md, "The running cap" and "Single runs")."""

from __future__ import annotations

from pathlib import Path

from specload.analysis.comparison import build_comparison
from specload.analysis.run import load_run
from tests.real.test_vllm_server import run_sweep


def test_the_cap_a_vllm_server_does_not_say_is_inferred_and_named(vllm_capped, tmp_path: Path) -> None:
    # 16 requests of 128 tokens: the cap is inferred from 3 samples or more with a queue (analysis.cap),
    # and the samples come late, since the server's frontend, the client and its sampler share one
    # core (vLLM keeps the other for its engine): 5 in a 10 s level at worst, and one run of 8
    # requests of 64 tokens had a single sample with a queue.
    flags = (
        "--levels",
        "1,4",
        "--requests-per-level",
        "16",
        "--input-tokens",
        "64",
        "--output-tokens",
        "128",
    )
    flags += ("--metrics-interval", "0.1")
    a = load_run(run_sweep(vllm_capped, tmp_path / "a", *flags, "--label", "a"))
    b = load_run(run_sweep(vllm_capped, tmp_path / "b", *flags, "--label", "b"))
    assert "max_running_requests" not in a.info.server.data  # no dev mode: vLLM does not say it
    assert a.cap is not None and a.cap.inferred and a.cap.value == 2, a.samples
    assert a.max_running_notes() == [
        "C=4 exceeds the server's max_running_requests (2, inferred from its gauges): the excess requests queue"
    ]
    comp = build_comparison([a, b])
    (sentence,) = comp.sentences
    assert sentence.startswith("b vs a: ")  # (led by any sign change, told as measured)
    assert "t C=1, 4 each side is a single run, so these changes are no finding yet" in sentence
    assert sentence.endswith(
        "At C>=4 the server queued requests: its max_running_requests is 2, inferred from its gauges."
    )
    assert any(
        n.startswith("b: max_running_requests 2 inferred: the server did not say its cap") for n in comp.notes
    )
