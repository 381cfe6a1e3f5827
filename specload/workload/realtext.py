"""The built-in real-text prompt set: code, summaries, questions, stories and conversations, each prompt
sized to the scenario's input length by the server's own tokenizer, none repeated within a run.

Why it exists: speculative decoding accepts drafts at a rate that depends on the text. On random token
ids a small real model falls into repetition and an n-gram drafter feeds on it: SmolLM2-135M on vLLM
with ngram speculation accepted 3.85 tokens per drafting step on token ids and 1.88 on real text
(docs/metrics.md, "Prompts that flatter speculation"). So every place that measures speculation uses
this set unless told ``--prompts random``.

**What is in it** (``data/realtext.json.gz``, sources and licences in ``data/LICENSES.md``): the 164
HumanEval problems with their reference solutions (MIT), and nine narrative books of the World English
Bible (public domain). Five categories, each prompt's first sentence fixed by its category (a simulator
tells the category from it):

- ``code``: "Complete the following Python code." then the problems as one file, from a line on;
- ``summarize``: "Summarize the following text." then the prose from a verse on;
- ``qa``: "Answer the question using the text." then the prose, then one of a few questions;
- ``writing``: "Continue the following story." then the prose;
- ``conversation`` (no fixed opening): the prose, then one of a few requests to read it; two
  follow-up questions, each a later turn that resends the history (``datasets.Item.turns``).

**Sizing.** A prompt is its frame (opening, question) around as much of the source as makes it
exactly the length asked: the text is cut by the count of the same tokenizer that sizes a token-id prompt
(``--tokenizer``, else the server's ``/tokenize``), first at a word, then within the next word. Only
``encode`` is used, so any server that tokenizes can size; the tokens the server adds around a prompt
(a chat template) were measured by the probe and are left out of the length asked for here.

**No repeats.** The run's prompts are numbered in the order the sweep hands them out, across levels
(``locust.tickets``): prompt i is category i mod 5, and within its category takes the next start of
a seeded order of starts (the prose categories take turns through one order: no verse starts two
prompts). Two starts never begin with the same ``DISTINCT_WORDS`` words, and the variable parts of
a frame (questions, requests) come after the text, so two prompts of a run share at most their
opening and nine words (in the simulator's word units, less than its 16-unit block: the test shows a
later level served nothing; on a real server at most two 16-token blocks beyond what its chat template puts
before every prompt). Only a run that needs more prompts of a category than it has starts (2,867
code, 1,224 per prose category) reuses them, and says so. A length shorter than a prompt's frame
drops the question, then cuts the opening itself.
"""

from __future__ import annotations

import functools
import gzip
import json
import logging
import random
from dataclasses import dataclass
from importlib import resources
from typing import Any

from specload.workload.datasets import Item
from specload.workload.vocab import Tokenizer

logger = logging.getLogger("specload")

CODE, SUMMARIZE, QA, WRITING, CONVERSATION = "code", "summarize", "qa", "writing", "conversation"
CATEGORIES = (CODE, SUMMARIZE, QA, WRITING, CONVERSATION)
OPENINGS = {
    CODE: "Complete the following Python code.",
    SUMMARIZE: "Summarize the following text.",
    QA: "Answer the question using the text.",
    WRITING: "Continue the following story.",
}
QUESTIONS = (
    "Who are the people named in the text, and what does each of them do?",
    "Where do the events of the text take place?",
    "What happens first in the text, and what happens last?",
    "Why do the people in the text act as they do?",
    "What promises, commands or requests are made in the text, and by whom?",
    "How does the text describe the relationship between its main characters?",
)
CONVERSATION_LEADS = (
    "Here is a passage from a book I am reading; I have a few questions about it.",
    "Please read this text carefully. I will ask you about it afterwards.",
    "I found this passage and would like to talk it through with you.",
)
FOLLOW_UPS = (
    "Explain in your own words what happens in the passage.",
    "Which person in it would you most like to ask a question, and what would you ask?",
)
DISTINCT_WORDS = 10  # no two starts of a source begin with the same this many words
DATA = "realtext.json.gz"
ORIGIN = "real text (specload's built-in set: HumanEval code, World English Bible prose)"


