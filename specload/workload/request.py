"""What each request of a sweep is: its class, its lengths, its shared prefix, its place in a conversation.

The scenario describes the traffic (``config``: lengths from a distribution, prefix groups, turns,
weighted ``[[classes]]``); this module turns a ticket into the request to send. Pure, Locust-free:
the user side (``specload.locust.user``) calls ``RequestMaker.plan`` before a request and
``RequestMaker.after`` once its record is made.

**Who draws.** The user, not the owner. Everything drawn for a ticket (class, input and output
length, prefix group) is a pure function of (seed, level, phase, seq) (``draw_request``), so every
Locust process that is handed that ticket draws the same request without a word from the owner, a
rerun with the same seed sends the same lengths, and the owner's per-ticket work and messages (the
master is the first bottleneck at high request rates) stay as they were. The record carries what
was drawn (``requested_prompt_tokens``, ``requested_output_tokens``, ``request_class``,
``prefix_group``), so the report reads it back from ``records.jsonl`` like any other figure.

**Conversations** (``turns`` > 1). A conversation is the requests one Locust user sends back to
back within one level and phase, each turn resending the whole history: the previous prompt, the
answer the server actually returned, and a new user message of the turn's drawn input length
(which, with ``turns``, sizes each new message, not the whole prompt). The class and the prefix
group are drawn at its first turn and kept; each turn's lengths are drawn with its own ticket. Its
id is its first request's (level, phase, seq). Which later tickets a conversation's turns take
depends on the order in which users ask, so only single-turn traffic is the same ticket for
ticket on a rerun. How the history is sent:

- chat (text) backends: the natural form, a ``messages`` list: user, assistant (the answer text as
  streamed), user, ...;
- token-id backends: the previous prompt's ids, then the answer's ids, then the new message's ids.
  A completions stream returns text, not ids, so the answer is tokenized with the server's own
  ``/tokenize`` (what the server itself would make of that text); when the server cannot tokenize,
  pool ids of the answer's length stand in (the length is right, a prefix cache then serves the
  previous prompt but not the answer).

A failed or short turn ends its conversation; the next ticket starts a new one.

A dataset row of several turns (a categorised set's ``turns``, ``datasets.Item.turns``) is a
conversation the same way, as chat messages whatever the prompts' kind (a completions backend sends
them as one text): its later tickets send the row's next user turn after the history, with the
row's category, and the ticket's own row is not sent.
"""

from __future__ import annotations

import bisect
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specload.core.records import OK, PHASE_WARMUP, RequestRecord
from specload.workload.config import CLASS_KEYS, Scenario
from specload.workload.datasets import Item
from specload.workload.lengths import LengthDist, parse_dist
from specload.workload.prompts import IDS, PromptSource, make_prompt, prompt_ids, prompt_text
from specload.workload.traceprompt import block_size_of, salt_of
from specload.workload.traceprompt import trace_prompt as random_trace_prompt
from specload.workload.traces import TraceRequest

logger = logging.getLogger("specload")


@dataclass(frozen=True)
class RequestClass:
    """One kind of request of the mix (the whole scenario when it has no ``[[classes]]``: name None)."""

    name: str | None
    weight: float
    input_tokens: int
    output_tokens: int
    input_dist: LengthDist
    output_dist: LengthDist
    shared_prefix_tokens: int
    prefix_groups: int
    turns: int

    @property
    def trivial(self) -> bool:
        """Nothing to draw: fixed lengths and at most one prefix group."""
        return self.input_dist.fixed and self.output_dist.fixed and self.prefix_groups <= 1

    def prefix_name(self, group: int) -> str:
        """The suffix of a prefix group's seed ("" for the one group of a plain scenario, as before classes)."""
        if self.name is None:
            return f"-{group}" if group else ""
        return f"-{self.name}-{group}"


