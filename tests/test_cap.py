"""The running cap on every engine: read where the server says it, else inferred from its gauges
(docs/metrics.md, "The running cap"), and named in the notes and the verdict either way."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from specload.analysis.cap import RunningCap, infer_cap, running_cap, sparse_sampling_notes
from specload.analysis.comparison import build_comparison
from specload.analysis.metrics import LevelStats, ServerSample
from specload.analysis.run import Run, load_run
from specload.client.introspect import llamacpp_props, server_config, vllm_dev_config
from specload.core.rundir import RunMeta, ServerInfo
from specload.experiment.cap import command_cap, declare_command_cap
from specload.present.report import _notes as report_notes
from tests.conftest import run_together, specload_cmd


def _samples(*pairs: tuple[float, float]) -> list[ServerSample]:
    return [ServerSample(t=float(i), running=r, queued=q) for i, (r, q) in enumerate(pairs)]


def test_a_running_plateau_with_a_queue_behind_it_is_the_cap() -> None:
    ramp = [(1, 0), (2, 0), (4, 0)]
    held = [(8, 3), (8, 5), (7, 1), (8, 8), (8, 2)]  # one moment of admission at 7
    assert infer_cap(_samples(*ramp, *held)) == (8, 4, 5)
    cap = running_cap(ServerInfo({}), _samples(*ramp, *held))
    assert cap is not None and cap.inferred and cap.value == 8 and cap.how == ", inferred from its gauges"
    assert "running gauge held 8 while its queue gauge was above zero (4 of 5 samples" in cap.detail
    # more running elsewhere: the queue was a moment of admission, not a cap
    assert infer_cap(_samples(*held, (9, 0))) is None
    # too few samples at the top, or a queue while the running count wanders
    assert infer_cap(_samples((8, 1), (8, 1), (3, 1))) is None
    assert infer_cap(_samples((8, 1), (6, 1), (5, 1), (4, 1), (3, 1), (8, 2), (8, 1))) is None
    assert infer_cap(_samples((4, 0), (4, 0), (4, 0))) is None  # no queue: no cap shown
    # a declared cap wins, and says where it was read
    declared = running_cap(ServerInfo({"max_running_requests": 6, "max_running_requests_source": "X"}), [])
    assert (
        declared is not None
        and not declared.inferred
        and (declared.value, declared.how) == (6, ", read from X")
    )
    sglang = running_cap(ServerInfo({"max_running_requests": 48}), _samples(*held))
    assert sglang is not None and (sglang.value, sglang.how) == (48, "")


def test_the_engines_own_words_for_the_cap() -> None:
    dev = {
        "vllm_config": {
            "scheduler_config": {"max_num_seqs": 8, "max_num_batched_tokens": 2048},
            "speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3},
        }
    }
    assert vllm_dev_config(dev) == {
        "max_num_seqs": 8,
        "max_running_requests": 8,
        "max_running_requests_source": "vLLM /server_info scheduler_config.max_num_seqs",
        "speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3},
    }
    assert vllm_dev_config({"vllm_config": "model='m', speculative_config=None"}) == {}  # the text format
    assert llamacpp_props({"total_slots": 3, "n_ctx": 2048}) == {
        "total_slots": 3,
        "max_running_requests": 3,
        "max_running_requests_source": "llama.cpp /props total_slots",
    }
    assert llamacpp_props({"total_slots": 0}) == {}
    assert command_cap(["vllm", "--max-num-seqs", "8", "--port", "1"]) == (8, "--max-num-seqs")
    assert command_cap(["x", "--max-num-seqs=16"]) == (16, "--max-num-seqs")
    assert command_cap(["llama-server", "-np", "4"]) == (4, "-np")
    assert command_cap(["x", "--max-num-seqs"]) is None


def test_a_started_servers_command_line_cap_goes_into_run_json(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"server": {"engine": "vllm", "max_model_len": 2048}}))
    assert declare_command_cap(tmp_path, ["python", "-m", "vllm", "--max-num-seqs", "2"]) == 2
    server = json.loads((tmp_path / "run.json").read_text())["server"]
    assert server["max_running_requests"] == 2 and server["engine"] == "vllm"
    assert server["max_running_requests_source"] == "the --max-num-seqs 2 of the server's command line"
    # a server that said its cap keeps it
    (tmp_path / "run.json").write_text(json.dumps({"server": {"max_running_requests": 48}}))
    assert declare_command_cap(tmp_path, ["x", "--max-num-seqs", "2"]) is None


def _sweep(server: Any, out: Path, label: str) -> Path:
    flags = ("--levels", "1,4", "--min-requests", "8", "--input-tokens", "16", "--output-tokens", "40")
    flags += ("--metrics-interval", "0.25")  # (C=4's 4 waves of 0.4 s: a dozen samples with a queue)
    done = subprocess.run(
        specload_cmd("sweep", "--host", server.url, "--out", str(out), "--label", label, *flags),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    return run_dir


VLLM_LIKE = ("--max-num-seqs", "2", "--ttft-ms", "20", "--itl-ms", "10")


def test_a_vllm_server_that_does_not_say_its_cap_shows_it_in_its_gauges(sim: Any, tmp_path: Path) -> None:
    server, twin = sim(*VLLM_LIKE), sim(*VLLM_LIKE)  # (one each: the two sweeps run at once)
    cfg = server_config(server.url)
    assert cfg["engine"] == "vllm" and "max_running_requests" not in cfg  # no /get_server_info, no dev mode
    a, b = run_together(
        lambda: load_run(_sweep(server, tmp_path / "a", "a")),
        lambda: load_run(_sweep(twin, tmp_path / "b", "b")),
    )
    assert a.cap is not None and a.cap.inferred and a.cap.value == 2, a.samples
    assert a.max_running_notes() == [
        "C=4 exceeds the server's max_running_requests (2, inferred from its gauges): the excess requests queue"
    ]
    comp = build_comparison([a, b])
    assert (
        "At C>=4 the server queued requests: its max_running_requests is 2, inferred from its gauges."
        in (comp.sentences[0])
    )
    assert any(
        n.startswith("b: max_running_requests 2 inferred: the server did not say its cap") for n in comp.notes
    )


def test_a_vllm_server_in_dev_mode_says_its_cap(sim: Any) -> None:
    server = sim(*VLLM_LIKE, "--vllm-server-dev-mode")
    cfg = server_config(server.url)
    assert (cfg["engine"], cfg["max_num_seqs"], cfg["max_running_requests"]) == ("vllm", 2, 2)
    assert cfg["max_running_requests_source"] == "vLLM /server_info scheduler_config.max_num_seqs"
    assert cfg["speculative_config"] is None
    cap = running_cap(ServerInfo(cfg), [])
    assert cap is not None and cap.how == ", read from vLLM /server_info scheduler_config.max_num_seqs"


def test_a_level_whose_gauges_answered_seldom_is_named(tmp_path: Path) -> None:
    """A vLLM frontend sharing a core with the client answered its /metrics 4 times in a level of
    7.9 s asked every 0.1 s (each time as requests ended, its running gauge at 0): the report says
    so beside the level's Srv run / queue figures. Half the asked samples is enough; a level asked
    fewer than 10 times is not judged."""

    def level(label: str, wall_s: float, n: int) -> LevelStats:
        return LevelStats(concurrency=4, repeat=0, label=label, wall_s=wall_s, server_samples=n)

    levels = [level("c004", 7.9, 4), level("c008", 7.9, 40), level("c016", 7.9, 39), level("c001", 0.9, 0)]
    want = [
        "c004: the server's /metrics answered 4 times in 7.9 s (asked every 0.1 s): Srv run and Srv "
        "queue, and a cap inferred from them, come from those samples alone (a server busy with the "
        "load answers late)",
        "c016: the server's /metrics answered 39 times in 7.9 s (asked every 0.1 s): Srv run and Srv "
        "queue, and a cap inferred from them, come from those samples alone (a server busy with the "
        "load answers late)",
    ]
    assert sparse_sampling_notes(levels, 0.1) == want
    assert sparse_sampling_notes(levels, 1.0) == []  # each level asked 8 times at most: not judged

    def run(server_metrics: str, scenario: dict[str, Any]) -> Run:
        return Run(tmp_path, {}, levels, info=RunMeta(server_metrics=server_metrics, scenario=scenario))

    sampled = run("sampled", {"metrics_interval_s": 0.1})
    assert sampled.sampling_notes() == want
    assert all(n in report_notes(sampled) for n in want)
    assert run("unavailable", {"metrics_interval_s": 0.1}).sampling_notes() == []
    assert run("sampled", {}).sampling_notes() == []


def test_an_inferred_cap_is_the_cap_of_every_consumer() -> None:
    """Run.cap is the one accessor: a cap the gauges show (the server did not say it) is named in the
    notes, drawn on the HTML charts of a report and a comparison, given in compare's JSON, and used by
    the live view's figures, as a declared one is."""
    from specload.analysis.live import LiveRun
    from specload.present.compare import to_dict
    from specload.present.htmlpage import compare_charts, report_charts, run_lines

    samples = [ServerSample(t=float(i), running=48.0, queued=16.0) for i in range(40)]
    levels = [LevelStats(concurrency=c, repeat=0, label=f"c{c:03d}") for c in (16, 64)]
    run = Run(Path("x"), {}, levels, samples=samples, info=RunMeta())
    assert run.cap is not None and run.cap.inferred and run.cap.value == 48
    assert run.max_running_notes() and run_lines(run).max_running == 48

    def cap_marks(charts: list[Any]) -> set[str]:
        return {m.text for c in charts for m in c.marks if "cap" in m.text}

    assert cap_marks(report_charts(run)) == {"cap 48"}
    other = Run(Path("y"), {"label": "y"}, levels, samples=samples, info=RunMeta(label="y"))
    comp = build_comparison([run, other])
    assert cap_marks(compare_charts(comp)) == {"x: cap 48", "y: cap 48"}
    assert [r["max_running_requests"] for r in to_dict(comp)["runs"]] == [48, 48]
    live = LiveRun(1, ServerInfo({}))
    assert live.cap is None
    for s in samples:
        live.add_sample(s)
    assert live.cap == 48


def test_the_caps_json_names_how_it_is_known_without_the_sentences_comma() -> None:
    """compare's JSON ``running_cap``: its fields in order, ``how`` without the leading ", "."""
    cap = RunningCap(48, True, ", inferred from its gauges", "60% of the queued samples at 48")
    assert list(cap.to_json().items()) == [
        ("value", 48),
        ("inferred", True),
        ("how", "inferred from its gauges"),
        ("detail", "60% of the queued samples at 48"),
    ]
