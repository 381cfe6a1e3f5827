"""The bytes real servers send: one :class:`Renderer` per endpoint, per request.

A renderer turns the engine's progress (tokens in this event, tokens so far, verify steps so far)
into one server-sent event, or into the whole response body. The per-event path is kept to byte
concatenation of pre-encoded pieces (plus one orjson call for SGLang's cumulative events), because
the simulator shares a small box with the load generator and must not become the bottleneck.
``finish`` is None (more to come), ``"length"`` or ``"stop"``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from specload.sim.httpd import StreamHead
from specload.sim.specfields import sglang_spec, vllm_spec
from specload.sim.timing import clock

TOKEN_TEXT = " tok"  # the text of every generated token: one whitespace-separated word per token
DONE_EVENT = b"data: [DONE]\n\n"
MALFORMED_EVENT = b"data: {not json\n\n"
#: Status and headers of every streamed response.
SSE_HEAD = StreamHead(200, [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")])

_TOK = TOKEN_TEXT.encode()
_FINISH = {None: b"null", "length": b'"length"', "stop": b'"stop"'}


class Renderer:
    """Per-request event builder; the stream loop is shared, only the wire format differs."""

    cached_tokens = 0  # prompt tokens the prefix cache served (known once the request is admitted)
    cache_report = (
        False  # OpenAI usage carries prompt_tokens_details.cached_tokens (vLLM/SGLang, when enabled)
    )
    # Speculation (specload.sim.specfields): the draft tokens each verify step accepted so far (None:
    # the engine does not speculate), k, and what the response reports of them: vLLM's
    # metrics.speculative_decoding at this --per-request-spec-decode-metrics level, SGLang's sglext
    # (the request set return_spec_tokens_details on an SGLang-styled server).
    spec_steps: list[int] | None = None
    spec_k = 0
    spec_metrics = "none"
    sglext = False
    continuous_usage = False  # stream_options.continuous_usage_stats: usage in every content event

    def admitted(self) -> bytes | None:
        """Event to send the moment the engine admits the request (vLLM chat: the role-only delta)."""
        return None

    def content(self, n: int, total: int, verify: int, finish: str | None) -> bytes:
        """The event carrying ``n`` new tokens, ``total`` so far after ``verify`` verify steps."""
        raise NotImplementedError

    def usage(self, completion_tokens: int) -> bytes | None:
        """The usage event after the last content event, when the request asked for one."""
        return None

    def tail(self, completion_tokens: int, done: bool) -> bytes:
        """What follows the last content event: the usage event if any, then ``[DONE]`` if ``done``."""
        usage = self.usage(completion_tokens)
        return self.spec_event(completion_tokens) + (usage or b"") + (DONE_EVENT if done else b"")

    def spec_event(self, completion_tokens: int) -> bytes:
        """SGLang's own chunk (``choices: []``, ``sglext``) before the usage chunk; b"" when none."""
        return b""

    def spec_fields(self, completion_tokens: int) -> dict[str, Any]:
        """The whole response's (or the usage chunk's) ``metrics`` / ``sglext``, as the server sends them."""
        steps = self.spec_steps
        if steps is None:
            return {}
        out: dict[str, Any] = {}
        if self.spec_metrics != "none":
            out["metrics"] = {"speculative_decoding": vllm_spec(steps, self.spec_k, self.spec_metrics)}
        if self.sglext:
            verify = len(steps) + 1 if completion_tokens else 0  # the prefill's pass is a verify step
            details = sglang_spec(steps, self.spec_k, completion_tokens, verify)
            out["sglext"] = {"spec_tokens_details": details}
        return out

    def body(self, total: int, verify: int, finish: str) -> dict[str, Any]:
        """The whole (non-streamed) response."""
        raise NotImplementedError


