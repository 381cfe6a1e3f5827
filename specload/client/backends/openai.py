"""OpenAI-compatible ``/v1/completions`` (vLLM, SGLang, TGI, llama.cpp, ...).

The prompt is a list of token ids, so the input length is exact. ``ignore_eos`` plus
``min_tokens`` ask the server for exactly ``max_tokens`` tokens (left out in natural mode, where
``max_tokens`` is the cap); ``include_usage`` makes it send
its own token counts in a final event, which is where the output count comes from.
"""

from __future__ import annotations

from typing import Any

from specload.client.backends.base import Backend, Prompt, StreamParser, as_text, register
from specload.client.backends.spec import take_sglang, take_vllm
from specload.core.records import SPEC_LLAMACPP, SPEC_SGLEXT, SRC_USAGE


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
            metrics = ev.get("metrics")  # vLLM: the final usage chunk carries the per-request metrics
            if metrics:
                take_vllm(self, metrics.get("speculative_decoding"))
            sglext = ev.get("sglext")  # SGLang: a chunk of its own before the usage chunk
            if sglext:
                take_sglang(self, sglext.get("spec_tokens_details"), SPEC_SGLEXT)
            return None
        choice = choices[0]
        fr = choice.get("finish_reason")
        if fr:
            self.finish_reason = fr
        return choice

    def take_timings(self, timings: dict[str, Any]) -> None:
        """llama.cpp's per-request ``timings``: ``draft_n`` tokens drafted, ``draft_n_accepted`` accepted.

        They do not say how many steps drafted (llama.cpp keeps that count per slot, and only its
        /metrics ``spec_decode_num_drafts_total`` tells it), so ``spec_verify_ct`` stays unset: the
        acceptance length comes from those counters, while the rate and the tokens per target pass
        come from these two counts (docs/metrics.md).
        """
        accepted = timings.get("draft_n_accepted")
        drafted = timings.get("draft_n")
        if type(drafted) is int and drafted > 0 and type(accepted) is int and accepted >= 0:
            self.spec_accepted = accepted
            self.spec_drafted = drafted
            self.spec_source = SPEC_LLAMACPP

    def tokens_of(self, ev: dict[str, Any], before: int | None) -> int:
        """Tokens a content event carried: the change of the running completion_tokens when the event
        has one (vLLM's ``stream_options.continuous_usage_stats``), else 1 (a decode step's event).

        Several tokens per event is what speculation does (a step's accepted drafts and its bonus
        token in one event), so counting them keeps ITL per token. One event without a running
        count makes the whole stream's ITL per event (``counted_events`` False)."""
        usage = ev.get("usage")
        if self.counted_events is not False and usage and type(usage.get("completion_tokens")) is int:
            self.counted_events = True
            n = (self.output_tokens or 0) - (before or 0)
            return n if n > 0 else 0
        self.counted_events = False
        return 1

    def read(self, ev: dict[str, Any]) -> int:
        before = self.output_tokens
        choice = self.choice(ev)
        if choice is None:
            return 0
        # Every choice event is one decode step, even when its text is empty (a token can be
        # half a UTF-8 character); an event that only closes the stream carries no token.
        text = choice.get("text")
        if self.text is not None and text:
            self.text.append(text)
        closing = choice.get("finish_reason") and not text
        if closing and (not self.counted_events or (self.output_tokens or 0) == (before or 0)):
            return 0  # closes the stream without a token
        return self.tokens_of(ev, before)


@register
class OpenAICompletions(Backend):
    name = "openai"
    path = "/v1/completions"
    token_source = SRC_USAGE
    spec_fields = "vLLM metrics.speculative_decoding, SGLang sglext.spec_tokens_details or llama.cpp timings"

    def body(
        self,
        prompt: Prompt,
        max_tokens: int,
        model: str | None,
        temperature: float,
        extra: dict[str, Any],
        natural: bool = False,
    ) -> dict[str, Any]:
        forced = {} if natural else {"min_tokens": max_tokens, "ignore_eos": True}
        body: dict[str, Any] = {
            "model": model,
            **self.prompt_fields(prompt),
            "max_tokens": max_tokens,
            **forced,
            "temperature": temperature,
            "stream": True,
            # continuous_usage_stats: a running completion_tokens in every event (vLLM, SGLang), so
            # ITL is per token; return_spec_tokens_details: SGLang's per-request acceptance (sglext).
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "return_spec_tokens_details": True,
        }
        body.update(extra)
        return body

    def prompt_fields(self, prompt: Prompt) -> dict[str, Any]:
        return {"prompt": as_text(prompt)}

    def parser(self) -> StreamParser:
        return CompletionsParser()
