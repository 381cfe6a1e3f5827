"""Draft length per load (docs/metrics.md, "Draft length per load"): arms that differ only in draft
length, the best setting per level, and the engine's own setting for it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from specload.analysis.draftlen import DraftLengthTable, DraftSetting, LevelChoice
from specload.experiment.draft import draft_family, draft_setting
from tests.conftest import specload_cmd

VLLM = [
    "python",
    "-m",
    "vllm.entrypoints.openai.api_server",
    "--model",
    "/m",
    "--port",
    "{port}",
    "--max-num-seqs",
    "8",
]


def _ngram(k: int) -> list[str]:
    cfg = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    return [*VLLM, "--speculative-config", json.dumps(cfg)]


def test_arms_that_differ_only_in_draft_length_make_one_family() -> None:
    s, rest = draft_setting("n3", _ngram(3))
    assert (s.engine, s.values, s.k) == ("vllm", (("num_speculative_tokens", 3),), 3)
    assert dict(s.method) == {"method": "ngram", "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    assert rest == draft_setting("n1", _ngram(1))[1]  # the same once the draft length is out
    arms = [
        ("base", VLLM),
        ("n1", _ngram(1)),
        ("n2", _ngram(2)),
        ("n3", _ngram(3)),
        ("other", [*VLLM, "--x"]),
    ]
    family = draft_family(arms)
    assert [(f.label, f.k) for f in family] == [("base", 0), ("n1", 1), ("n2", 2), ("n3", 3)]
    assert family[0].engine is None and family[0].flags() == "no speculative flags (speculation off)"
    # another model is another family: no two settings differ only in draft length
    assert draft_family([("a", _ngram(1)), ("b", [*_ngram(2), "--dtype", "half"])]) == []
    sg = ["sglang", "--port", "{port}", "--speculative-algorithm", "EAGLE"]
    a = draft_setting("a", [*sg, "--speculative-num-steps", "3", "--speculative-eagle-topk", "1"])[0]
    assert a.values == (("speculative_num_steps", 3), ("speculative_eagle_topk", 1)) and a.engine == "sglang"
    assert a.flags() == "--speculative-num-steps 3 --speculative-eagle-topk 1"
    b = draft_setting("b", [*sg, "--speculative-num-steps=1", "--speculative-eagle-topk=1"])[0]
    assert [
        f.label
        for f in draft_family(
            [("b", [*sg, "--speculative-num-steps=1"]), ("a", [*sg, "--speculative-num-steps", "3"])]
        )
    ] == ["b", "a"]
    assert b.k == 1


def _choice(level: float, best: str, tied: tuple[str, ...] = ()) -> LevelChoice:
    return LevelChoice(level, best, tied, False)


def test_the_choice_as_vllms_per_batch_size_table_and_as_sglang_flags() -> None:
    ks = [
        DraftSetting(f"n{k}", "vllm", (("num_speculative_tokens", k),), (("method", "ngram"),))
        for k in (1, 2, 3)
    ]
    choices = [_choice(1, "n3"), _choice(2, "n3"), _choice(4, "n2"), _choice(16, "n1"), _choice(64, "n1")]
    t = DraftLengthTable(ks, [1, 2, 4, 16, 64], choices, choices)
    # a level's choice from the batch size after the previous level up to its own; equal ones merged
    assert t.vllm_table(choices) == [[1, 2, 3], [3, 4, 2], [5, 64, 1]]
    assert t.vllm_config(choices) == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": [[1, 2, 3], [3, 4, 2], [5, 64, 1]],
    }
    # a server that runs at most 8: C=16 runs a batch of 8 (the first level at or above the cap
    # decides up to it), and C=64 adds no batch size
    capped = DraftLengthTable(ks, [1, 2, 4, 16, 64], choices, choices, cap=8)
    assert capped.vllm_table(choices) == [[1, 2, 3], [3, 4, 2], [5, 8, 1]]
    choices[-1] = _choice(64, "n3")
    assert capped.vllm_table(choices) == [[1, 2, 3], [3, 4, 2], [5, 8, 1]]
    off = DraftSetting("base", None)
    t = DraftLengthTable([off, *ks], [1, 16], [_choice(1, "n3"), _choice(16, "base")], [])
    assert t.vllm_table(t.agg) == [[1, 1, 3], [2, 16, 0]]  # 0: no speculation from batch size 2 on
    sg = [DraftSetting(f"s{k}", "sglang", (("speculative_num_steps", k),)) for k in (1, 3)]
    t = DraftLengthTable(sg, [1, 4, 16], [_choice(1, "s3"), _choice(4, "s3"), _choice(16, "s1")], [])
    assert t.engine_setting(t.agg, "C") == [
        "up to C=4: --speculative-num-steps 3",
        "from C=16: --speculative-num-steps 1",
    ]


# The simulator where the answer is known: every draft token costs its verify pass 1 ms per running
# request (time scale 0.5), each is accepted with p = 0.9, so a step of batch b with k draft tokens
# yields 1 + 0.9 + ... + 0.9^k tokens per request in 10 + 0.2 k + k b ms:
#   b = 1:  k=1 1.9/11.2 = 0.170, k=2 2.71/12.4 = 0.219, k=3 3.439/13.6 = 0.253 tokens/ms -> k=3 (+16%)
#   b = 16: k=1 1.9/26.2 = 0.0725, k=2 2.71/42.4 = 0.0639, k=3 3.439/58.6 = 0.0587      -> k=1 (+13%)
PARAMS = [
    "verify_ms=[[1, 10.0]]",
    "draft_ms=[[1, 0.2]]",
    "verify_us_per_draft_token=1000.0",
    "spec_accept_prob=0.9",
    "prefill_us_per_token=0.0",
]


def _sim_arm(k: int) -> str:
    cmd = ["{python}", "-m", "specload.sim", "--port", "{port}", "--model", "m", "--engine", "batch"]
    cmd += ["--preset", "mtp", "--time-scale", "0.5", "--speculative-num-steps", str(k)]
    for p in PARAMS:
        cmd += ["--param", p]
    return (
        f'[[arms]]\nlabel = "k{k}"\nspeculative = true\ncommand = {json.dumps(cmd)}\nready_timeout_s = 30\n'
    )


def test_the_draft_length_table_on_the_simulator_where_the_answer_is_known(tmp_path: Path) -> None:
    plan = tmp_path / "draft.toml"
    plan.write_text(
        'name = "draft"\n[sweep]\nbackend = "sglang"\ninput_tokens = 16\noutput_tokens = 64\n'
        "levels = [1, 16]\nrequests_per_user = 2.0\nmin_requests = 6\n\n"
        + "\n".join(_sim_arm(k) for k in (1, 2, 3))
    )
    done = subprocess.run(
        specload_cmd("experiment", str(plan), "--out", str(tmp_path / "out"), "--no-plot"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (exp,) = (tmp_path / "out").iterdir()
    doc = json.loads((exp / "experiment.json").read_text())
    table = doc["comparison"]["draft_length"]
    assert [s["label"] for s in table["settings"]] == ["k1", "k2", "k3"]
    for figure in ("agg", "per_req"):
        best = {c["level"]: c["best"] for c in table[figure]}
        assert best == {1: "k3", 16: "k1"}, (figure, table[figure])
        assert all(not c["inside_the_noise"] for c in table[figure]), table[figure]  # 13%+ apart
    md = (exp / "draft-length.md").read_text()
    assert "up to C=1: --speculative-num-steps 3\nfrom C=16: --speculative-num-steps 1" in md, md
    assert "single runs" in md and "## Draft length per load" in done.stdout
