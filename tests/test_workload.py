"""specload.workload.request and the scenario fields behind it: classes, draws, prefix groups, conversations."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from specload.core.records import FAILED, OK, PHASE_MEASURE, PHASE_WARMUP, make_record
from specload.workload.config import (
    Scenario,
    ScenarioError,
    apply_overrides,
    load_scenario,
    scenario_from_dict,
)
from specload.workload.datasets import Item
from specload.workload.prompts import TEXT, PromptSource, make_prompt, range_source
from specload.workload.request import RequestMaker, draw_request, pick_class, request_classes, uniforms

IDS_SRC = range_source(1000, 30000, "test")
TEXT_SRC = PromptSource(TEXT, "words")


def sc_of(**fields: object) -> Scenario:
    return apply_overrides(Scenario(), fields)


def record(output_tokens: int, status: str = OK) -> object:
    return make_record(
        t_send=0.0,
        t_first=0.1,
        t_last=0.2,
        t_end=0.3,
        output_tokens=output_tokens,
        level=0,
        concurrency=1,
        phase=PHASE_MEASURE,
        seq=0,
        backend="openai",
        status=status,
        reason=None,
        http_status=200,
        output_tokens_source="usage",
        prompt_tokens=None,
        requested_output_tokens=output_tokens,
        requested_prompt_tokens=0,
        chunks=1,
        itl_max_s=None,
        spec_verify_ct=None,
        worker="local",
    )


# the plain scenario is what it was -------------------------------------------------------------------


@pytest.mark.parametrize("src", [IDS_SRC, replace(IDS_SRC, overhead=1), TEXT_SRC], ids=["ids", "bos", "text"])
@pytest.mark.parametrize("shared", [0, 100])
def test_the_plain_scenario_sends_the_same_prompts_as_before(src: PromptSource, shared: int) -> None:
    sc = sc_of(input_tokens=300, output_tokens=50, shared_prefix_tokens=shared)
    maker = RequestMaker(sc, src)
    for level, phase, seq in ((0, PHASE_MEASURE, 0), (2, PHASE_WARMUP, 3), (5, PHASE_MEASURE, 77)):
        req = maker.plan(level, phase, seq, 50)
        n = level * 1_000_000 + (500_000 if phase == PHASE_WARMUP else 0) + seq
        assert req.prompt == make_prompt(src, sc.seed, n, 300, shared)  # the prompt of specload before mixes
        assert (req.prompt_tokens, req.max_tokens) == (300, 50)
        assert (req.request_class, req.turn, req.conversation) == (None, None, None)
        assert req.prefix_group == (0 if shared else None) and not req.wants_answer


# draws -----------------------------------------------------------------------------------------------


def test_draws_are_a_pure_function_of_the_ticket_in_any_process() -> None:
    # Another interpreter, with another hash seed, draws the same for every ticket.
    tickets = [(0, PHASE_MEASURE, s) for s in range(30)] + [(3, PHASE_WARMUP, s) for s in range(5)]
    here = [uniforms(7, lv, ph, s) for lv, ph, s in tickets]
    code = (
        "import json, sys; from specload.workload.request import uniforms; "
        "print(json.dumps([uniforms(7, lv, ph, s) for lv, ph, s in json.loads(sys.argv[1])]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(tickets)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": "", **({"PYTHONPATH": p} if (p := _pythonpath()) else {})},
    )
    assert json.loads(out.stdout) == here
    assert uniforms(7, 0, PHASE_MEASURE, 1) != uniforms(8, 0, PHASE_MEASURE, 1)  # the seed matters
    assert uniforms(7, 0, PHASE_MEASURE, 1) != uniforms(7, 1, PHASE_MEASURE, 1)  # and the level
    assert uniforms(7, 0, PHASE_MEASURE, 1) != uniforms(7, 0, PHASE_WARMUP, 1)  # and the phase


def _pythonpath() -> str:
    import os

    return os.environ.get("PYTHONPATH", str(Path(__file__).resolve().parent.parent))


def test_each_drawn_quantity_is_independent_of_the_others() -> None:
    # Changing the input distribution does not change the output lengths drawn for the same tickets.
    a = request_classes(sc_of(input_dist="uniform:10:20", output_dist="uniform:5:500"))
    b = request_classes(sc_of(input_dist="normal:mean=90,sd=9", output_dist="uniform:5:500"))
    outs = [[draw_request(c, 0, 0, PHASE_MEASURE, s).output_tokens for s in range(50)] for c in (a, b)]
    assert outs[0] == outs[1]


def test_class_weights_hold_over_many_tickets() -> None:
    sc = scenario_from_dict(
        {
            "classes": [
                {"name": "chat", "weight": 7, "input_tokens": 200, "output_tokens": 100},
                {"name": "summary", "weight": 3, "input_tokens": 4000, "output_tokens": 300},
            ],
            "input_tokens": 5000,
        }
    )
    classes = request_classes(sc)
    n = 20_000
    picked = [draw_request(classes, 0, 1, PHASE_MEASURE, s) for s in range(n)]
    share = sum(d.cls.name == "chat" for d in picked) / n
    assert abs(share - 0.7) < 0.015  # 4.6 standard errors
    assert {(d.cls.name, d.input_tokens, d.output_tokens) for d in picked} == {
        ("chat", 200, 100),
        ("summary", 4000, 300),
    }
    assert pick_class(classes, 0.0).name == "chat" and pick_class(classes, 0.6999).name == "chat"
    assert pick_class(classes, 0.7001).name == "summary" and pick_class(classes, 0.99999).name == "summary"


def test_prefix_groups_share_their_prefix_and_only_it() -> None:
    sc = sc_of(input_tokens=200, shared_prefix_tokens=64, prefix_groups=4)
    maker = RequestMaker(sc, IDS_SRC)
    reqs = [maker.plan(0, PHASE_MEASURE, s, 10) for s in range(200)]
    groups = {r.prefix_group for r in reqs}
    assert groups == {0, 1, 2, 3}
    for g in groups:
        mine = [r.prompt for r in reqs if r.prefix_group == g]
        assert len({tuple(p[:64]) for p in mine}) == 1  # one prefix per group
        assert len({tuple(p[64:80]) for p in mine}) == len(mine)  # then distinct
    assert len({tuple(r.prompt[:64]) for r in reqs}) == 4
    # Group 0 is the prefix a plain --shared-prefix always had.
    zero = next(r for r in reqs if r.prefix_group == 0)
    assert zero.prompt[:64] == make_prompt(IDS_SRC, 0, 5, 200, 64)[:64]


def test_drawn_lengths_size_the_prompt_and_the_output() -> None:
    sc = sc_of(input_dist="uniform:50:150", output_dist="lognormal:mean=40,sigma=0.5,min=8,max=100")
    for src in (IDS_SRC, replace(IDS_SRC, overhead=3), TEXT_SRC):
        maker = RequestMaker(sc, src)
        for s in range(40):
            req = maker.plan(1, PHASE_MEASURE, s, 1000)
            d = draw_request(maker.classes, 0, 1, PHASE_MEASURE, s)
            assert (req.prompt_tokens, req.max_tokens) == (d.input_tokens, d.output_tokens)
            units = len(req.prompt) if isinstance(req.prompt, list) else len(req.prompt.split())
            assert units == d.input_tokens - src.overhead and 8 <= req.max_tokens <= 100


def test_warmup_output_tokens_keep_the_grants_length_and_a_dataset_may_draw_outputs() -> None:
    sc = sc_of(output_dist="uniform:5:9", warmup_output_tokens=3, warmup_requests=1)
    maker = RequestMaker(sc, IDS_SRC)
    assert maker.plan(0, PHASE_WARMUP, 0, 3).max_tokens == 3
    assert 5 <= maker.plan(0, PHASE_MEASURE, 0, 1000).max_tokens <= 9
    item = Item("some text", 12, 77)
    sc = sc_of(dataset="x.jsonl")
    assert RequestMaker(sc, replace(IDS_SRC, overhead=2)).plan(0, PHASE_MEASURE, 0, 77, item).max_tokens == 77
    req = RequestMaker(sc_of(dataset="x.jsonl", output_dist="uniform:5:9"), IDS_SRC).plan(
        0, PHASE_MEASURE, 0, 77, item
    )
    assert req.prompt == "some text" and req.prompt_tokens == 12 and 5 <= req.max_tokens <= 9


# conversations ---------------------------------------------------------------------------------------


def test_a_token_id_conversation_resends_prompt_answer_and_a_new_message() -> None:
    sc = sc_of(input_tokens=30, output_tokens=8, turns=3)
    asked: list[str] = []
    maker = RequestMaker(
        sc, replace(IDS_SRC, overhead=1), tokenize=lambda t: asked.append(t) or [5] * len(t.split())
    )
    first = maker.plan(2, PHASE_MEASURE, 4, 8)
    assert (first.turn, first.conversation, first.prompt_tokens) == (0, "2:4", 30) and first.wants_answer
    assert len(first.prompt) == 29  # the server adds one (BOS)
    conv = maker.after(first, record(8), [" tok"] * 8)
    assert asked == [" tok" * 8] and conv is not None and conv.turn == 1
    second = maker.plan(2, PHASE_MEASURE, 9, 8, conv=conv)  # the user's next ticket, whatever its seq
    assert (second.turn, second.conversation) == (1, "2:4")
    assert second.prompt[:29] == first.prompt and second.prompt[29:37] == [5] * 8
    assert len(second.prompt) == 29 + 8 + 30 and second.prompt_tokens == 30 + 8 + 30
    conv = maker.after(second, record(8), [" tok"] * 8)
    third = maker.plan(2, PHASE_MEASURE, 11, 8, conv=conv)
    assert third.turn == 2 and third.prompt_tokens == 68 + 8 + 30 and third.prompt[:67] == second.prompt
    assert not third.wants_answer and maker.after(third, record(8), None) is None  # the last turn
    fresh = maker.plan(2, PHASE_MEASURE, 12, 8, conv=None)
    assert (fresh.turn, fresh.conversation) == (0, "2:12")


def test_a_chat_conversation_is_a_list_of_messages() -> None:
    maker = RequestMaker(sc_of(input_tokens=20, output_tokens=4, turns=2), replace(TEXT_SRC, overhead=3))
    first = maker.plan(0, PHASE_MEASURE, 0, 4)
    assert [m["role"] for m in first.prompt] == ["user"] and len(first.prompt[0]["content"].split()) == 17
    conv = maker.after(first, record(4), [" tok", " tok", " tok", " tok"])
    second = maker.plan(0, PHASE_MEASURE, 1, 4, conv=conv)
    assert [m["role"] for m in second.prompt] == ["user", "assistant", "user"]
    assert (
        second.prompt[1]["content"] == " tok tok tok tok" and len(second.prompt[2]["content"].split()) == 20
    )
    assert second.prompt_tokens == 20 + 4 + 20


def test_a_failed_turn_a_new_level_or_phase_ends_the_conversation() -> None:
    maker = RequestMaker(sc_of(input_tokens=20, output_tokens=4, turns=3), IDS_SRC, tokenize=lambda t: [1])
    first = maker.plan(0, PHASE_MEASURE, 0, 4)
    assert maker.after(first, record(4, FAILED), []) is None
    conv = maker.after(first, record(4), ["x"])
    assert maker.plan(1, PHASE_MEASURE, 0, 4, conv=conv).turn == 0  # the next level starts afresh
    conv = maker.after(first, record(4), ["x"])
    assert maker.plan(0, PHASE_WARMUP, 0, 4, conv=conv).turn == 0


def test_without_a_tokenizer_pool_ids_of_the_answers_length_stand_in(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(text: str) -> list[int]:
        raise RuntimeError("no /tokenize here")

    maker = RequestMaker(sc_of(input_tokens=20, output_tokens=6, turns=3), IDS_SRC, tokenize=broken)
    first = maker.plan(0, PHASE_MEASURE, 0, 6)
    conv = maker.after(first, record(6), ["answer"])
    second = maker.plan(0, PHASE_MEASURE, 1, 6, conv=conv)
    assert len(second.prompt) == 20 + 6 + 20 and all(1000 <= i < 30000 for i in second.prompt[20:26])
    maker.after(second, record(6), ["again"])
    assert caplog.text.count("cannot tokenize") == 1  # said once


def test_classes_keep_their_own_turns_and_prefixes() -> None:
    sc = scenario_from_dict(
        {
            "classes": [
                {"name": "chat", "weight": 1, "turns": 3, "input_tokens": 40, "shared_prefix_tokens": 16},
                {"name": "one-shot", "weight": 1, "input_tokens": 60},
            ]
        }
    )
    maker = RequestMaker(sc, IDS_SRC, tokenize=lambda t: [7])
    reqs = [maker.plan(0, PHASE_MEASURE, s, 5) for s in range(40)]
    chat = [r for r in reqs if r.request_class == "chat"]
    one = [r for r in reqs if r.request_class == "one-shot"]
    assert chat and one and all(r.wants_answer and r.prefix_group == 0 for r in chat)
    assert all(not r.wants_answer and r.turn == 0 and r.prefix_group is None for r in one)
    assert len({tuple(r.prompt[:16]) for r in chat}) == 1
    # A class's prefix is its own, not the plain scenario's.
    assert chat[0].prompt[:16] != make_prompt(IDS_SRC, 0, 0, 40, 16)[:16]


# the scenario fields ---------------------------------------------------------------------------------


def test_class_table_in_a_scenario_file(tmp_path: Path) -> None:
    p = tmp_path / "mix.toml"
    p.write_text(
        'name = "mix"\ninput_tokens = 300\n'
        '[[classes]]\nname = "chat"\nweight = 70\ninput_dist = "uniform:100:400"\noutput_tokens = 150\n'
        '[[classes]]\nname = "summarise"\nweight = 30\ninput_tokens = 3000\noutput_dist = "normal:mean=400,sd=50"\n'
    )
    sc = load_scenario(str(p))
    assert sc.classes == [
        {"name": "chat", "weight": 70.0, "input_dist": "uniform:100:400", "output_tokens": 150},
        {"name": "summarise", "weight": 30.0, "input_tokens": 3000, "output_dist": "normal:mean=400,sd=50"},
    ]
    chat, summ = request_classes(sc)
    assert (chat.input_dist.text, chat.output_tokens, chat.input_tokens) == ("uniform:100:400", 150, 300)
    assert (summ.input_tokens, summ.output_dist.kind, summ.output_tokens) == (3000, "normal", 1000)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"input_dist": "uniform:5"}, "field 'input_dist': expected uniform:MIN:MAX"),
        ({"output_dist": "gamma:3"}, "field 'output_dist': expected one of"),
        ({"input_dist": "dataset"}, "field 'input_dist': 'dataset' means the dataset's own lengths"),
        ({"prefix_groups": 3}, "field 'prefix_groups': groups of a shared prefix need"),
        ({"prefix_groups": 0}, "field 'prefix_groups': expected an integer >= 1"),
        ({"turns": 0}, "field 'turns': expected an integer >= 1"),
        (
            {"shared_prefix_tokens": 100, "input_dist": "uniform:50:500"},
            "field 'shared_prefix_tokens': expected fewer than the shortest prompt input_dist can give (50)",
        ),
        (
            {"shared_prefix_tokens": 100, "input_dist": "normal:mean=500,sd=10"},
            "shortest prompt input_dist can give (1)",
        ),
        ({"dataset": "x.jsonl", "input_dist": "uniform:5:9"}, "field 'input_dist': a dataset's prompts keep"),
        ({"dataset": "x.jsonl", "turns": 2}, "field 'turns': not with --dataset"),
        ({"classes": {"name": "x"}}, "field 'classes': expected a list of tables"),
        (
            {"classes": [{"name": "a", "weight": 1, "colour": "red"}]},
            "field 'classes[0]': unknown key(s) colour",
        ),
        ({"classes": [{"name": "a", "weight": 1}, {"name": "a", "weight": 2}]}, "field 'classes[1].name'"),
        ({"classes": [{"name": "a", "weight": 0}]}, "field 'classes[0].weight': expected a number > 0"),
        (
            {"classes": [{"name": "a", "weight": 1, "input_dist": "uniform:9:1"}]},
            "field 'classes[0].input_dist'",
        ),
        (
            {"classes": [{"name": "a", "weight": 1, "shared_prefix_tokens": 50, "input_tokens": 50}]},
            "field 'classes[0].shared_prefix_tokens': expected fewer than input_tokens (50)",
        ),
        (
            {"classes": [{"name": "a", "weight": 1}], "dataset": "x.jsonl"},
            "field 'classes': not with --dataset",
        ),
    ],
)
def test_bad_mixes_are_refused_naming_the_field(data: dict[str, object], says: str) -> None:
    with pytest.raises(ScenarioError, match=r"^f\.toml: " + _escape(says)):
        scenario_from_dict(data, source="f.toml")


def _escape(text: str) -> str:
    import re

    return ".*" + re.escape(text)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--input-dist", "uniform:9:1"), "flag --input-dist: field 'input_dist': expected 1 <= MIN <= MAX"),
        (("--output-dist", "lognormal:mean=300"), "field 'output_dist': lognormal needs sigma="),
        (("--prefix-groups", "4"), "field 'prefix_groups'"),
        (("--turns", "0"), "field 'turns': expected an integer >= 1"),
    ],
)
def test_bad_mix_flags_exit_2_naming_the_field(tmp_path: Path, flags: tuple[str, ...], named: str) -> None:
    from specload.cli import main
    from tests.test_cli import _main_err

    code, err = _main_err(
        main, ["sweep", "--host", "http://127.0.0.1:1", "--out", str(tmp_path / "o"), *flags]
    )
    assert code == 2 and named in err, err
    assert not (tmp_path / "o").exists()


def test_the_built_in_chat_mix_scenario() -> None:
    sc = load_scenario("chat-mix")
    chat, summ = request_classes(sc)
    assert (chat.name, chat.turns, chat.prefix_groups) == ("chat", 3, 4)
    assert (summ.name, summ.turns) == ("summarise", 1)
    assert chat.input_dist.minimum(0) > chat.shared_prefix_tokens


def test_flags_checked_one_by_one_see_the_distribution_before_the_prefix() -> None:
    from specload.cli import settings
    from tests.test_cli import sweep_args

    s = settings(
        sweep_args("--input-tokens", "100", "--input-dist", "uniform:400:800", "--shared-prefix", "300")
    )
    assert s.scenario().shared_prefix_tokens == 300


def test_conversations_are_refused_at_rate_levels() -> None:
    with pytest.raises(ScenarioError, match="field 'turns': conversations .* need concurrency levels"):
        scenario_from_dict({"rates": [2.0], "turns": 3}, "f.toml")
    with pytest.raises(ScenarioError, match="field 'classes': conversations"):
        scenario_from_dict({"rates": [2.0], "classes": [{"name": "a", "weight": 1, "turns": 2}]}, "f.toml")
    assert scenario_from_dict({"rates": [2.0], "input_dist": "uniform:5:9"}).rates == [2.0]