class OpenAIRenderer(Renderer):
    """vLLM's OpenAI events, built from pre-encoded pieces: head + token text + finish + tail."""

    object_name = ""
    text_open = b""
    text_close = b""

    def __init__(
        self, prefix: str, model: str, model_json: bytes, prompt_tokens: int, include_usage: bool
    ) -> None:
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.include_usage = include_usage
        self._envelope = b'{"id":"%s","object":"%s","created":%d,"model":%s' % (
            self.id.encode(),
            self.object_name.encode(),
            self.created,
            model_json,
        )
        self._head = b"data: " + self._envelope + b',"choices":[{"index":0,' + self.text_open

    def _event(self, head: bytes, text: bytes, finish: str | None, total: int) -> bytes:
        """One event: ``head`` (up to the open delta string), ``text``, the finish reason, and the
        running usage when the request asked for it in every chunk (vLLM's continuous_usage_stats)."""
        if self.continuous_usage:
            usage = orjson.dumps(self._usage_dict(total))
            return b"".join((head, text, self.text_close, _FINISH[finish], b'}],"usage":', usage, b"}\n\n"))
        return b"".join((head, text, self.text_close, _FINISH[finish], b"}]}\n\n"))

    def content(self, n: int, total: int, verify: int, finish: str | None) -> bytes:
        return self._event(self._head, _TOK * n, finish, total)

    def spec_event(self, completion_tokens: int) -> bytes:
        if not self.sglext or self.spec_steps is None:
            return b""
        sglext = orjson.dumps(self.spec_fields(completion_tokens)["sglext"])
        return b"data: " + self._envelope + b',"choices":[],"sglext":' + sglext + b"}\n\n"

    def _usage_dict(self, completion_tokens: int) -> dict[str, Any]:
        p = self.prompt_tokens
        usage: dict[str, Any] = {
            "prompt_tokens": p,
            "completion_tokens": completion_tokens,
            "total_tokens": p + completion_tokens,
        }
        if self.cache_report:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return usage

    def usage(self, completion_tokens: int) -> bytes | None:
        if not self.include_usage:
            return None
        usage = orjson.dumps(self._usage_dict(completion_tokens))
        metrics = self.spec_fields(completion_tokens).get("metrics") if self.spec_metrics != "none" else None
        if metrics is not None:  # vLLM: the per-request metrics ride on the final usage chunk
            usage += b',"metrics":' + orjson.dumps(metrics)
        return b"data: " + self._envelope + b',"choices":[],"usage":' + usage + b"}\n\n"

    def _base(self, object_name: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
        }


class CompletionRenderer(OpenAIRenderer):
    """``/v1/completions``."""

    object_name = "text_completion"
    text_open = b'"text":"'
    text_close = b'","logprobs":null,"finish_reason":'

    def __init__(self, model: str, model_json: bytes, prompt_tokens: int, include_usage: bool) -> None:
        super().__init__("cmpl", model, model_json, prompt_tokens, include_usage)

    def body(self, total: int, verify: int, finish: str) -> dict[str, Any]:
        out = self._base("text_completion")
        out["choices"] = [{"index": 0, "text": TOKEN_TEXT * total, "logprobs": None, "finish_reason": finish}]
        out["usage"] = self._usage_dict(total)
        out.update(self.spec_fields(total))
        return out


