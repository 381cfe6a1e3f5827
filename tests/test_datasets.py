"""specload.workload.datasets: vLLM's ShareGPT sampling rules, a torn file, JSONL prompts; and a real sweep
of dataset prompts against the simulator (whose /tokenize counts words, as its endpoints do)."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from specload.workload.datasets import (
    DatasetError,
    Pair,
    iter_json_array,
    jsonl_pairs,
    sample,
    sharegpt_pairs,
)
from tests.fixtures.sim_sweep import Words, sim_sweep


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def test_torn_json_array_yields_every_whole_element() -> None:
    text = json.dumps([{"a": 1}, {"b": [1, 2]}, {"c": "x"}], indent=2)
    assert list(iter_json_array(text)) == [{"a": 1}, {"b": [1, 2]}, {"c": "x"}]
    torn = text[: text.index('"c"') + 3]
    assert list(iter_json_array(torn)) == [{"a": 1}, {"b": [1, 2]}]


def test_sharegpt_pairs_take_the_first_two_turns(tmp_path: Path) -> None:
    convs = [
        {
            "id": "1",
            "conversations": [
                {"from": "human", "value": "q1"},
                {"from": "gpt", "value": "a1"},
                {"from": "human", "value": "q2"},
            ],
        },
        {"id": "2", "conversations": [{"from": "human", "value": "lonely"}]},
        {"id": "3", "conversations": [{"from": "human", "value": "q3"}, {"from": "gpt", "value": "a3"}]},
        {"id": "4", "conversations": ["turns as plain strings", "are no ShareGPT turns"]},  # skipped
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(convs))
    assert list(sharegpt_pairs(path)) == [Pair("q1", "a1"), Pair("q3", "a3")]


def test_vllm_length_rules() -> None:
    pairs = [
        Pair(words(3), words(10)),  # prompt under 4 tokens: skipped
        Pair(words(10), words(3)),  # completion under 4 tokens: skipped
        Pair(words(1025), words(10)),  # prompt over 1024: skipped
        Pair(words(1000), words(1049)),  # together over 2048: skipped
        Pair(words(1000), words(1048)),  # together exactly 2048: kept
        Pair(words(4), words(4)),  # the smallest kept
    ]
    items = sample(iter(pairs), 10, 0, Words(), None)
    assert sorted((i.prompt_tokens, i.output_tokens) for i in items) == [(4, 4), (1000, 1048)]
    fixed = sample(iter(pairs), 10, 0, Words(), 7)
    assert sorted(i.output_tokens for i in fixed) == [7, 7]


def test_sample_is_seeded_and_bounded() -> None:
    pairs = [Pair(words(5 + i), words(5)) for i in range(50)]
    a = sample(iter(pairs), 10, 1, Words(), None)
    assert len(a) == 10 and a == sample(iter(pairs), 10, 1, Words(), None)
    assert a != sample(iter(pairs), 10, 2, Words(), None)


def test_jsonl_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hello there you"}\n{"nope": 1}\n')
    with pytest.raises(DatasetError, match=r"p.jsonl:2: expected an object with 'prompt'"):
        list(jsonl_pairs(path))
    path.write_text('{"prompt": "a b c d", "output_tokens": 0}\n')
    with pytest.raises(DatasetError, match="'output_tokens' must be an integer >= 1"):
        list(jsonl_pairs(path))


@pytest.mark.parametrize("backend", ["openai", "chat"])
def test_sweep_with_a_jsonl_dataset(sim, tmp_path: Path, backend: str) -> None:
    lines = [{"prompt": words(8 + i), "output_tokens": 5 + i} for i in range(6)]
    lines.append(
        {
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": words(9)}],
            "output_tokens": 6,
        }
    )
    data = tmp_path / "prompts.jsonl"
    data.write_bytes(b"\n".join(orjson.dumps(x) for x in lines))
    s = sim("--ttft-ms", "5", "--itl-ms", "1", "--chat-template-tokens", "11")
    out = sim_sweep(
        s.url,
        tmp_path / "out",
        "--backend",
        backend,
        "--dataset",
        str(data),
        "--levels",
        "1,2",
        "--metrics-interval",
        "0",
    )
    run_dir = out.run_dir
    recs = out.records(None)
    assert len(recs) == 8 and all(r.status == "ok" for r in recs), [r.reason for r in recs]
    # The server counted what the dataset said (plus the template on chat), and gave the output asked.
    assert all(r.prompt_tokens == r.requested_prompt_tokens for r in recs), [
        (r.prompt_tokens, r.requested_prompt_tokens) for r in recs
    ]
    assert all(r.output_tokens == r.requested_output_tokens for r in recs)
    assert {r.requested_output_tokens for r in recs} <= {5, 6, 7, 8, 9, 10}
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["prompts"]["origin"].startswith(f"dataset {data}")
    assert "dataset" in out.stdout  # the report's header names the prompt source


def test_fixed_input_cuts_prompts_and_skips_short_ones() -> None:
    pairs = [Pair(words(3), words(9)), Pair(words(40), words(9)), Pair(words(12), None, 5)]
    items = sample(iter(pairs), 10, 0, Words(), 7, fixed_input=10)
    assert sorted((i.prompt_tokens, i.output_tokens) for i in items) == [(10, 7), (10, 7)]
    assert all(len(str(i.prompt).split()) == 10 for i in items)
