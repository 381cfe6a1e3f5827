"""A simulated prefix cache: prompts that start like one seen recently skip that part of their prefill.

Real servers keep the KV of recent prompts (SGLang's radix cache, vLLM's automatic prefix caching)
and compute only what follows the longest cached start of a new prompt. Here a prompt is a list of
*units* (token ids as sent; for text, one unit per whitespace-separated word; for chat, one per
word plus one per message for its role), cut into blocks of ``block`` units, as vLLM's KV blocks:
block i is known by a hash of itself and of every block before it, so a block matches only when the
whole prompt up to its end does. The cache holds ``capacity_tokens // block`` blocks, least recently
used out first. A prompt's blocks go in when its prefill is done (its first token), and its blocks
with the generated answer (as the units the simulator's own /tokenize gives for the text it
returned) when it ends, so a conversation's next turn, which resends prompt and answer, finds both.

A lookup happens when the engine admits the request (SGLang matches the radix tree when it
schedules a request, so one that waits in the queue can use a prefix computed meanwhile). At least
one prompt token is always computed (``cached <= prompt - 1``), as both servers do. The counters are
tokens, as vLLM's ``prefix_cache_queries`` / ``prefix_cache_hits``; ``last_batch_rate`` is SGLang's
``cache_hit_rate`` gauge (the hit share of the last batch of admissions). Pure bookkeeping: no
clock, no gevent.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

DEFAULT_BLOCK = 16  # vLLM's default KV block size


def _chain(units: list[int], block: int, start: int, prev: int, out: list[int]) -> None:
    """Append to ``out`` the hash of every full block of ``units`` from unit ``start`` on, chained
    from ``prev`` (the hash of the block before)."""
    end = len(units) - (len(units) - start) % block
    for i in range(start, end, block):
        prev = hash((prev, tuple(units[i : i + block])))
        out.append(prev)


class PromptKey:
    """One request's prompt as cache units, its block hashes, and what the cache served it."""

    __slots__ = ("units", "hashes", "block", "out_unit", "cached", "prompt_blocks")

    def __init__(self, units: list[int], block: int, out_unit: int) -> None:
        self.units = units
        self.block = block
        self.out_unit = out_unit  # the unit of one generated token (" tok" as the simulator tokenizes it)
        self.hashes: list[int] = []
        _chain(units, block, 0, 0, self.hashes)
        self.prompt_blocks = len(self.hashes)
        self.cached = 0  # prompt tokens the cache served (set at admission)

    def add_output(self, n: int) -> None:
        """Append ``n`` generated tokens (once, when the request ends) and hash the blocks they complete."""
        start = len(self.hashes) * self.block
        self.units = [*self.units, *([self.out_unit] * n)]
        _chain(self.units, self.block, start, self.hashes[-1] if self.hashes else 0, self.hashes)


class PrefixCache:
    """LRU set of block hashes with a capacity in tokens; counts tokens looked up and served."""

    def __init__(self, capacity_tokens: int, block: int = DEFAULT_BLOCK) -> None:
        if block < 1:
            raise ValueError(f"the prefix cache's block must be >= 1 token, got {block}")
        if capacity_tokens < block:
            raise ValueError(
                f"the prefix cache must hold at least one block ({block} tokens), got {capacity_tokens}"
            )
        self.capacity_tokens = capacity_tokens
        self.block = block
        self.capacity_blocks = capacity_tokens // block
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.queries = 0  # prompt tokens looked up (vLLM prefix_cache_queries)
        self.hits = 0  # of them, tokens served from the cache (vLLM prefix_cache_hits)
        self._batch_queries = 0
        self._batch_hits = 0
        self.last_batch_rate = 0.0  # hits / queries of the last batch of admissions (SGLang cache_hit_rate)

    def __len__(self) -> int:
        return len(self._blocks)

    def begin_batch(self) -> None:
        """The engine starts a new batch of admissions (a step's; the fixed engine: one request)."""
        self._batch_queries = self._batch_hits = 0

    def match(self, key: PromptKey, prompt_tokens: int) -> int:
        """Prompt tokens the cache serves ``key`` (whole matching blocks, at most ``prompt_tokens - 1``);
        sets ``key.cached`` and counts the lookup."""
        blocks = self._blocks
        n = 0
        for h in key.hashes[: key.prompt_blocks]:
            if h not in blocks:
                break
            n += 1
        for h in reversed(key.hashes[:n]):  # the prompt's first block ends up the most recently used
            blocks.move_to_end(h)
        cached = max(0, min(n * self.block, prompt_tokens - 1))
        key.cached = cached
        self.queries += prompt_tokens
        self.hits += cached
        self._batch_queries += prompt_tokens
        self._batch_hits += cached
        self.last_batch_rate = self._batch_hits / self._batch_queries if self._batch_queries else 0.0
        return cached

    def insert(self, key: PromptKey) -> None:
        """Keep every block of ``key`` (its prompt, and its answer once added); the least recently
        used blocks go when the cache is full, a prompt's last blocks before its first."""
        blocks = self._blocks
        for h in reversed(key.hashes):
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
        while len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)

    def describe(self) -> dict[str, Any]:
        """For /get_server_info."""
        return {"capacity_tokens": self.capacity_tokens, "block": self.block}


def word_unit(word: str) -> int:
    """A word's unit (in-process: the cache never leaves the simulator)."""
    return hash(word)


_ROLE = {role: hash(("<role>", role)) for role in ("system", "user", "assistant", "tool")}
_OTHER_ROLE = hash(("<role>", "?"))


def text_units(text: str) -> list[int]:
    return [hash(w) for w in text.split()]


def chat_units(messages: Any) -> list[int]:
    """A chat prompt's units: per message its role, then its words; then the assistant's role, the
    generation prompt, which the answer follows (so prompt + answer is how the next turn starts)."""
    out: list[int] = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        out.append(_ROLE.get(m.get("role"), _OTHER_ROLE))  # type: ignore[arg-type]
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(
                p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
        if isinstance(content, str):
            out.extend(hash(w) for w in content.split())
    out.append(_ROLE["assistant"])
    return out
