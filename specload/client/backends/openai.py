"""OpenAI-compatible ``/v1/completions`` (vLLM, SGLang, TGI, llama.cpp, ...).

The prompt is a list of token ids, so the input length is exact. ``ignore_eos`` plus
``min_tokens`` ask the server for exactly ``max_tokens`` tokens; ``include_usage`` makes it send
its own token counts in a final event, which is where the output count comes from.
"""

from __future__ import annotations

from typing import Any

from specload.client.backends.base import Backend, Prompt, StreamParser, as_text, register
from specload.core.records import SRC_USAGE


class CompletionsParser(StreamParser):
    __slots__ = ()

    def choice(self, ev: dict[str, Any]) -> dict[str, Any] | None:
        """The event's first choice (None for a usage-only event), after taking usage and finish reason."""
        usage = ev.get("usage")
        if usage:
            self.take_usage(usage)
            timings = ev.get("timings")
            if timings:
                self.take_timings(timings)
        choices = ev.get("choices")
        if not choices:
            return None
        choice = choices[0]
        fr = choice.get("finish_reason")
        if fr:
            self.finish_reason = fr
        return choice

    def take_timings(self, timings: dict[str, Any]) -> None:
        """llama.cpp's per-request ``timings``: with a draft model, ``draft_n_accepted`` tokens came free.

        Each decode step yields its accepted draft tokens plus one of its own, so the steps taken
        (SGLang's ``spec_verify_ct``) are the tokens minus the accepted ones, and tokens per step is
        the acceptance length, as for SGLang.
        """
        accepted = timings.get("draft_n_accepted")
        if timings.get("draft_n") and isinstance(accepted, int) and isinstance(self.output_tokens, int):
            self.spec_verify_ct = self.output_tokens - accepted

    def read(self, ev: dict[str, Any]) -> int:
        choice = self.choice(ev)
        if choice is None:
            return 0
        # Every choice event is one decode step, even when its text is empty (a token can be
        # half a UTF-8 character); an event that only closes the stream carries no token.
        text = choice.get("text")
        if self.text is not None and text:
            self.text.append(text)
        return 0 if choice.get("finish_reason") and not text else 1


@register
class OpenAICompletions(Backend):
    name = "openai"
    path = "/v1/completions"
    token_source = SRC_USAGE

    def body(
        self, prompt: Prompt, max_tokens: int, model: str | None, temperature: float, extra: dict[str, Any]
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            **self.prompt_fields(prompt),
            "max_tokens": max_tokens,
            "min_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        body.update(extra)
        return body

    def prompt_fields(self, prompt: Prompt) -> dict[str, Any]:
        return {"prompt": as_text(prompt)}

    def parser(self) -> StreamParser:
        return CompletionsParser()
