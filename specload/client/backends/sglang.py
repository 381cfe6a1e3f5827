"""SGLang native ``/generate``.

SGLang streams cumulative text by default, so tokens are never counted from text: each event's
``meta_info.completion_tokens`` is the server's running count, and the difference to the
previous event is how many tokens that event carried (several per event on speculative servers,
which accept a draft's tokens together). ``spec_verify_ct`` (verify steps) gives the
acceptance length: completion_tokens / spec_verify_ct.
"""

from __future__ import annotations

from typing import Any

from specload.client.backends.base import Backend, Prompt, StreamParser, as_text, count, register
from specload.client.backends.spec import take_sglang
from specload.core.records import SPEC_SGLANG_META, SRC_META


class GenerateParser(StreamParser):
    __slots__ = ()

    def read(self, ev: dict[str, Any]) -> int:
        meta = ev["meta_info"]
        n = count(meta["completion_tokens"], "completion_tokens")
        if n is None:
            raise TypeError("completion_tokens is null")
        self.prompt_tokens = count(meta.get("prompt_tokens", self.prompt_tokens), "prompt_tokens")
        cached = meta.get("cached_tokens")
        if type(cached) is int:
            self.cached_tokens = cached
        if self.text is not None and isinstance(ev.get("text"), str):
            self.text[:] = [ev["text"]]  # cumulative: the last event's text is the whole answer
        svc = meta.get("spec_verify_ct")
        if type(svc) is int and svc > 0:  # anything else is no count: the figure is left out, not the request
            self.spec_verify_ct = svc
            take_sglang(self, meta, SPEC_SGLANG_META)
        fr = meta.get("finish_reason")
        if fr:
            self.finish_reason = fr.get("type", str(fr)) if isinstance(fr, dict) else str(fr)
        new = n - (self.output_tokens or 0)
        self.output_tokens = n
        return new if new > 0 else 0


@register
class SGLangGenerate(Backend):
    name = "sglang"
    path = "/generate"
    spec_fields = "meta_info.spec_verify_ct"
    token_source = SRC_META
    counts_tokens_per_event = True  # meta_info.completion_tokens deltas
    needs_model = False  # /generate serves the one model the server was started with

    def body(
        self,
        prompt: Prompt,
        max_tokens: int,
        model: str | None,
        temperature: float,
        extra: dict[str, Any],
        natural: bool = False,
    ) -> dict[str, Any]:
        sampling: dict[str, Any] = {"max_new_tokens": max_tokens, "temperature": temperature}
        if not natural:
            sampling["ignore_eos"] = True
        body: dict[str, Any] = {"stream": True, "sampling_params": sampling}
        prompt = as_text(prompt)
        if isinstance(prompt, str):
            body["text"] = prompt
        else:
            body["input_ids"] = prompt
        for k, v in extra.items():
            if k == "sampling_params" and isinstance(v, dict):
                sampling.update(v)
            else:
                body[k] = v
        return body

    def parser(self) -> StreamParser:
        return GenerateParser()
