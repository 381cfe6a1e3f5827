"""What a backend is: how to ask for a generation, and how to read one stream event.

A backend knows one server API. It builds the request body and, per request, a parser whose
``feed`` is called once per SSE ``data:`` payload. ``feed`` is on the per-chunk hot path: it
does one ``orjson.loads`` and a few dict lookups, nothing else.
"""

from __future__ import annotations

import inspect
import re
from abc import ABC, abstractmethod
from typing import Any, TypeVar

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
        "spec_drafted",
        "spec_accepted",
        "spec_hist",
        "spec_along",
        "spec_source",
        "counted_events",
        "reasoning_tokens",
        "reasoning_events",
        "in_reasoning",
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
        # The response's own acceptance figures (specload.client.backends.spec; records.spec_*).
        self.spec_drafted: int | None = None
        self.spec_accepted: int | None = None
        self.spec_hist: list[int] | None = None
        self.spec_along: list[list[int]] | None = None
        self.spec_source: str | None = None
        # True while every content event said how many tokens it carried (a running count, such as
        # vLLM's continuous_usage_stats), so that ITL is per token; None before the first one.
        self.counted_events: bool | None = None
        # Reasoning streams (chat deltas with ``reasoning`` / ``reasoning_content``): the server's count
        # (usage.completion_tokens_details.reasoning_tokens), the reasoning events seen, and whether the
        # last content event was reasoning (the stream loop takes the first one that is not as the answer's).
        self.reasoning_tokens: int | None = None
        self.reasoning_events = 0
        self.in_reasoning = False

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
            done = usage.get("completion_tokens_details")  # vLLM with a reasoning parser, OpenAI
            if done:
                self.reasoning_tokens = count(done.get("reasoning_tokens"), "reasoning_tokens")

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
    """One server API. Its class attributes are all the rest of specload knows of it: the
    ``--backend`` choices and help, and whether a run needs a model name, are made from them."""

    name: str  # the --backend value (and run.json's, and each record's)
    path: str  # the generation request's path
    # The records' output_tokens_source when the server reports a count: records.SRC_USAGE or
    # SRC_META, or a label of the backend's own (any but SRC_CHUNKS, the fallback of counted events).
    token_source: str
    # Whether the parser knows how many tokens each stream event carried (else: one per event).
    counts_tokens_per_event: bool = False
    takes_token_ids: bool = True
    # Whether the request body names a model: without --model, a run then asks /v1/models and
    # cannot start when the server lists none. False for an API that serves its one model unnamed.
    needs_model: bool = True
    # The response fields that state this API's speculation (verify steps, drafted and accepted
    # tokens), as a message names them; None: its responses never do (the server's /metrics may).
    spec_fields: str | None = None

    @abstractmethod
    def body(
        self,
        prompt: Prompt,
        max_tokens: int,
        model: str | None,
        temperature: float,
        extra: dict[str, Any],
        natural: bool = False,
    ) -> dict[str, Any]:
        """The JSON body of one streaming generation request of exactly ``max_tokens`` tokens, or with
        ``natural`` of at most that many (the model may stop at its end-of-sequence token)."""

    @abstractmethod
    def parser(self) -> StreamParser: ...


B = TypeVar("B", bound=type[Backend])
_NAME = re.compile(r"[a-z][a-z0-9_-]*")
_REGISTRY: dict[str, type[Backend]] = {}


def register(cls: B) -> B:
    """Make a backend selectable by its ``name`` (``--backend``, scenario files, the web UI's form);
    a class decorator. A class that could not serve a request is refused here, at import, rather
    than in the middle of a sweep.

    Register before ``specload.workload.config`` is imported (every backend module is imported by
    ``specload.client.backends``, which config imports): its field table, with the choices and the
    help text, is made once, from the backends registered then."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise TypeError(f"{cls.__name__}.name must be a lower-case word (a --backend value), not {name!r}")
    path = getattr(cls, "path", None)
    if not isinstance(path, str) or not path.startswith("/"):
        raise TypeError(f"{cls.__name__}.path must be the request's path, like /v1/completions, not {path!r}")
    if not isinstance(getattr(cls, "token_source", None), str):
        raise TypeError(f"{cls.__name__}.token_source must name where the output count comes from")
    if inspect.isabstract(cls):
        raise TypeError(f"{cls.__name__} leaves {', '.join(sorted(cls.__abstractmethods__))} abstract")
    other = _REGISTRY.get(name)
    if other is not None and other is not cls:
        raise ValueError(f"backend name {name!r} is taken by {other.__module__}.{other.__qualname__}")
    _REGISTRY[name] = cls
    return cls


def backend_classes() -> tuple[type[Backend], ...]:
    """Every registered backend, in the order of registration."""
    return tuple(_REGISTRY.values())


def get_backend(name: str) -> Backend:
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(_REGISTRY)}") from None
