"""OpenAI-compatible ``/v1/chat/completions``, for servers that only speak chat.

The prompt is text sized to about N tokens; the real input length is whatever the server
counts (``usage.prompt_tokens``, chat template included) and is reported as such. The first
event of a chat stream is role-only (``{"role": "assistant", "content": ""}``): it is sent
before any token is generated, so it is not the first token.
"""

from __future__ import annotations

from typing import Any

import orjson

from specload.backends.base import Backend, MalformedEvent, StreamParser
from specload.records import SRC_USAGE


class ChatParser(StreamParser):
    __slots__ = ()

    def feed(self, payload: bytes) -> int:
        try:
            ev = orjson.loads(payload)
            if "error" in ev:
                self.take_error(ev)
                return 0
            usage = ev.get("usage")
            if usage:
                self.take_usage(usage)
            choices = ev.get("choices")
            if not choices:
                return 0
            choice = choices[0]
            fr = choice.get("finish_reason")
            if fr:
                self.finish_reason = fr
            delta = choice.get("delta") or {}
            content = delta.get("content")
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        except (orjson.JSONDecodeError, AttributeError, TypeError) as e:
            raise MalformedEvent(str(e)) from None
        if reasoning:
            return 1
        if content is None:
            return 0
        if content == "" and ("role" in delta or fr):
            return 0  # role-only opening event, or a closing event with no token
        return 1


class ChatCompletions(Backend):
    name = "chat"
    path = "/v1/chat/completions"
    token_source = SRC_USAGE
    takes_token_ids = False

    def body(
        self, prompt: list[int] | str, max_tokens: int, model: str | None, temperature: float, extra: dict[str, Any]
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "min_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        body.update(extra)
        return body

    def parser(self) -> StreamParser:
        return ChatParser()
