"""The model's vocabulary as a load generator needs it: token ids a prompt may use, words that are
exactly one token, and the tokens a server adds around every prompt.

Random ids from a fixed range (the reference method's [1000, 30000)) break on a model whose
vocabulary is smaller, and can hit special tokens on a bigger one; word prompts land far from the
length asked for once a chat template wraps them. So the prompt's material is taken from the
model's own tokenizer: a local one (``--tokenizer``) or the server's ``/tokenize`` endpoint (vLLM,
SGLang and llama.cpp all have it). Ids come from tokenizing ordinary text (never special or added
tokens); words are kept only when they are one token with a leading space, so a prompt of N such
words is N tokens (word boundaries are never merged by BPE or SentencePiece pre-tokenizers).
"""

from __future__ import annotations

import bisect
import functools
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from specload.client.probe import ServerUnreachable, post_json


class VocabError(RuntimeError):
    """The vocabulary could not be learned this way; the message says why."""


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without any special token (no BOS)."""
        ...


class LocalTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer: a tokenizer.json, a folder holding one, or a hub name."""

    def __init__(self, name_or_path: str) -> None:
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError:
            raise VocabError(
                "--tokenizer needs the 'tokenizers' package: pip install 'specload[tokenizer]'"
            ) from None
        path = Path(name_or_path)
        if path.is_dir():
            path = path / "tokenizer.json"
        try:
            self.tok = (
                HFTokenizer.from_file(str(path))
                if path.is_file()
                else HFTokenizer.from_pretrained(name_or_path)
            )
        except Exception as e:  # noqa: BLE001 - the library raises several kinds
            raise VocabError(f"cannot load tokenizer {name_or_path!r}: {e}") from None
        self.name = name_or_path

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False).ids)

    def id_pool(self) -> IdPool:
        """Every id of the base vocabulary; added tokens (special, chat markers) are left out."""
        added = set(self.tok.get_added_tokens_decoder())
        size = self.tok.get_vocab_size(with_added_tokens=True)
        return IdPool.from_ids(i for i in range(size) if i not in added)


class ServerTokenizer:
    """The server's own ``POST /tokenize`` (one body that llama.cpp, vLLM and SGLang all accept)."""

    def __init__(
        self,
        host: str,
        model: str | None,
        timeout: float = 10.0,
        insecure: bool = False,
        send_key: bool = True,
    ) -> None:
        self.host, self.model, self.timeout, self.insecure = host, model, timeout, insecure
        self.send_key = send_key
        self.name = f"{host}/tokenize"

    def encode(self, text: str) -> list[int]:
        body = {"content": text, "prompt": text, "add_special": False, "add_special_tokens": False}
        if self.model:
            body["model"] = self.model
        try:
            status, reply = post_json(
                self.host, "/tokenize", body, self.timeout, self.insecure, self.send_key
            )
        except ServerUnreachable as e:
            raise VocabError(str(e)) from None
        tokens = reply.get("tokens") if status == 200 and isinstance(reply, dict) else None
        if not isinstance(tokens, list):
            raise VocabError(f"/tokenize answered HTTP {status}: {str(reply)[:200]}")
        # llama.cpp's with_pieces form is [{"id": 1, "piece": "a"}, ...].
        ids = [t["id"] if isinstance(t, dict) else t for t in tokens]
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise VocabError(f"/tokenize gave non-integer tokens: {str(tokens)[:200]}")
        return ids


_FLAT_MAX = 4_000_000  # pools up to this many ids are kept as a list for O(1) draws (~32 MB at most)


@dataclass(frozen=True)
class IdPool:
    """Token ids a prompt may use, as sorted half-open ranges (a whole vocabulary stays small)."""

    ranges: tuple[tuple[int, int], ...]

    @classmethod
    def from_ids(cls, ids: Any) -> IdPool:
        out: list[list[int]] = []
        for i in sorted(set(ids)):
            if out and out[-1][1] == i:
                out[-1][1] = i + 1
            else:
                out.append([i, i + 1])
        return cls(tuple((a, b) for a, b in out))

    @property
    def size(self) -> int:
        return sum(b - a for a, b in self.ranges)

    @functools.cached_property
    def _table(self) -> tuple[list[int], list[int], int]:
        """(range starts, ids before each range, pool size): made once per pool, not per prompt
        (rebuilding it for ~2000 ranges cost ~260 us of client CPU on every request)."""
        starts, cum = [], []
        total = 0
        for a, b in self.ranges:
            starts.append(a)
            cum.append(total)
            total += b - a
        return starts, cum, total

    @functools.cached_property
    def _flat(self) -> list[int] | None:
        """Every id of the pool in order, plus the last once more (``int(random() * size)`` may
        round up to ``size`` with odds of about 2^-53); None for a pool too big to list."""
        if self.size > _FLAT_MAX:
            return None
        out: list[int] = []
        for a, b in self.ranges:
            out.extend(range(a, b))
        out.append(out[-1])
        return out

    @functools.cached_property
    def memo(self) -> dict[tuple[Any, ...], Any]:
        """Per-pool, per-process store of what prompts reuse (``specload.workload.prompts``: tapes, prefixes)."""
        return {}

    def draw(self, rng: random.Random, n: int) -> list[int]:
        """``n`` ids uniformly from the pool, in bulk: a 1000-id prompt costs the client ~0.15 ms of
        CPU instead of ~1.2 ms one ``randrange`` at a time (make bench: per-request cost)."""
        flat = self._flat
        if flat is None or n <= 0:
            one = self.sampler(rng)
            return [one() for _ in range(n)]
        rand, size = rng.random, len(flat) - 1
        return [flat[int(rand() * size)] for _ in range(n)]

    def sampler(self, rng: random.Random) -> Any:
        """A function of no arguments that draws one id uniformly from the pool."""
        if len(self.ranges) == 1:
            lo, hi = self.ranges[0]
            return lambda: rng.randrange(lo, hi)
        starts, cum, total = self._table
        pick = bisect.bisect_right

        def draw() -> int:
            k = rng.randrange(total)
            j = pick(cum, k) - 1
            return starts[j] + (k - cum[j])

        return draw