def request_classes(sc: Scenario) -> tuple[RequestClass, ...]:
    """The scenario's classes, each field the class's own or else the scenario's."""

    def one(name: str | None, weight: float, c: dict[str, Any]) -> RequestClass:
        v = {key: c.get(key, getattr(sc, key)) for key in CLASS_KEYS}
        return RequestClass(
            name,
            weight,
            v["input_tokens"],
            v["output_tokens"],
            parse_dist(v["input_dist"]),
            parse_dist(v["output_dist"]),
            v["shared_prefix_tokens"],
            v["prefix_groups"],
            v["turns"],
        )

    if not sc.classes:
        return (one(None, 1.0, {}),)
    return tuple(one(c["name"], float(c["weight"]), c) for c in sc.classes)


@dataclass(frozen=True, slots=True)
class Draw:
    """What was drawn for one ticket."""

    cls: RequestClass
    input_tokens: int
    output_tokens: int
    prefix_group: int


_UNIFORMS = (
    6  # class, input (2), output (2), prefix group: always all drawn, so each is independent of the others
)


def uniforms(seed: int, level: int, phase: str, seq: int) -> list[float]:
    """The ticket's uniforms in [0, 1): a pure function of (seed, level, phase, seq) (``random.Random``
    seeds a string through SHA-512, the same in every process and Python version)."""
    rng = random.Random(f"specload-draw-{seed}-{level}-{phase}-{seq}")
    return [rng.random() for _ in range(_UNIFORMS)]


def pick_class(classes: tuple[RequestClass, ...], u: float) -> RequestClass:
    """The class that ``u`` (uniform in [0, 1)) falls in, each taking its share of the total weight."""
    if len(classes) == 1:
        return classes[0]
    edges, total = [], 0.0
    for c in classes:
        total += c.weight
        edges.append(total)
    return classes[min(len(classes) - 1, bisect.bisect_right(edges, u * total))]


def draw_request(
    classes: tuple[RequestClass, ...],
    seed: int,
    level: int,
    phase: str,
    seq: int,
    cls: RequestClass | None = None,
) -> Draw:
    """The class, lengths and prefix group of ticket (level, phase, seq); ``cls`` keeps a class
    already chosen (a conversation's later turns)."""
    if cls is None and len(classes) == 1 and classes[0].trivial:
        c = classes[0]
        return Draw(c, c.input_tokens, c.output_tokens, 0)  # the plain scenario: nothing to draw
    u = uniforms(seed, level, phase, seq)
    c = cls or pick_class(classes, u[0])
    group = min(c.prefix_groups - 1, int(u[5] * c.prefix_groups)) if c.prefix_groups > 1 else 0
    return Draw(
        c,
        c.input_dist.draw(u[1], u[2], c.input_tokens),
        c.output_dist.draw(u[3], u[4], c.output_tokens),
        group,
    )


def prompt_number(level: int, phase: str, seq: int) -> int:
    """The prompt's number n (prompts.make_prompt): unique per (level, phase, seq)."""
    return level * 1_000_000 + (500_000 if phase == PHASE_WARMUP else 0) + seq


@dataclass
class Conversation:
    """One user's conversation so far: what its next turn resends."""

    id: str
    cls: RequestClass
    level: int
    phase: str
    prefix_group: int
    turn: int = 0  # the index of the turn to send next
    history: Any = None  # the last prompt plus its answer: ids, or chat messages
    history_tokens: int = (
        0  # its length in prompt tokens (the server's count of the last prompt + the answer)
    )
    texts: tuple[str, ...] = ()  # a dataset row's later user turns (datasets.Item.turns)
    text_tokens: tuple[int, ...] = ()
    category: str | None = None  # the dataset row's category, every turn's

    @property
    def turns(self) -> int:
        """How many turns it has: the dataset row's, else its class's."""
        return len(self.texts) + 1 if self.texts else self.cls.turns


