"""Prompt generation: exact-length token-id prompts that no prefix cache can serve.

Prompts are token ids, not text, so the input length is exact (no tokenizer round trip) on the
backends that take ids (``/v1/completions`` prompt lists, SGLang ``input_ids``). Each prompt is
derived from (seed, request number) alone, so any Locust process can build request k without
coordination and a rerun with the same seed sends the same prompts.
"""

from __future__ import annotations

import random

# Short, common English words: each is about one token in the usual BPE vocabularies when preceded
# by a space, so a text prompt of N words lands near N tokens. The server's own count is reported.
_WORDS = ["the", "of", "and", "to", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are", "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by", "word", "but", "not", "what", "all", "were", "we", "when", "your", "can", "said", "there", "use", "an", "each", "which", "she", "do", "how", "their", "if", "will", "up", "other", "about", "out", "many", "then", "them", "these", "so", "some", "her", "would", "make", "like", "him", "into", "time", "has", "look", "two", "more", "write", "go", "see", "number", "no", "way", "could", "people", "my", "than", "first", "water", "been", "call", "who", "oil", "its", "now", "find", "long", "down", "day", "did", "get", "come", "made", "may", "part"]


def prompt_ids(seed: int, n: int, length: int, id_min: int, id_max: int, shared_prefix: int = 0) -> list[int]:
    """Token ids of prompt number ``n``: ``length`` ids in [id_min, id_max).

    The first ``shared_prefix`` ids are the same for every n (to exercise a prefix cache on
    purpose); the rest are distinct per n with overwhelming probability.
    """
    out: list[int] = []
    if shared_prefix:
        rp = random.Random(f"specload-prefix-{seed}")
        out = [rp.randrange(id_min, id_max) for _ in range(shared_prefix)]
    r = random.Random(f"specload-{seed}-{n}")
    out.extend(r.randrange(id_min, id_max) for _ in range(length - len(out)))
    return out


def prompt_text(seed: int, n: int, length: int, shared_prefix: int = 0) -> str:
    """A text prompt of ``length`` words for chat endpoints (token count is the server's to say)."""
    words: list[str] = []
    if shared_prefix:
        rp = random.Random(f"specload-prefix-{seed}")
        words = [rp.choice(_WORDS) for _ in range(shared_prefix)]
    r = random.Random(f"specload-{seed}-{n}")
    # A leading request number makes two prompts differ from their very first token.
    words.append(str(n))
    words.extend(r.choice(_WORDS) for _ in range(length - len(words)))
    return " ".join(words)