# Short, common English words: one token each with a leading space in the usual BPE vocabularies.
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "it",
    "you",
    "that",
    "he",
    "was",
    "for",
    "on",
    "are",
    "as",
    "with",
    "his",
    "they",
    "at",
    "be",
    "this",
    "have",
    "from",
    "or",
    "one",
    "had",
    "by",
    "word",
    "but",
    "not",
    "what",
    "all",
    "were",
    "we",
    "when",
    "your",
    "can",
    "said",
    "there",
    "use",
    "an",
    "each",
    "which",
    "she",
    "do",
    "how",
    "their",
    "if",
    "will",
    "up",
    "other",
    "about",
    "out",
    "many",
    "then",
    "them",
    "these",
    "so",
    "some",
    "her",
    "would",
    "make",
    "like",
    "him",
    "into",
    "time",
    "has",
    "look",
    "two",
    "more",
    "write",
    "go",
    "see",
    "number",
    "no",
    "way",
    "could",
    "people",
    "my",
    "than",
    "first",
    "water",
    "been",
    "call",
    "who",
    "oil",
    "its",
    "now",
    "find",
    "long",
    "down",
    "day",
    "did",
    "get",
    "come",
    "made",
    "may",
    "part",
]

MIN_WORDS = 16  # fewer single-token words than this: the vocabulary is not word-like; fall back


def corpus(seed: str = "specload-vocab", n: int = 3000) -> str:
    """Ordinary text whose tokens cover much of a vocabulary: common words, made-up words, numbers
    and punctuation (tokenizing it can never yield a special token)."""
    r = random.Random(seed)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    out: list[str] = []
    for _ in range(n):
        k = r.random()
        if k < 0.3:
            w = r.choice(WORDS)
        elif k < 0.9:
            w = "".join(r.choice(letters[: r.randint(8, 26)]) for _ in range(r.randint(2, 9)))
            if r.random() < 0.15:
                w = w.capitalize()
        else:
            w = str(r.randrange(10 ** r.randint(1, 4)))
        out.append(w + (r.choice(",.;:!?") if r.random() < 0.1 else ""))
    return " ".join(out)


def id_pool_from_text(tok: Tokenizer) -> IdPool:
    ids = tok.encode(corpus())
    if not ids:
        raise VocabError(f"{tok.name} gave no tokens for plain text")
    return IdPool.from_ids(ids)


def single_token_words(tok: Tokenizer, candidates: list[str] = WORDS) -> list[str]:
    """The candidates that are exactly one token after a space, so N of them make N tokens."""
    return [w for w in candidates if len(tok.encode(" " + w)) == 1]


# A server's words for token ids outside its vocabulary. Not a bare "out of range": a refused max_tokens
# or temperature says that too, and the vocabulary is not their cause.
_INVALID = re.compile(r"invalid token|out of vocab|token id|vocab(ulary)? size", re.IGNORECASE)
SERVER_TOKENIZE = "server /tokenize"  # the origin of ids the server's own tokenizer made


def invalid_prompt_hint(reason: str | None, origin: str | None = None) -> str | None:
    """The fixes to name when a server rejected the prompt's token ids, or None for another error.

    ``origin``: where the prompt came from (PromptSource.origin). Ids from the server's own /tokenize
    are in its vocabulary, and a text prompt has no ids: the hint would send the user the wrong way."""
    if not reason or "HTTP 4" not in reason or not _INVALID.search(reason):
        return None
    if origin is not None and (origin == SERVER_TOKENIZE or "words" in origin):
        return None
    if origin == "--token-id-range":
        return (
            "the --token-id-range given is not within this model's vocabulary: narrow it, or pass "
            "--tokenizer NAME_OR_PATH (the model's tokenizer), or use --backend chat"
        )
    return (
        "the prompt's token ids are not in this model's vocabulary: pass --tokenizer NAME_OR_PATH "
        "(the model's tokenizer), or --token-id-range MIN:MAX within its vocabulary, or use --backend chat"
    )


def word_count_text(words: list[str]) -> str:
    """Words as one prompt text, each after a space (so each is the same one token everywhere)."""
    return " " + " ".join(words) if words else ""
