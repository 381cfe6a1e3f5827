"""Verdict words in colour on a terminal: met (green), missed (red), flagged (yellow).

Only when the text goes to a terminal, and never when ``NO_COLOR`` is set to anything
(https://no-color.org) or ``TERM`` is ``dumb``: files, pipes and CI logs get the same bytes as
before. Applied after a text is fitted to the width, since the escape codes take no columns.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TextIO

GREEN, RED, YELLOW, RESET = "\x1b[32m", "\x1b[31m", "\x1b[33m", "\x1b[0m"
_WORDS = {"met": GREEN, "meets": GREEN, "missed": RED, "flagged": YELLOW}
_VERDICT = re.compile(r"\b(" + "|".join(_WORDS) + r")\b")


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal: only there is a text fitted to the width and coloured, so
    that pipes, files and CI logs get the lines they always got."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def wants_colour(stream: TextIO, env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    if env.get("NO_COLOR") or env.get("TERM") == "dumb":
        return False
    return is_terminal(stream)


def colour_verdicts(text: str) -> str:
    return _VERDICT.sub(lambda m: f"{_WORDS[m.group(1)]}{m.group(1)}{RESET}", text)


def for_stream(text: str, stream: TextIO) -> str:
    """``text`` as it should be written to ``stream``: coloured on a terminal, else unchanged."""
    return colour_verdicts(text) if wants_colour(stream) else text
