"""Small text helpers shared by the hot path and the reports; imports nothing, so anything may use it."""

from __future__ import annotations


def shorten(text: str, limit: int = 160) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters with '...'.

    Server error bodies can be pages of HTML or a stack trace; a note or log line needs the gist.
    """
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
