"""What a generation request says, read and checked before any engine work.

Every endpoint's body comes down to one :class:`GenRequest` (prompt length, output length, whether
to stream). Each check raises :class:`HTTPError` naming the problem, with the status a real server
would answer; :func:`error_body` renders it in OpenAI's error envelope, which OpenAI-compatible
clients know how to surface. Validation is kept to O(1) per request where a full scan would cost
O(prompt) on the arrival path (see :func:`_prompt_len`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    411: "LengthRequiredError",
    413: "RequestTooLargeError",
    429: "RateLimitError",
    431: "RequestHeaderFieldsTooLargeError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
    505: "HTTPVersionNotSupportedError",
}


class HTTPError(Exception):
    """A request the server answers with an OpenAI-style error body instead of a completion."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_body(status: int, message: str) -> bytes:
    """OpenAI's error envelope, which OpenAI-compatible clients know how to surface."""
    err = {"message": message, "type": _ERROR_TYPES.get(status, "Error"), "param": None, "code": status}
    return orjson.dumps({"error": err})


@dataclass(slots=True)
class Vocab:
    """The simulated model's vocabulary: a word-level tokenizer for ``/tokenize`` (one token per
    whitespace-separated word, the same count the generation endpoints use), and optionally
    llama.cpp's check that every prompt token id exists."""

    size: int | None = None  # None: token ids are not checked
    chat_template_tokens: int = 0  # what a chat template adds to every chat prompt
    special: int = 3  # ids below this are special tokens, never produced by /tokenize

    def tokenize(self, text: str) -> list[int]:
        span = (self.size or 32000) - self.special
        return [self.special + zlib.crc32(w.encode()) % span for w in text.split()]

    def check_ids(self, prompt: Any) -> None:
        """HTTP 400 when a token-id prompt holds an id outside the vocabulary (O(prompt), so only when asked)."""
        if self.size is None or not isinstance(prompt, list) or not prompt:
            return
        try:
            ok = min(prompt) >= 0 and max(prompt) < self.size
        except TypeError:
            return  # not all ints: _prompt_len answers that
        if not ok:
            raise HTTPError(400, "Prompt contains invalid tokens")


@dataclass(slots=True)
class GenRequest:
    """What the engine and the renderers need from a generation request, whatever the endpoint."""

    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    key: Any = (
        None  # the prompt as prefix-cache units (specload.sim.prefix.PromptKey), when the engine has a cache
    )
    kind: str | None = None  # the prompt's kind (specload.sim.promptkind), when the engine speculates
    # Whether the model may end the answer at its EOS before max_tokens (no ignore_eos), and not before
    # min_tokens (specload.sim.eos).
    may_stop: bool = True
    min_tokens: int = 0


#: An endpoint's body reader: (JSON body, the server's max_model_len) -> the request.
Parse = Callable[[dict[str, Any], int], GenRequest]


def read_json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise HTTPError(400, f"Invalid JSON body: {e}") from None
    if not isinstance(body, dict):
        raise HTTPError(400, "The request body must be a JSON object")
    return body


def check_model(body: dict[str, Any], model: str) -> None:
    """A request naming another model gets vLLM's 404; one naming none is served."""
    asked = body.get("model")
    if asked is not None and asked != model:
        raise HTTPError(404, f"The model `{asked}` does not exist.")


def check_context(req: GenRequest, max_model_len: int) -> None:
    """Prompt plus output must fit the context, in vLLM's words."""
    total = req.prompt_tokens + req.max_tokens
    if total > max_model_len:
        raise HTTPError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {total} tokens ({req.prompt_tokens} in the messages, {req.max_tokens} in "
            f"the completion). Please reduce the length of the messages or completion.",
        )


# ---------------------------------------------------------------------------------------------------
# Field checks


def _int(body: dict[str, Any], key: str, default: int | None, minimum: int) -> int:
    value = body.get(key)
    if value is None:
        if default is None:
            raise HTTPError(400, f"'{key}' is required")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise HTTPError(400, f"'{key}' must be an integer, got {value!r}")
    if value < minimum:
        raise HTTPError(400, f"'{key}' must be >= {minimum}, got {value}")
    return value