class RealTextError(ValueError):
    """A prompt's frame alone is longer than the length asked for (``make_prompt`` then drops the
    question and, if need be, cuts the opening itself: a prompt of a few tokens is still made)."""


@dataclass(frozen=True)
class Source:
    """One category's source as a single text, and where a prompt may start in it (seeded order)."""

    text: str
    starts: tuple[int, ...]


@dataclass(frozen=True)
class Corpus:
    code: Source  # the HumanEval problems, one file; starts: problem starts first, then other lines
    prose: Source  # the books, verse by verse, chapters as paragraphs; starts: verses


@functools.cache
def _raw() -> dict[str, Any]:
    blob = resources.files("specload.workload").joinpath("data").joinpath(DATA).read_bytes()
    data = json.loads(gzip.decompress(blob))
    assert isinstance(data, dict)
    return data


def _distinct(text: str, starts: list[int]) -> list[int]:
    """``starts`` without those whose first DISTINCT_WORDS words an earlier one already has."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for s in starts:
        key = tuple(text[s : s + 400].split()[:DISTINCT_WORDS])
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


@functools.cache
def corpus(seed: int) -> Corpus:
    """The set's two sources and, per the seed, the order in which prompts take their starts."""
    raw = _raw()
    rng = random.Random(f"specload-realtext-{seed}")
    code_parts: list[str] = [str(p["text"]).strip("\n").rstrip() for p in raw["code"]]
    code = "\n\n\n".join(code_parts) + "\n\n\n"
    heads, others, pos = [], [], 0
    for part in code_parts:
        heads.append(pos)
        off = pos
        for line in part.split("\n")[:-1]:
            off += len(line) + 1
            if code[off : code.find("\n", off)].strip():  # a line with text, from its indentation on
                others.append(off)
        pos += len(part) + 3
    rng.shuffle(heads)
    rng.shuffle(others)
    verses: list[str] = []
    prose_starts: list[int] = []
    pos = 0
    for book in raw["prose"]:
        for chapter in book["chapters"]:
            for i, v in enumerate(chapter):
                prose_starts.append(pos)
                piece = v + ("\n\n" if i == len(chapter) - 1 else " ")
                verses.append(piece)
                pos += len(piece)
    prose = "".join(verses)
    rng.shuffle(prose_starts)
    return Corpus(
        Source(code, tuple(_distinct(code, heads + others))),
        Source(prose, tuple(_distinct(prose, prose_starts))),
    )


def source_of(category: str, c: Corpus) -> Source:
    return c.code if category == CODE else c.prose


def frame(category: str, j: int) -> tuple[str, str]:
    """What stands before and after the source text in the ``j``-th prompt of ``category``. A question
    or request goes after the text: before it, the few variants would give every n-th prompt the same
    first block of a prefix cache."""
    if category == QA:
        return f"{OPENINGS[QA]}\n\n", f"\n\nQuestion: {QUESTIONS[j % len(QUESTIONS)]}"
    if category == CONVERSATION:
        return "", f"\n\n{CONVERSATION_LEADS[j % len(CONVERSATION_LEADS)]}"
    return f"{OPENINGS[category]}\n\n", ""


def body(src: Source, start: int, chars: int) -> str:
    """``chars`` characters of the source from ``start`` on, going round to its beginning if need be."""
    text = src.text
    out = text[start : start + chars]
    while len(out) < chars:
        out += text[: chars - len(out)]
    return out


