"""How many output tokens a request's record may carry: the one bound the client cuts a stream at
(specload.client.stream) and the one a record read back is held to (specload.analysis.validity)."""

from __future__ import annotations


def overrun_cap(asked: int) -> int:
    """Tokens a stream may carry before it is cut as failed: what was asked, and a margin for a
    server that counts a few more (a speculative step's extra tokens, a stop sequence's)."""
    return asked + max(16, asked // 4)
