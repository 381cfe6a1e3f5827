"""Prompt generation: exact-length prompts from the model's own vocabulary, that no prefix cache can serve.

What a prompt is made of (token ids, or single-token words for the text APIs) is decided once per
run (``specload.workload.prompt_source``) and travels to every process as a ``PromptSource``. Each prompt is
then derived from (seed, request number) alone, so any Locust process can build request k without
coordination and a rerun with the same seed sends the same prompts.

**How a prompt is drawn, and why so.** Drawing every unit of a 1000-token prompt on its own cost the
client ~0.3 ms of CPU per request, most of its per-request cost (``make bench``). So each (material,
seed) has a *tape*: ``TAPE_STARTS + MAX_WINDOW`` units drawn once, uniformly and independently, per
process (the same in every process: it is seeded by the seed alone). Prompt n draws its first
``LEAD`` units afresh from its own generator (seeded by seed and n), then a start on the tape from
the same generator; the rest of its length is the tape's window from that start, past its first
``LEAD`` units. So:

- every unit of a prompt is uniform over the material, and the units within one prompt are
  independent (a window of an independent sequence, never longer than the tape past its start:
  no prompt repeats a stretch of itself);
- two prompts differ from their first unit on as before (the leading units are fresh), so no prefix
  cache (vLLM's hashed blocks, SGLang's radix tree, llama.cpp's slot reuse) can serve one from
  another; their windows may overlap at other positions (``MAX_WINDOW`` of ``TAPE_STARTS`` starts),
  which only a position-independent cache could use;
- a prompt of at most ``LEAD`` units, or longer than ``MAX_WINDOW``, is drawn unit by unit.

A shared prefix (``--shared-prefix``) is the same draw for every prompt of its group, so it is made
once per process and copied.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from specload.workload.config import NATURAL
from specload.workload.vocab import WORDS, IdPool, word_count_text

IDS, TEXT = "ids", "text"
# What the prompts are, as run.json ``prompts.material`` says: random draws make the target accept
# more (or other) drafts than real text does (SPEED-Bench, arXiv 2604.09557), so a report says so.
RANDOM_IDS, RANDOM_WORDS, DATASET = "random token ids", "random words", "dataset"
REAL_TEXT = (
    "real text"  # specload's built-in set (specload.workload.realtext), run.json origin "real text (...)"
)


def material_of(p: Mapping[str, Any]) -> str | None:
    """The material of run.json ``prompts`` (RANDOM_IDS, RANDOM_WORDS, REAL_TEXT or DATASET); None when not
    recorded. A run.json written before ``material`` existed gets it from its kind and origin."""
    m = p.get("material")
    if isinstance(m, str) and m:
        return m
    origin = p.get("origin")
    if not isinstance(origin, str) or not origin:
        return None
    if origin.startswith("dataset"):
        return DATASET
    if origin.startswith(REAL_TEXT):
        return REAL_TEXT
    return RANDOM_IDS if p.get("kind") == IDS else RANDOM_WORDS


def method_label(prompts: Mapping[str, Any], scenario: Mapping[str, Any]) -> str:
    """How a run's prompts were made and how its answers ended, in the report's words (run.json
    ``prompts`` and ``scenario``): acceptance depends on both (docs/metrics.md, "Prompts that flatter
    speculation"), so a report says from which its figures come."""
    m = material_of(prompts)
    what = {
        RANDOM_IDS: "random token ids (the reference method, --prompts random: it flatters speculation, "
        "about 2x the accept length of real text on a real model)",
        RANDOM_WORDS: "random words (--prompts random)",
        REAL_TEXT: "real text (specload's built-in set, --prompts real)",
        DATASET: f"dataset {scenario.get('dataset')}",
    }.get(m or "", "not recorded")
    if scenario.get("output_mode") == NATURAL:  # (a run.json without it: forced)
        ends = "natural, ended by the model (at most the output tokens, --output-mode natural)"
    else:
        ends = "forced to the output length (ignore_eos, --output-mode forced)"
    return f"prompts: {what}; answers: {ends}"


@dataclass(frozen=True)
class PromptSource:
    """What prompts are made of, and how many tokens the server adds around each one.

    ``overhead`` (BOS, a chat template's markers) was measured with a probe request, so a prompt of
    ``input_tokens - overhead`` units makes the server count ``input_tokens``. ``exact`` is False
    when the units are not known to be one token each (no tokenizer could be asked).
    """

    kind: str  # IDS or TEXT
    origin: str  # where the material came from, for run.json and the report
    ids: IdPool | None = None
    words: tuple[str, ...] = tuple(WORDS)
    overhead: int = 0
    exact: bool = True

    def units(self, length: int) -> int:
        """Units (ids or words) to send for a prompt the server should count as ``length`` tokens."""
        return max(1, length - self.overhead)

    def describe(self) -> dict[str, Any]:
        """The summary run.json keeps (not the pool itself)."""
        return {
            "kind": self.kind,
            "origin": self.origin,
            "overhead_tokens": self.overhead,
            "exact": self.exact,
            "distinct_ids": None if self.ids is None else self.ids.size,
            "words": None if self.kind != TEXT else len(self.words),
            "material": material_of({"kind": self.kind, "origin": self.origin}),
        }


def range_source(lo: int, hi: int, origin: str) -> PromptSource:
    return PromptSource(IDS, origin, ids=IdPool(((lo, hi),)), exact=True)


def make_prompt(
    src: PromptSource, seed: int, n: int, length: int, shared_prefix: int = 0, prefix: str = ""
) -> list[int] | str:
    """Prompt number ``n``: ``length`` server-counted tokens, its first ``shared_prefix`` the same for every n
    of the same ``prefix`` (a prefix group's name; "" is the one group of a plain ``--shared-prefix``)."""
    if src.kind == IDS:
        assert src.ids is not None
        return prompt_ids(seed, n, src.units(length), src.ids, shared_prefix, prefix)
    return prompt_text(seed, n, src.units(length), src.words, shared_prefix, prefix)


LEAD = 8  # units drawn afresh at the start of every prompt
TAPE_STARTS = 1 << 16  # where on the tape a prompt's window may start
MAX_WINDOW = 1 << 15  # the longest window; a longer prompt is drawn unit by unit
_MEMO_MAX = 256  # tapes and shared prefixes kept per process (a run uses a handful)

Draw = Callable[[random.Random, int], list[Any]]

_text_memo: dict[tuple[Any, ...], list[str]] = {}


def _memo(store: dict[tuple[Any, ...], Any], key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
    got = store.get(key)
    if got is None:
        if len(store) >= _MEMO_MAX:
            store.clear()
        got = store[key] = make()
    return got


def _units(seed: int, n: int, length: int, draw: Draw, store: dict[tuple[Any, ...], Any]) -> list[Any]:
    """The ``length`` units of prompt ``n`` after any shared prefix: ``LEAD`` fresh ones, then a
    window of the seed's tape at a start drawn by the prompt's own generator (see the module's doc)."""
    rng = random.Random(f"specload-{seed}-{n}")
    if length <= LEAD or length > MAX_WINDOW:
        return draw(rng, length)
    lead = draw(rng, LEAD)
    start = int(rng.random() * TAPE_STARTS)
    tape = _memo(
        store, ("tape", seed), lambda: draw(random.Random(f"specload-tape-{seed}"), TAPE_STARTS + MAX_WINDOW)
    )
    out = tape[start : start + length]  # one copy: the window, its first LEAD units then replaced
    out[:LEAD] = lead
    return out


def _shared(seed: int, prefix: str, k: int, draw: Draw, store: dict[tuple[Any, ...], Any]) -> list[Any]:
    """A copy of the group's ``k``-unit prefix, drawn once per process."""
    return list(
        _memo(
            store,
            ("prefix", seed, prefix, k),
            lambda: draw(random.Random(f"specload-prefix-{seed}{prefix}"), k),
        )
    )


def prime(src: PromptSource, seed: int) -> None:
    """Draw the seed's tape now (~30-80 ms once per process), before any stream is in flight: done
    lazily by the first prompt, it would hold up every stream of the process meanwhile."""
    if src.kind == IDS:
        assert src.ids is not None
        _units(seed, 0, LEAD + 1, src.ids.draw, src.ids.memo)
    else:
        _units(seed, 0, LEAD + 1, _word_draw(src.words), _text_memo_of(src.words))


def prompt_ids(
    seed: int, n: int, length: int, pool: IdPool, shared_prefix: int = 0, prefix: str = ""
) -> list[int]:
    """``length`` ids from ``pool``; the first ``shared_prefix`` the same for every n of one ``prefix``
    group (to exercise a prefix cache on purpose), the rest distinct per n from its first id on."""
    if not shared_prefix:
        return _units(seed, n, length, pool.draw, pool.memo)
    out = _shared(seed, prefix, min(shared_prefix, length), pool.draw, pool.memo)
    out += _units(seed, n, length - len(out), pool.draw, pool.memo)
    return out


def _word_draw(words: tuple[str, ...]) -> Draw:
    return lambda rng, k: [rng.choice(words) for _ in range(k)]


def _text_memo_of(words: tuple[str, ...]) -> dict[tuple[Any, ...], Any]:
    """The memo of one word list (its tapes and prefixes), kept for the last few word lists."""
    return _memo(_text_memo, (words,), dict)


def prompt_text(
    seed: int,
    n: int,
    length: int,
    words: tuple[str, ...] = tuple(WORDS),
    shared_prefix: int = 0,
    prefix: str = "",
) -> str:
    """``length`` words, each after a space (so each is one token when ``words`` are single tokens)."""
    draw, store = _word_draw(words), _text_memo_of(words)
    chosen: list[str] = []
    if shared_prefix:
        chosen = _shared(seed, prefix, min(shared_prefix, length), draw, store)
    chosen += _units(seed, n, length - len(chosen), draw, store)
    return word_count_text(chosen)