def fit(
    head_text: str, body_text: str, tail_text: str, tokens: int, tok: Tokenizer
) -> tuple[str, int] | None:
    """``head_text``, the longest start of ``body_text`` and ``tail_text`` that make at most ``tokens``
    tokens, and their count: exactly ``tokens`` unless no cut of the body lands on it. None when the
    body is too short to reach ``tokens``.

    The cut is searched over words, each guess stepping by the words the missing tokens make at the
    body's average tokens per word and kept strictly inside the bracket of counts below and above
    the target (so it ends), then by halving over the characters of the next word: about six counts
    for a 1000-token prompt."""

    def count(t: str) -> int:
        return len(tok.encode(t))

    words = body_text.split(" ")

    def upto(w: int, part: str = "") -> str:
        return head_text + " ".join(words[:w]) + part + tail_text

    lo, c_lo = 0, count(upto(0))
    if c_lo > tokens:
        raise RealTextError(f"an input length of {tokens} tokens is shorter than a prompt's head")
    hi, c_hi = len(words), count(upto(len(words)))
    if c_hi < tokens:
        return None
    if c_hi == tokens:
        return upto(hi), c_hi
    per_word = (c_hi - c_lo) / hi  # tokens a word adds, on average: the step from a count to the target
    w = lo + round((tokens - c_lo) / per_word)
    while hi - lo > 1 and c_lo < tokens:
        w = min(hi - 1, max(lo + 1, w))  # strictly inside the bracket: it shrinks at every count
        c = count(upto(w))
        if c <= tokens:
            lo, c_lo = w, c
        else:
            hi, c_hi = w, c
        step = round((tokens - c) / per_word)
        w += step if step else (1 if c < tokens else -1)
    best, c_best = upto(lo), c_lo
    if c_best < tokens and lo < len(words):
        nxt = (" " if lo else "") + words[lo]  # upto(lo + 1) is over: some prefix of it may land exactly
        a, b = 0, len(nxt)
        while b - a > 1:
            mid = (a + b) // 2
            c = count(upto(lo, nxt[:mid]))
            if c <= tokens:
                a, c_a = mid, c
                if c == tokens:
                    break
            else:
                b = mid
        if a:
            best, c_best = upto(lo, nxt[:a]), c_a
    return best, c_best


def _chars(tokens: int) -> int:
    """Characters of source enough for ``tokens`` tokens (ample: code runs ~3 characters a token)."""
    return 8 * tokens + 400


def make_prompt(category: str, j: int, c: Corpus, tokens: int, tok: Tokenizer) -> tuple[str, int, bool]:
    """The ``j``-th prompt of ``category`` sized to ``tokens``: its text, its count, and whether its
    start was reused (more prompts than the category has starts)."""
    src = source_of(category, c)
    k = j
    if src is c.prose:  # the prose categories take turns through one order of starts: no verse twice
        prose = [x for x in CATEGORIES if x != CODE]
        k = j * len(prose) + prose.index(category)
    start = src.starts[k % len(src.starts)]
    h, t = frame(category, j)
    chars = _chars(tokens)
    while True:
        text = body(src, start, chars)
        try:
            got = fit(h, text, t, tokens, tok)
        except RealTextError:  # a length shorter than the frame: the question goes, then the opening is cut
            got = (
                fit(h, text, "", tokens, tok) if _fits(h, tokens, tok) else fit("", h + text, "", tokens, tok)
            )
        if got is not None:
            return got[0], got[1], k >= len(src.starts)
        chars *= 2


def _fits(head_text: str, tokens: int, tok: Tokenizer) -> bool:
    return len(tok.encode(head_text)) <= tokens


def real_items(
    n: int, seed: int, tok: Tokenizer, input_tokens: int, output_tokens: int, turns: bool = True
) -> list[Item]:
    """The run's first ``n`` prompts, in the order they are handed out; each asks for
    ``output_tokens`` and counts ``input_tokens`` by ``tok`` (the server's overhead already left out).
    ``turns``: conversations carry their follow-up turns (a completions API sends them as one text)."""
    c = corpus(seed)
    follow = tuple(len(tok.encode(t)) for t in FOLLOW_UPS) if turns else ()
    out: list[Item] = []
    reused = 0
    for i in range(n):
        category = CATEGORIES[i % len(CATEGORIES)]
        text, count, again = make_prompt(category, i // len(CATEGORIES), c, input_tokens, tok)
        reused += again
        later = FOLLOW_UPS if category == CONVERSATION and turns else ()
        out.append(Item(text, count, output_tokens, category, later, follow if later else ()))
    if reused:
        logger.warning(
            "real text: %d of %d prompts reuse a start of their category (the run needs more prompts "
            "than the set has starts); a prefix cache may serve them from earlier ones",
            reused,
            n,
        )
    return out


def starts_available() -> dict[str, int]:
    """How many distinct prompts each category can give before one repeats (seed 0's order)."""
    c = corpus(0)
    prose = len(CATEGORIES) - 1
    return {k: len(c.code.starts) if k == CODE else len(c.prose.starts) // prose for k in CATEGORIES}
