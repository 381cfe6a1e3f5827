"""OpenAI-compatible ``/v1/chat/completions``, for servers that only speak chat.

The prompt is text sized to about N tokens; the real input length is whatever the server
counts (``usage.prompt_tokens``, chat template included) and is reported as such. The first
event of a chat stream is role-only (``{"role": "assistant", "content": ""}``): it is sent
before any token is generated, so it is not the first token.

A reasoning model's deltas carry ``reasoning`` (vLLM since it renamed the field, OpenRouter) or
``reasoning_content`` (SGLang, older vLLM) before its answer's ``content``: they are output tokens
(TTFT is the first of any kind) but not the answer, so they are counted apart (``reasoning_events``)
and flagged, and the answer's first token is the first content delta after them.
"""

from __future__ import annotations

from typing import Any

from specload.client.backends.base import Prompt, StreamParser, register
from specload.client.backends.openai import CompletionsParser, OpenAICompletions


class ChatParser(CompletionsParser):
    __slots__ = ()

    def read(self, ev: dict[str, Any]) -> int:
        before = self.output_tokens
        choice = self.choice(ev)
        if choice is None:
            return 0
        delta = choice.get("delta") or {}
        content = delta.get("content")
        if delta.get("reasoning") or delta.get("reasoning_content"):
            self.reasoning_events += 1
            if not content:
                self.in_reasoning = True
                return self.tokens_of(ev, before)
            # vLLM's parser returns the delta that ends the reasoning with both fields: the answer
            # begins in it
        if content is None:
            return 0
        if content == "" and ("role" in delta or choice.get("finish_reason")):
            return 0  # role-only opening event, or a closing event with no token
        self.in_reasoning = False
        if self.text is not None:
            self.text.append(content)
        return self.tokens_of(ev, before)


@register
class ChatCompletions(OpenAICompletions):
    name = "chat"
    path = "/v1/chat/completions"
    takes_token_ids = False

    def prompt_fields(self, prompt: Prompt) -> dict[str, Any]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            return {"messages": prompt}  # a dataset's own conversation
        return {"messages": [{"role": "user", "content": prompt}]}

    def parser(self) -> StreamParser:
        return ChatParser()
