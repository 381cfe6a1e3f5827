"""What a backend is: how to ask for a generation, and how to read one stream event.

A backend knows one server API. It builds the request body and, per request, a parser whose
``feed`` is called once per SSE ``data:`` payload. ``feed`` is on the per-chunk hot path: it
does one ``orjson.loads`` and a few dict lookups, nothing else.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import orjson


class MalformedEvent(ValueError):
    """A stream event that is not the JSON the API promises."""


def count(value: Any, name: str) -> int | None:
    """A token count as the server gave it, or TypeError (a malformed event) for anything but an int."""
    if value is None or (type(value) is int and value >= 0):
        return value
    raise TypeError(f"{name} is {value!r}, not a count")


class StreamParser(ABC):
    """Per-request state while reading a stream."""

    __slots__ = (
        "output_tokens",
        "prompt_tokens",
        "finish_reason",
        "error",
        "spec_verify_ct",
        "cached_tokens",
        "text",
    )

    def __init__(self) -> None:
        self.output_tokens: int | None = None  # the server's count, once it has said it
        self.prompt_tokens: int | None = None
        self.finish_reason: str | None = None
        self.error: str | None = None  # an error object sent inside the stream
        self.spec_verify_ct: int | None = None
        self.cached_tokens: int | None = None  # prompt tokens the server's prefix cache served, if it says
        self.text: list[str] | None = (
            None  # when a list: receives the answer's text (a conversation's history)
        )

    def feed(self, payload: bytes) -> int:
        """Digest one event; return how many output tokens it carries (0: not a content event).

        When the server does not say per event how many tokens it carried, a content event
        counts as 1 here; the final figure then comes from the server's usage count.
        """
        try:
            ev = orjson.loads(payload)
            if ev.get("error"):  # only a non-empty error is one ("error": null is not)
                self.take_error(ev)
                return 0
            return self.read(ev)
        except (orjson.JSONDecodeError, KeyError, AttributeError, TypeError) as e:
            raise MalformedEvent(f"{type(e).__name__}: {e}") from None

    @abstractmethod
    def read(self, ev: dict[str, Any]) -> int:
        """The API-specific part of ``feed``; a missing key or a wrong type means a malformed event."""

    def take_usage(self, usage: Any) -> None:
        if usage:
            self.output_tokens = count(
                usage.get("completion_tokens", self.output_tokens), "completion_tokens"
            )
            self.prompt_tokens = count(usage.get("prompt_tokens", self.prompt_tokens), "prompt_tokens")
            details = usage.get("prompt_tokens_details")  # vLLM/SGLang with prompt token details enabled
            if details:
                self.cached_tokens = count(details.get("cached_tokens"), "cached_tokens")

    def take_error(self, event: dict[str, Any]) -> None:
        err = event["error"]
        self.error = str(err.get("message", err) if isinstance(err, dict) else err)


Prompt = list[int] | str | list[dict[str, Any]]  # token ids, text, or chat messages (a dataset's)


def as_text(prompt: Prompt) -> list[int] | str:
    """Chat messages as one text, for the APIs that take a plain prompt."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        return "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict))
    return prompt  # type: ignore[return-value]


class Backend(ABC):
    name: str
    path: str
    token_source: str  # records.SRC_* used when the server reports a count
    # Whether the parser knows how many tokens each stream event carried (else: one per event).
    counts_tokens_per_event: bool = False
    takes_token_ids: bool = True

    @abstractmethod
    def body(
        self, prompt: Prompt, max_tokens: int, model: str | None, temperature: float, extra: dict[str, Any]
    ) -> dict[str, Any]:
        """The JSON body of one streaming generation request of exactly ``max_tokens`` tokens."""

    @abstractmethod
    def parser(self) -> StreamParser: ...
