"""Prompt generation: exact-length prompts from the model's own vocabulary, that no prefix cache can serve.

What a prompt is made of (token ids, or single-token words for the text APIs) is decided once per
run (``specload.prompt_source``) and travels to every process as a ``PromptSource``. Each prompt is
then derived from (seed, request number) alone, so any Locust process can build request k without
coordination and a rerun with the same seed sends the same prompts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from specload.vocab import WORDS, IdPool, word_count_text

IDS, TEXT = "ids", "text"


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
            "kind": self.kind, "origin": self.origin, "overhead_tokens": self.overhead, "exact": self.exact,
            "distinct_ids": None if self.ids is None else self.ids.size,
            "words": None if self.kind != TEXT else len(self.words),
        }  # fmt: skip

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind, "origin": self.origin, "ids": None if self.ids is None else self.ids.to_wire(),
                "words": list(self.words), "overhead": self.overhead, "exact": self.exact}  # fmt: skip

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> PromptSource:
        ids = d.get("ids")
        return cls(d["kind"], d["origin"], None if ids is None else IdPool.from_wire(ids), tuple(d["words"]),
                   int(d["overhead"]), bool(d["exact"]))  # fmt: skip


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


def prompt_ids(seed: int, n: int, length: int, pool: IdPool, shared_prefix: int = 0, prefix: str = "") -> list[int]:
    """``length`` ids from ``pool``; the first ``shared_prefix`` the same for every n of one ``prefix``
    group (to exercise a prefix cache on purpose), the rest distinct per n with overwhelming probability."""
    out: list[int] = []
    if shared_prefix:
        out = pool.draw(random.Random(f"specload-prefix-{seed}{prefix}"), min(shared_prefix, length))
    out.extend(pool.draw(random.Random(f"specload-{seed}-{n}"), length - len(out)))
    return out


def prompt_text(
    seed: int, n: int, length: int, words: tuple[str, ...] = tuple(WORDS), shared_prefix: int = 0, prefix: str = ""
) -> str:
    """``length`` words, each after a space (so each is one token when ``words`` are single tokens)."""
    chosen: list[str] = []
    if shared_prefix:
        rp = random.Random(f"specload-prefix-{seed}{prefix}")
        chosen = [rp.choice(words) for _ in range(min(shared_prefix, length))]
    r = random.Random(f"specload-{seed}-{n}")
    chosen.extend(r.choice(words) for _ in range(length - len(chosen)))
    return word_count_text(chosen)