def _bool(body: dict[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise HTTPError(400, f"'{key}' must be a boolean, got {value!r}")
    return value


def _check_sampling(body: dict[str, Any], max_key: str, max_tokens: int) -> tuple[bool, int]:
    """Sampling fields get their types checked, as a real server would; returns (may stop at EOS:
    no ignore_eos, min_tokens), the two an answer's end depends on (the rest are ignored)."""
    ignore_eos = _bool(body, "ignore_eos")
    temperature = body.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0
    ):
        raise HTTPError(400, f"'temperature' must be a number >= 0, got {temperature!r}")
    min_tokens = _int(body, "min_tokens", 0, 0)
    if min_tokens > max_tokens:
        raise HTTPError(
            400, f"min_tokens ({min_tokens}) must be less than or equal to {max_key} ({max_tokens})"
        )
    return not ignore_eos, min_tokens


def _prompt_len(prompt: Any, key: str) -> int:
    """Token ids count one each; text counts one token per whitespace-separated word."""
    if isinstance(prompt, str):
        n = len(prompt.split())
    elif isinstance(prompt, list):
        # Only the ends are checked: a full scan would cost O(prompt) per request on the arrival
        # path, and arrival-path cost is what delays the TTFT of simultaneous requests.
        if prompt and (type(prompt[0]) is not int or type(prompt[-1]) is not int):
            raise HTTPError(
                400, f"'{key}' must be a string or a list of token ids; batches are not supported"
            )
        n = len(prompt)
    else:
        raise HTTPError(400, f"'{key}' must be a string or a list of token ids")
    if n == 0:
        raise HTTPError(400, f"'{key}' is empty")
    return n


def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = _bool(body, "stream")
    opts = body.get("stream_options")
    if opts is None:
        return stream, False
    if not isinstance(opts, dict):
        raise HTTPError(400, "'stream_options' must be an object")
    if not stream:
        raise HTTPError(400, "'stream_options' is only allowed when 'stream' is true")
    return stream, _bool(opts, "include_usage")


def openai_options(body: dict[str, Any]) -> tuple[bool, bool]:
    """(``stream_options.continuous_usage_stats``, ``return_spec_tokens_details``) of an OpenAI body
    (whose stream_options ``_stream_flags`` has checked already)."""
    opts = body.get("stream_options")
    continuous = isinstance(opts, dict) and _bool(opts, "continuous_usage_stats")
    return continuous, _bool(body, "return_spec_tokens_details")


def _message_words(messages: Any) -> int:
    if not isinstance(messages, list) or not messages:
        raise HTTPError(400, "'messages' must be a non-empty list")
    words = 0
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise HTTPError(400, "each message must be an object with a 'role'")
        content = m.get("content")
        if isinstance(content, str):
            words += len(content.split())
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    words += len(part["text"].split())
        elif content is not None:
            raise HTTPError(400, "message 'content' must be a string or a list of parts")
    return words


# ---------------------------------------------------------------------------------------------------
# The endpoints' bodies


def parse_completion(body: dict[str, Any], max_model_len: int) -> GenRequest:
    """``/v1/completions``: ``prompt`` (token ids or text), ``max_tokens`` (default 16, as vLLM)."""
    if "prompt" not in body:
        raise HTTPError(400, "'prompt' is required")
    prompt_tokens = _prompt_len(body["prompt"], "prompt")
    max_tokens = _int(body, "max_tokens", 16, 1)  # 16 is the OpenAI / vLLM default
    may_stop, min_tokens = _check_sampling(body, "max_tokens", max_tokens)
    stream, usage = _stream_flags(body)
    return GenRequest(prompt_tokens, max_tokens, stream, usage, may_stop=may_stop, min_tokens=min_tokens)


def parse_chat(body: dict[str, Any], max_model_len: int) -> GenRequest:
    """``/v1/chat/completions``: one token per word of the messages' text."""
    if "messages" not in body:
        raise HTTPError(400, "'messages' is required")
    prompt_tokens = _message_words(body["messages"])
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    # vLLM's chat default: whatever room the context leaves.
    max_tokens = _int(body, key, max(1, max_model_len - prompt_tokens), 1)
    may_stop, min_tokens = _check_sampling(body, key, max_tokens)
    stream, usage = _stream_flags(body)
    return GenRequest(prompt_tokens, max_tokens, stream, usage, may_stop=may_stop, min_tokens=min_tokens)


def parse_generate(body: dict[str, Any], max_model_len: int) -> GenRequest:
    """SGLang ``/generate``: ``input_ids`` or ``text``, ``sampling_params.max_new_tokens`` (default 128)."""
    if body.get("input_ids") is not None:
        prompt_tokens = _prompt_len(body["input_ids"], "input_ids")
    elif body.get("text") is not None:
        prompt_tokens = _prompt_len(body["text"], "text")
    else:
        raise HTTPError(400, "either 'input_ids' or 'text' is required")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise HTTPError(400, "'sampling_params' must be an object")
    max_tokens = _int(params, "max_new_tokens", 128, 1)  # 128 is SGLang's default
    may_stop, min_tokens = _check_sampling(params, "max_new_tokens", max_tokens)
    stream = _bool(body, "stream")
    return GenRequest(prompt_tokens, max_tokens, stream, False, may_stop=may_stop, min_tokens=min_tokens)
