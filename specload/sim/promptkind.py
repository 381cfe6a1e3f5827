"""What kind of prompt a request carries, for the speculative acceptance it gets.

Speculation accepts more of some text than of other: on a real model (vLLM, n-gram drafting, k = 3)
code editing accepted 2.57 tokens per drafting step, open writing 1.61, and a prompt of random token
ids 3.85, because the model copies and loops on id soup (docs/simulator.md, "Acceptance by prompt").
So the batch engine looks at the prompt and takes the acceptance its preset gives that kind:

- **token ids**: a prompt sent as token ids (``/v1/completions`` ``prompt: [ids]``, ``/generate``
  ``input_ids``), or text decoded from random ids, which reads as words with hardly any of the
  function words that make up a third of English prose (``the``, ``of``, ``and``...);
- **a category**: the first user text starts with the category's fixed opening sentence (a
  categorised prompt set begins every prompt of a category with one, e.g. "Summarize the following
  text."); a conversation of several turns with no known opening is the preset's multi-turn category;
- otherwise **None**: plain real text, the preset's own ``spec_accept_prob``.

Pure functions of the request body; the simulator imports nothing of the rest of specload.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

TOKEN_IDS = "token_ids"  # the kind of a prompt of token ids, whatever the preset calls its categories

# Decoded random ids: at least this many words, of which fewer than this share are function words
# (English prose: 30-45 %; specload's random-word prompts: ~45 %; technical markdown: 10-30 %;
# text decoded from 200 random ids of a 49 152-token BPE vocabulary: 0-0.3 %).
MIN_WORDS = 32
MAX_FUNCTION_SHARE = 0.02
_FUNCTION_WORDS = frozenset(
    [
        "the",
        "of",
        "and",
        "to",
        "a",
        "in",
        "is",
        "it",
        "that",
        "for",
        "on",
        "as",
        "with",
        "was",
        "he",
        "she",
        "they",
        "be",
        "at",
        "by",
        "this",
        "are",
        "or",
        "from",
        "but",
        "not",
        "have",
        "had",
        "his",
        "her",
        "an",
        "which",
        "you",
        "we",
        "i",
        "their",
        "its",
        "there",
        "were",
        "been",
        "has",
        "will",
        "would",
        "can",
    ]
)
_EDGE = "\"'()[]{}<>.,;:!?*`-_"


def _text_of(content: Any) -> str:
    """A chat message's text: its string, or its text parts joined (OpenAI's content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def is_token_ids(prompt: Any) -> bool:
    """A list of ints (one prompt of token ids), or a list of such lists (a batch of them)."""
    if not isinstance(prompt, list) or not prompt:
        return False
    first = prompt[0]
    if isinstance(first, list):
        return bool(first) and type(first[0]) is int
    return type(first) is int


def reads_as_decoded_ids(text: str) -> bool:
    """``text`` has the shape of random token ids decoded to text (see MIN_WORDS)."""
    words = text.split()
    if len(words) < MIN_WORDS:
        return False
    function = sum(1 for w in words if w.strip(_EDGE).lower() in _FUNCTION_WORDS)
    return function < MAX_FUNCTION_SHARE * len(words)


def prompt_kind(
    prompt: Any,
    messages: Any,
    openings: Mapping[str, str],
    multi_turn: str | None = None,
) -> str | None:
    """The prompt's kind: TOKEN_IDS, the category whose opening (``openings``: category -> opening
    sentence) starts the first user text, ``multi_turn`` for a conversation of several turns that
    no opening matched, or None (plain real text).

    ``prompt``: a completions ``prompt`` or ``/generate`` ``input_ids`` / ``text``; ``messages``: a
    chat request's messages (then ``prompt`` is None)."""
    turns = 1
    if messages is not None:
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        turns = len(users) + sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        text = _text_of(users[0].get("content")) if users else ""
    elif is_token_ids(prompt):
        return TOKEN_IDS
    elif isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        text = prompt[0]  # a batch of texts: the first one's kind
    else:
        return None
    head = text.lstrip()
    for name, opening in openings.items():
        if opening and head.startswith(opening):
            return name
    if turns > 1 and multi_turn is not None:
        return multi_turn
    if reads_as_decoded_ids(text if messages is None else _all_text(messages)):
        return TOKEN_IDS
    return None


def _all_text(messages: Sequence[Any]) -> str:
    return " ".join(
        _text_of(m.get("content")) for m in messages if isinstance(m, dict) and m.get("role") == "user"
    )
