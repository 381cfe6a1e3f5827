"""A multi-turn dataset row (SPEED-Bench's ``turns``) is sent as one conversation: each later turn
resends the history with the answer the server actually returned, then the row's next user turn."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec

from specload.core.records import FAILED, OK, PHASE_MEASURE
from specload.sim.process import SimProcess
from specload.workload.datasets import Item, jsonl_pairs, sample
from specload.workload.request import RequestMaker
from tests.fixtures.sim_sweep import Words, sim_sweep
from tests.test_categories import FIXTURE
from tests.test_workload import IDS_SRC, TEXT_SRC, record, sc_of

ROW = Item("first question", 2, 16, "coding", ("second question here", "third"), (3, 1))


def test_multi_turn_rows_keep_their_later_turns_counted() -> None:
    items = sample(jsonl_pairs(FIXTURE), 100, 0, Words(), None, default_output=32)
    multi = [i for i in items if i.turns]
    assert len(multi) == 3 and all(len(i.turns) == 1 and i.turn_tokens == (7,) for i in multi)
    assert all(msgspec.convert(msgspec.msgpack.decode(msgspec.msgpack.encode(i)), Item) == i for i in items)
    cut = sample(jsonl_pairs(FIXTURE), 100, 0, Words(), None, fixed_input=10, default_output=32)
    assert cut and not any(i.turns for i in cut)  # a prompt cut to a length is one request of it


def test_each_later_turn_resends_the_history_with_the_servers_answer() -> None:
    for src in (IDS_SRC, TEXT_SRC):  # whatever the synthetic prompts' kind: chat messages
        maker = RequestMaker(sc_of(dataset="x.jsonl"), src)
        other = Item("another row", 2, 16, "math")
        first = maker.plan(0, PHASE_MEASURE, 0, 16, ROW)
        assert first.prompt == [{"role": "user", "content": "first question"}]
        assert (first.turn, first.category, first.wants_answer) == (0, "coding", True)
        conv = maker.after(first, record(5), ["the ", "answer"])
        assert conv is not None
        second = maker.plan(0, PHASE_MEASURE, 1, 16, other, conv)  # the ticket's own row is not sent
        assert second.prompt == [
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "the answer"},
            {"role": "user", "content": "second question here"},
        ]
        assert (second.turn, second.conversation, second.category) == (1, first.conversation, "coding")
        assert (
            second.prompt_tokens == 2 + 5 + 3
        )  # the first prompt, the server's count of the answer, the turn
        conv = maker.after(second, record(4), ["again"])
        third = maker.plan(0, PHASE_MEASURE, 2, 16, other, conv)
        assert third.prompt[-2:] == [
            {"role": "assistant", "content": "again"},
            {"role": "user", "content": "third"},
        ]
        assert third.turn == 2 and not third.wants_answer and third.prompt_tokens == 10 + 4 + 1
        assert maker.after(third, record(3), None) is None  # the row's last turn: the conversation ends
        assert maker.plan(0, PHASE_MEASURE, 3, 16, other).prompt == "another row"


def test_a_failed_turn_or_a_new_level_ends_the_conversation() -> None:
    maker = RequestMaker(sc_of(dataset="x.jsonl"), TEXT_SRC)
    first = maker.plan(0, PHASE_MEASURE, 0, 16, ROW)
    assert maker.after(first, record(5, FAILED), []) is None
    conv = maker.after(first, record(5), ["a"])
    nxt = maker.plan(1, PHASE_MEASURE, 0, 16, Item("row of level 1", 4, 16), conv)
    assert nxt.prompt == "row of level 1" and nxt.turn is None


def test_a_sweep_sends_every_turn(sim: Callable[..., SimProcess], tmp_path: Path) -> None:
    s = sim("--ttft-ms", "2", "--itl-ms", "1")
    args = ["--backend", "chat", "--dataset", str(FIXTURE), "--output-tokens", "12", "--levels", "1"]
    args += ["--requests-per-level", "24", "--warmup-requests", "0", "--metrics-interval", "0"]
    recs = sim_sweep(s.url, tmp_path / "out", *args).records()
    convs: dict[str, list] = {}
    for r in recs:
        if r.conversation is not None:
            convs.setdefault(r.conversation, []).append(r)
    assert convs, "no multi-turn row was sent as a conversation"
    for turns in convs.values():
        turns.sort(key=lambda r: r.turn)
        assert [r.turn for r in turns] in ([0], [0, 1])  # the last ticket may end before its second turn
        assert len({r.category for r in turns}) == 1
        if len(turns) == 2:
            a, b = turns
            assert a.status == OK and b.status == OK
            # the server counted the history it was sent: the first prompt, its answer and the new turn
            assert b.prompt_tokens is not None and a.prompt_tokens is not None
            assert b.prompt_tokens >= a.prompt_tokens + a.output_tokens + 7
            assert b.requested_prompt_tokens == a.requested_prompt_tokens + a.output_tokens + 7
    assert any(len(t) == 2 for t in convs.values())