class ChatRenderer(OpenAIRenderer):
    """``/v1/chat/completions``: a role-only delta at admission, then content deltas."""

    object_name = "chat.completion.chunk"
    text_open = b'"delta":{"content":"'
    text_close = b'"},"logprobs":null,"finish_reason":'

    def __init__(self, model: str, model_json: bytes, prompt_tokens: int, include_usage: bool) -> None:
        super().__init__("chatcmpl", model, model_json, prompt_tokens, include_usage)
        self.reasoning_tokens = 0  # the first tokens streamed as reasoning deltas (reason())
        self.reasoning_field = "reasoning"
        self._reasoning_head = b""
        self._reasoning_sent = 0

    def reason(self, tokens: int, field: str) -> None:
        """Stream the first ``tokens`` tokens as reasoning deltas named ``field`` and count them in
        usage ``completion_tokens_details.reasoning_tokens``, as a server with a reasoning parser does.

        A chunk that crosses the end of the reasoning is split where the reasoning ends, as the
        engines' parsers split the delta that holds the end-of-think marker: vLLM (``reasoning``)
        returns one ``DeltaMessage`` with both ``reasoning`` and ``content``; SGLang
        (``reasoning_content``) yields a ``reasoning_content`` chunk, then a ``content`` chunk."""
        self.reasoning_tokens = tokens
        self._reasoning_head = self._head[: -len(self.text_open)] + b'"delta":{"%s":"' % field.encode()
        self.reasoning_field = field

    def content(self, n: int, total: int, verify: int, finish: str | None) -> bytes:
        think = min(n, self.reasoning_tokens - (total - n))  # this chunk's tokens before the end of thought
        if think <= 0:
            return super().content(n, total, verify, finish)
        self._reasoning_sent += think
        if think == n:
            return self._event(self._reasoning_head, _TOK * n, finish, total)
        answer = _TOK * (n - think)
        if self.reasoning_field == "reasoning":  # vLLM: one delta, both fields
            both = _TOK * think + b'","content":"' + answer
            return self._event(self._reasoning_head, both, finish, total)
        # SGLang: the reasoning chunk, then the answer's
        head = self._event(self._reasoning_head, _TOK * think, None, total - n + think)
        return head + self._event(self._head, answer, finish, total)

    def reasoning_done(self, total: int) -> int:
        """Reasoning tokens among the answer's ``total``: those streamed, else (a whole response) its first."""
        return self._reasoning_sent or min(total, self.reasoning_tokens)

    def _usage_dict(self, completion_tokens: int) -> dict[str, Any]:
        usage = super()._usage_dict(completion_tokens)
        if self.reasoning_tokens:
            usage["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_done(completion_tokens)}
        return usage

    def admitted(self) -> bytes | None:
        return self._head[: -len(self.text_open)] + (
            b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
        )

    def body(self, total: int, verify: int, finish: str) -> dict[str, Any]:
        out = self._base("chat.completion")
        thought = min(total, self.reasoning_tokens)
        message: dict[str, Any] = {"role": "assistant", "content": TOKEN_TEXT * (total - thought)}
        if thought:
            message[self.reasoning_field] = TOKEN_TEXT * thought
        out["choices"] = [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}]
        out["usage"] = self._usage_dict(total)
        out.update(self.spec_fields(total))
        return out


#: An OpenAI endpoint's renderer class: (model, model as JSON, prompt tokens, include_usage) -> renderer.
OpenAIRendererType = Callable[[str, bytes, int, bool], OpenAIRenderer]


class GenerateRenderer(Renderer):
    """SGLang /generate: cumulative text and meta_info in every event."""

    def __init__(self, prompt_tokens: int, t_arrival: float, speculative: bool) -> None:
        self.id = uuid.uuid4().hex
        self.prompt_tokens = prompt_tokens
        self.t_arrival = t_arrival
        self.speculative = speculative

    def _obj(self, total: int, verify: int, finish: str | None) -> dict[str, Any]:
        if finish == "length":
            reason: dict[str, Any] | None = {"type": "length", "length": total}
        elif finish == "stop":
            reason = {"type": "stop", "matched": 0}
        else:
            reason = None
        meta: dict[str, Any] = {
            "id": self.id,
            "finish_reason": reason,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": total,
            "cached_tokens": self.cached_tokens,
        }
        if self.speculative:
            meta["spec_verify_ct"] = verify
            if self.spec_steps is not None and finish is not None:  # (on the last event: O(steps) to make)
                meta.update(sglang_spec(self.spec_steps, self.spec_k, total, verify))
        meta["e2e_latency"] = clock() - self.t_arrival
        return {"text": TOKEN_TEXT * total, "meta_info": meta, "index": 0}

    def content(self, n: int, total: int, verify: int, finish: str | None) -> bytes:
        return b"data: " + orjson.dumps(self._obj(total, verify, finish)) + b"\n\n"

    def body(self, total: int, verify: int, finish: str) -> dict[str, Any]:
        return self._obj(total, verify, finish)
