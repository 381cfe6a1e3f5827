"""What each request of a trace replay sends: its ``hash_ids`` blocks as shared tokens, then its own.

A request's prompt is its blocks in order, each ``block_size`` units, cut to its input length (less
the tokens the server adds, as every specload prompt); when the blocks cover fewer tokens than the
input length (a file whose blocks are smaller than its reader says, the vLLM timed_trace trap) the
rest is the request's own. A block is a window of the seed's tape (``specload.workload.prompts``)
at a start drawn from its hash id alone, so every request, in every process, with the same id sends
the same block, and the server's prefix cache sees the sharing production had. A trace without
blocks sends each request its own prompt, which no prefix cache can serve.

The units are the run's prompt material: random token ids on a token-id API, random one-token words
on a text API (``trace_prompt``, made by the process that sends), or real text (``--prompts real``,
token-id APIs): ``RealTape`` holds specload's built-in real text (``specload.workload.realtext``:
code and prose) as the server's tokenizer reads it, made once by the owner, a block a window of it
(code for one hash id in five, prose otherwise), so a draft model meets text, not noise; the owner
sends each real prompt with its ticket (``TicketReply.trace_prompt``). The report names which it
was: acceptance under speculation depends on it.
"""

from __future__ import annotations

import functools
import os
import random
import zlib
from dataclasses import dataclass
from typing import Any

from specload.workload.config import Scenario
from specload.workload.prompts import (
    IDS,
    MAX_WINDOW,
    TAPE_STARTS,
    Draw,
    PromptSource,
    _memo,
    _text_memo_of,
    _units,
    _word_draw,
)
from specload.workload.realtext import corpus
from specload.workload.traces import TraceRequest, mooncake
from specload.workload.vocab import Tokenizer, word_count_text

# A request's own units (past its blocks) are prompt number TRACE_N0 + its row: far from any level's
# numbers (specload.workload.request.prompt_number), so no trace prompt starts like a level's.
TRACE_N0 = 1 << 40


def salt_of(sc: Scenario, level: int) -> str:
    """What makes one replay's blocks its own: the trace file's name and the repeat (the level's index:
    one level per repeat). The same window replayed against two servers (two arms) sends the same
    tokens; a second repeat against the same server, or another trace whose ids also start at 0, does
    not find the first one's blocks in the server's prefix cache."""
    return f"{os.path.basename(sc.trace or '')}#{level}"


def _salt_n(salt: str) -> int:
    return TRACE_N0 + (zlib.crc32(salt.encode()) << 24)


def block_size_of(sc: Scenario) -> int | None:
    """Tokens per prefix block of the scenario's trace, as its reader fixes it or the command line
    declares it (known without reading the file: a worker has none)."""
    if sc.trace_format == mooncake.FORMAT:
        return mooncake.BLOCK_SIZE
    if sc.trace_format in ("jsonl", "csv") and sc.trace_hash_field:
        return sc.trace_block_size
    return None


@functools.lru_cache(maxsize=1 << 16)
def _block_start(seed: int, salt: str, h: int) -> int:
    """Where block ``h`` starts on the tape (memoised: seeding a generator costs ~20 µs, a prompt has
    tens of blocks, and most ids repeat)."""
    return int(random.Random(f"specload-trace-block-{seed}-{salt}-{h}").random() * TAPE_STARTS)


def trace_prompt(
    src: PromptSource, seed: int, req: TraceRequest, block_size: int | None, salt: str = ""
) -> list[int] | str:
    """The prompt of trace request ``req``: its blocks, then its own units, ``src.units(input)`` in all."""
    n = src.units(req.input_tokens)
    draw: Draw
    if src.kind == IDS:
        assert src.ids is not None
        draw, store = src.ids.draw, src.ids.memo
    else:
        draw, store = _word_draw(src.words), _text_memo_of(src.words)
    out: list[Any] = []
    if block_size and req.hash_ids:
        tape = _memo(
            store,
            ("tape", seed),
            lambda: draw(random.Random(f"specload-tape-{seed}"), TAPE_STARTS + MAX_WINDOW),
        )
        size = min(block_size, MAX_WINDOW)
        for h in req.hash_ids:
            if len(out) >= n:
                break
            start = _block_start(seed, salt, h)
            out += tape[start : start + size]
        del out[n:]
    if len(out) < n:
        out += _units(seed, _salt_n(salt) + req.index, n - len(out), draw, store)
    if src.kind == IDS:
        return out
    return word_count_text(out)


# Real text for trace blocks: the whole code file and this much of the prose, tokenized in pieces of
# about REAL_PIECE characters cut at a line or space (a server's /tokenize may refuse a text longer
# than its context).
REAL_PROSE_CHARS = 200_000
REAL_PIECE = 4_000


@dataclass(frozen=True)
class RealTape:
    """Specload's real text as token ids of the server's tokenizer: one sequence per source."""

    code: list[int]
    prose: list[int]
    tokenizer: str

    def source(self, key: int) -> list[int]:
        return self.code if key % 5 == 0 else self.prose


def _pieces(text: str) -> list[str]:
    out, i = [], 0
    while i < len(text):
        j = min(len(text), i + REAL_PIECE)
        if j < len(text):
            cut_at = max(text.rfind("\n", i, j), text.rfind(" ", i, j))
            j = cut_at + 1 if cut_at > i else j
        out.append(text[i:j])
        i = j
    return out


def real_tape(tok: Tokenizer, seed: int = 0) -> RealTape:
    """The tape, tokenized by ``tok`` (VocabError when it cannot tokenize)."""
    c = corpus(seed)
    code = [i for p in _pieces(c.code.text) for i in tok.encode(p)]
    prose = [i for p in _pieces(c.prose.text[:REAL_PROSE_CHARS]) for i in tok.encode(p)]
    return RealTape(code, prose, tok.name)


def _window(tape: RealTape, key: int, tag: str, seed: int, n: int, salt: str) -> list[int]:
    """``n`` ids of the tape from a start drawn by (seed, salt, key); longer than the tape: it again
    from its start (a prompt longer than the text, code for one key in five)."""
    src = tape.source(key)
    u = random.Random(f"specload-trace-real-{tag}-{seed}-{salt}-{key}").random()
    if n >= len(src):
        start = int(u * len(src))
        return (src[start:] + src * (n // len(src) + 1))[:n]
    start = int(u * (len(src) - n))
    return src[start : start + n]


def real_trace_prompt(
    tape: RealTape, seed: int, req: TraceRequest, block_size: int | None, overhead: int, salt: str = ""
) -> list[int]:
    """Trace request ``req``'s real-text prompt: its blocks, each a window of the tape chosen by its
    hash id (and the replay's ``salt``) alone, then its own window; ``input_tokens - overhead`` ids in all."""
    n = max(1, req.input_tokens - overhead)
    out: list[int] = []
    if block_size and req.hash_ids:
        for h in req.hash_ids:
            if len(out) >= n:
                break
            out += _window(tape, h, "block", seed, block_size, salt)
        del out[n:]
    if len(out) < n:
        out += _window(tape, req.index, "own", seed, n - len(out), salt)
    return out