@dataclass(slots=True)
class Planned:
    """One request, ready to send: its prompt, its lengths and its labels for the record."""

    prompt: Any
    prompt_tokens: int  # requested_prompt_tokens
    max_tokens: int
    request_class: str | None
    turn: int | None
    conversation: str | None
    prefix_group: int | None
    conv: Conversation | None = None  # the conversation it is a turn of
    category: str | None = None  # a categorised dataset's row category (datasets.Item.category)
    trace_index: int | None = None  # a replayed trace's row (specload.workload.replay)

    @property
    def wants_answer(self) -> bool:
        """Whether the answer's text is needed (a next turn resends it)."""
        return self.conv is not None and self.conv.turn + 1 < self.conv.turns


Tokenize = Callable[[str], list[int]]


class RequestMaker:
    """Per Locust process and run: turns tickets into requests (``plan``) and keeps conversations going
    (``after``). ``tokenize``: the server's tokenizer for a token-id conversation's answers (None: none)."""

    def __init__(self, sc: Scenario, prompts: PromptSource, tokenize: Tokenize | None = None) -> None:
        self.sc = sc
        self.prompts = prompts
        self.classes = request_classes(sc)
        self.multi_turn = any(c.turns > 1 for c in self.classes)
        self.tokenize = tokenize
        self._tokenize_failed = False
        self.block_size = block_size_of(sc)

    def plan(
        self,
        level: int,
        phase: str,
        seq: int,
        max_tokens: int,
        item: Item | None = None,
        conv: Conversation | None = None,
        trace: TraceRequest | None = None,
        trace_prompt: list[int] | None = None,
    ) -> Planned:
        """The request for ticket (level, phase, seq); ``max_tokens`` is the grant's (the owner's word
        for warmups with their own length and for a dataset's outputs), ``conv`` the user's conversation."""
        sc = self.sc
        warm = phase == PHASE_WARMUP
        keep_grant_output = warm and sc.warmup_output_tokens is not None
        if trace is not None:  # a replayed trace's request: its own lengths and prefix blocks
            tprompt = (
                trace_prompt
                if trace_prompt is not None
                else random_trace_prompt(self.prompts, sc.seed, trace, self.block_size, salt_of(sc, level))
            )
            return Planned(
                tprompt,
                trace.input_tokens,
                trace.output_tokens,
                None,
                None,
                None,
                None,
                trace_index=trace.index,
            )
        if item is not None:  # a dataset's prompt (no classes, turns or groups with a dataset)
            return self._from_dataset(level, phase, seq, max_tokens, item, conv, keep_grant_output)
        n = prompt_number(level, phase, seq)
        if conv is not None and (conv.level != level or conv.phase != phase or conv.turn >= conv.turns):
            conv = None
        if conv is not None and conv.turn > 0:
            d = draw_request(self.classes, sc.seed, level, phase, seq, cls=conv.cls)
            prompt, tokens = self._next_turn(conv, n, d.input_tokens)
            out = max_tokens if keep_grant_output else d.output_tokens
            return Planned(
                prompt,
                tokens,
                out,
                conv.cls.name,
                conv.turn,
                conv.id,
                conv.prefix_group if conv.cls.shared_prefix_tokens else None,
                conv,
            )
        d = draw_request(self.classes, sc.seed, level, phase, seq)
        c = d.cls
        prompt = make_prompt(
            self.prompts, sc.seed, n, d.input_tokens, c.shared_prefix_tokens, c.prefix_name(d.prefix_group)
        )
        out = max_tokens if keep_grant_output else d.output_tokens
        group = d.prefix_group if c.shared_prefix_tokens else None
        if not self.multi_turn:
            return Planned(prompt, d.input_tokens, out, c.name, None, None, group)
        conv = Conversation(f"{level}:{'w' if warm else ''}{seq}", c, level, phase, d.prefix_group)
        if self.prompts.kind != IDS:
            prompt = [{"role": "user", "content": prompt}]
        return Planned(prompt, d.input_tokens, out, c.name, 0, conv.id, group, conv)

    def _from_dataset(
        self,
        level: int,
        phase: str,
        seq: int,
        max_tokens: int,
        item: Item,
        conv: Conversation | None,
        keep: bool,
    ) -> Planned:
        """A dataset's row: the next turn of the user's conversation after its history, else the row
        itself, a new conversation when it has later turns. Every turn asks for the ticket's output length."""
        c = self.classes[0]
        out = max_tokens
        if not keep and not c.output_dist.fixed:
            out = draw_request(self.classes, self.sc.seed, level, phase, seq).output_tokens
        if (
            conv is not None
            and conv.texts
            and conv.level == level
            and conv.phase == phase
            and 0 < conv.turn < conv.turns
        ):
            k = conv.turn
            message = {"role": "user", "content": conv.texts[k - 1]}
            tokens = conv.history_tokens + conv.text_tokens[k - 1]
            return Planned([*conv.history, message], tokens, out, None, k, conv.id, None, conv, conv.category)
        if not item.turns:
            return Planned(
                item.prompt,
                item.prompt_tokens + self.prompts.overhead,
                out,
                None,
                None,
                None,
                None,
                category=item.category,
            )
        warm = "w" if phase == PHASE_WARMUP else ""
        conv = Conversation(
            f"{level}:{warm}{seq}",
            c,
            level,
            phase,
            0,
            texts=item.turns,
            text_tokens=item.turn_tokens,
            category=item.category,
        )
        prompt = item.prompt if isinstance(item.prompt, list) else [{"role": "user", "content": item.prompt}]
        return Planned(
            prompt,
            item.prompt_tokens + self.prompts.overhead,
            out,
            None,
            0,
            conv.id,
            None,
            conv,
            item.category,
        )

    def _next_turn(self, conv: Conversation, n: int, new_tokens: int) -> tuple[Any, int]:
        """Turn k > 0: the history, then a new user message of ``new_tokens`` tokens (no overhead:
        the server adds that once per prompt, and the first turn's length already holds it)."""
        src, seed = self.prompts, self.sc.seed
        if src.kind == IDS:
            assert src.ids is not None
            return [
                *conv.history,
                *prompt_ids(seed, n, new_tokens, src.ids),
            ], conv.history_tokens + new_tokens
        message = {"role": "user", "content": prompt_text(seed, n, new_tokens, src.words)}
        return [*conv.history, message], conv.history_tokens + new_tokens

    def after(self, planned: Planned, rec: RequestRecord, text: list[str] | None) -> Conversation | None:
        """The conversation to continue with the user's next ticket, or None (single-turn, ended, or
        a turn that failed: its history is not what a real client would resend)."""
        conv = planned.conv
        if conv is None or not planned.wants_answer or rec.status != OK:
            return None
        answer = "".join(text or ())
        if self.prompts.kind == IDS and not conv.texts:  # (a dataset row's conversation is chat messages)
            ids = self._answer_ids(answer, rec.output_tokens, conv, planned)
            conv.history = [*planned.prompt, *ids]
            conv.history_tokens = planned.prompt_tokens + len(ids)
        else:
            # A reasoning model's reasoning is not resent (the answer text is), so it is not history.
            conv.history = [*planned.prompt, {"role": "assistant", "content": answer}]
            conv.history_tokens = planned.prompt_tokens + rec.output_tokens - (rec.reasoning_tokens or 0)
        conv.turn += 1
        return conv

    def _answer_ids(self, answer: str, n: int, conv: Conversation, planned: Planned) -> list[int]:
        """The answer as token ids: the server's tokenization of the text it returned; pool ids of
        its length when the server cannot tokenize (said once per process)."""
        if self.tokenize is not None and not self._tokenize_failed and answer:
            try:
                return self.tokenize(answer)
            except Exception as e:  # noqa: BLE001 - any failure: fall back, the conversation goes on
                self._tokenize_failed = True
                logger.warning(
                    "multi-turn: the server cannot tokenize its answers (%s); the history resends "
                    "pool ids of each answer's length instead",
                    e,
                )
        assert self.prompts.ids is not None
        rng = random.Random(f"specload-answer-{self.sc.seed}-{conv.id}-{planned.turn}")
        return self.prompts.ids.draw(rng, n)
