"""Real text for the real-model tests, made from what every Python installation carries.

Two kinds of prompt whose acceptance under n-gram speculation differs (tests/real/test_smollm2.py):

- ``code_edit``: "rename one variable in this function": a standard-library function (8-28 lines,
  picked with ``ast``) whose answer copies the prompt, which is what prompt lookup drafts from;
- ``qa``: factual questions, whose answers copy nothing.

``long_text`` is a standard-library module's source: a few thousand tokens of real text, which a test
cuts to an exact token count with the server's own tokenizer (``exact_tokens``).

Rows are JSONL objects in the form ``specload sweep --dataset`` reads (``prompt``, ``category``,
``output_tokens``).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

CODE_MODULES = ("shlex", "fnmatch", "colorsys", "base64", "glob", "posixpath", "heapq", "difflib")
QUESTIONS = (
    "What is the capital of Australia, and why was it chosen?",
    "How does photosynthesis work?",
    "Why is the sky blue?",
    "What causes the seasons on Earth?",
    "Who wrote the novel Pride and Prejudice, and when was it published?",
    "How do vaccines train the immune system?",
    "What is the difference between weather and climate?",
    "Why do cats purr?",
)


def _function(module: str) -> tuple[str, str] | None:
    """(source, variable) of the module's first top-level function of 8-28 lines with a local assigned
    and used at least three times; None when it has none (another Python version's source)."""
    src = inspect.getsource(importlib.import_module(module))
    lines = src.splitlines()
    for node in ast.parse(src).body:
        if not isinstance(node, ast.FunctionDef) or node.end_lineno is None:
            continue
        if not 8 <= node.end_lineno - node.lineno + 1 <= 28:
            continue
        assigned = [
            t.id
            for st in ast.walk(node)
            if isinstance(st, ast.Assign)
            for t in st.targets
            if isinstance(t, ast.Name)
        ]
        uses: dict[str, int] = {}
        for st in ast.walk(node):
            if isinstance(st, ast.Name):
                uses[st.id] = uses.get(st.id, 0) + 1
        var = next((v for v in assigned if uses.get(v, 0) >= 3 and len(v) > 1), None)
        if var is not None:
            return "\n".join(lines[node.lineno - 1 : node.end_lineno]), var
    return None


def code_edit(n: int) -> list[str]:
    out = []
    for m in CODE_MODULES:
        found = _function(m)
        if found is not None:
            code, var = found
            out.append(
                f"Rewrite this Python function with the variable `{var}` renamed to `answer`. Keep everything "
                f"else exactly the same and reply with only the code.\n\n```python\n{code}\n```"
            )
    assert len(out) >= n, f"only {len(out)} standard-library functions found"
    return out[:n]


def rows(per_category: int, output_tokens: int) -> list[dict[str, Any]]:
    """``per_category`` code_edit rows, then as many qa rows."""
    code = [
        {"prompt": p, "category": "code_edit", "output_tokens": output_tokens}
        for p in code_edit(per_category)
    ]
    qa = [{"prompt": q, "category": "qa", "output_tokens": output_tokens} for q in QUESTIONS[:per_category]]
    return code + qa


def long_text() -> str:
    return inspect.getsource(importlib.import_module("textwrap"))


def exact_tokens(
    text: str, n: int, tokenize: Callable[[str], Sequence[int]], detokenize: Callable[[Sequence[int]], str]
) -> str:
    """A stretch of ``text`` that the tokenizer reads back as exactly ``n`` tokens: n of its ids from
    some offset, detokenized, kept when re-tokenizing gives the same n ids (a cut inside a word may
    merge differently; the next offset is tried)."""
    ids = list(tokenize(text))
    for start in range(min(64, len(ids) - n)):
        cut = detokenize(ids[start : start + n])
        if list(tokenize(cut)) == ids[start : start + n]:
            return cut
    raise AssertionError(f"no stretch of {n} tokens reads back as itself")


def write_jsonl(path: Path, items: Sequence[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in items))
    return path
