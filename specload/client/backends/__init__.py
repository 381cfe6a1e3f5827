"""Server APIs specload can load: one small module each."""

from __future__ import annotations

from specload.client.backends.base import Backend, MalformedEvent, StreamParser
from specload.client.backends.chat import ChatCompletions
from specload.client.backends.openai import OpenAICompletions
from specload.client.backends.sglang import SGLangGenerate

_BACKENDS: dict[str, type[Backend]] = {
    b.name: b for b in (OpenAICompletions, SGLangGenerate, ChatCompletions)
}


def get_backend(name: str) -> Backend:
    try:
        return _BACKENDS[name]()
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(_BACKENDS)}") from None


__all__ = ["Backend", "MalformedEvent", "StreamParser", "get_backend"]
