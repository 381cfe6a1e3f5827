"""Prompts that flatter speculation: run.json says what the prompts were, and a report or a verdict
whose acceptance rests on random ones says so (specload.analysis.prompt_material)."""

from __future__ import annotations

import json
from pathlib import Path

from specload.analysis.comparison import build_comparison
from specload.analysis.prompt_material import acceptance_caveat, random_caveat
from specload.analysis.run import load_run
from specload.present.report import render_report
from specload.workload.prompts import DATASET, IDS, RANDOM_IDS, RANDOM_WORDS, TEXT, PromptSource, material_of
from tests.fixtures.make_compare_runs import write_reference_pair

CAVEAT = (
    "random token ids (the reference method, --prompts random: 2x real text's accept length on a real "
    "model): not representative of real text; the speedup is likely overstated"
)


def test_describe_records_the_material() -> None:
    assert PromptSource(IDS, "server /tokenize").describe()["material"] == RANDOM_IDS
    assert PromptSource(TEXT, "one-token words (server /tokenize)").describe()["material"] == RANDOM_WORDS
    assert (
        PromptSource(IDS, "dataset sharegpt (12 prompts by vLLM's sampling rules)").describe()["material"]
        == DATASET
    )


def test_material_of_a_run_json_written_before_material() -> None:
    assert material_of({"kind": "ids", "origin": "default range (unverified)"}) == RANDOM_IDS
    assert material_of({"kind": "text", "origin": "common words (untokenized)"}) == RANDOM_WORDS
    assert material_of({"kind": "ids", "origin": "dataset x.jsonl (3 prompts)"}) == DATASET
    assert material_of({}) is None
    assert random_caveat({"kind": "ids", "origin": "server /tokenize"}) == CAVEAT
    assert random_caveat({"kind": "ids", "origin": "dataset sharegpt"}) is None
    assert random_caveat({}) is None


def _with_prompts(d: Path, prompts: dict[str, object]) -> None:
    meta = json.loads((d / "run.json").read_text())
    meta["prompts"] = prompts
    (d / "run.json").write_text(json.dumps(meta))


RANDOM = {"kind": "ids", "origin": "server /tokenize", "overhead_tokens": 1, "exact": True, "distinct_ids": 9}


def test_report_and_verdict_of_random_ids_say_so(tmp_path: Path) -> None:
    base, mtp = write_reference_pair(tmp_path)
    for d in (base, mtp):
        _with_prompts(d, RANDOM)
    spec = load_run(mtp)
    assert acceptance_caveat(spec) == CAVEAT
    assert acceptance_caveat(load_run(base)) is None  # no speculation: nothing overstated
    text = render_report(spec)
    accept_note = next(line for line in text.splitlines() if line.startswith("- Accept len from"))
    caveat_line = text.splitlines()[text.splitlines().index(accept_note) + 1]
    assert CAVEAT in caveat_line  # beside the acceptance
    assert CAVEAT not in render_report(load_run(base))
    comp = build_comparison([load_run(base), spec])
    assert comp.sentences[0].endswith(f"Prompts: {CAVEAT}.")


def test_dataset_prompts_carry_no_caveat(tmp_path: Path) -> None:
    base, mtp = write_reference_pair(tmp_path)
    for d in (base, mtp):
        _with_prompts(d, {"kind": "ids", "origin": "dataset sharegpt (400 prompts)", "material": DATASET})
    assert "not representative" not in render_report(load_run(mtp))
    comp = build_comparison([load_run(base), load_run(mtp)])
    assert "not representative" not in comp.sentences[0]
