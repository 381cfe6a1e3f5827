"""Small text helpers shared by the hot path and the reports; imports nothing, so anything may use it."""

from __future__ import annotations


def shorten(text: str, limit: int = 160) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters with '...'.

    Server error bodies can be pages of HTML or a stack trace; a note or log line needs the gist.
    """
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


MISSING = "-"  # a value that is not known, in every table


def fmt_num(v: float | None, digits: int) -> str:
    """``v`` with ``digits`` decimals; MISSING for None."""
    return MISSING if v is None else f"{v:.{digits}f}"


def fmt_count(v: float | None) -> str:
    """A count that may be a mean: whole numbers without decimals, others with one."""
    if v is None:
        return MISSING
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}"


def fmt_pct(pct: float | None) -> str:
    """A change in percent, rounded to a whole percent: +12%, -32%, 0%; MISSING when unknown."""
    if pct is None:
        return MISSING
    r = round(pct)
    return "0%" if r == 0 else f"{r:+d}%"
