"""``specload sim``: an OpenAI / vLLM / SGLang look-alike HTTP server whose timing is known exactly.

It exists so the load generator can be tested end to end against figures it must reproduce: the
engine (specload.sim.timing) decides when each token is due, this module only turns the engine's
chunks into the byte formats real servers use and applies the fault switches (specload.sim.faults).

Served by specload.sim.httpd, a minimal HTTP/1.1 server: a streaming response is a generator,
written with chunked transfer encoding one yielded event at a time, so each event leaves the process
the moment it is due. Simultaneous requests are handled one after another, so the engine is given
each request's arrival time (the kernel's receive timestamp, which httpd reads) and counts from it,
not from whenever the request's turn came; what happens before admission is kept short anyway. The
per-event path is kept to byte concatenation (plus one orjson call for SGLang's cumulative events)
because the simulator shares a small box with the load generator and must not become the bottleneck.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import gevent
import orjson
from gevent.event import Event

from specload import __version__
from specload.sim.faults import HTTP_ERROR_STATUSES, FaultInjector, Faults, RequestFaults
from specload.sim.httpd import HTTPServer, Request, Response, Stream, StreamHead
from specload.sim.timing import Engine, FixedEngine, clock

TOKEN_TEXT = " tok"  # the text of every generated token: one whitespace-separated word per token
DONE_EVENT = b"data: [DONE]\n\n"
MALFORMED_EVENT = b"data: {not json\n\n"
DIE_EXIT_CODE = 3  # exit status when the die_after_requests fault fires
METRICS_STYLES = ("sglang", "vllm", "none")

_TOK = TOKEN_TEXT.encode()
_FINISH = {None: b"null", "length": b'"length"', "stop": b'"stop"'}
_SSE = StreamHead(200, [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")])
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
_METRIC_NAMES = {
    "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:"),
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:"),
}

Handler = Callable[[Request], "Response | Stream | None"]


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


# ---------------------------------------------------------------------------------------------------
# Request parsing: every check raises HTTPError(400) naming the problem, before any engine work.


@dataclass(slots=True)
class GenRequest:
    """What the engine and the renderers need from a generation request, whatever the endpoint."""

    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool


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


def _check_sampling(body: dict[str, Any], max_key: str, max_tokens: int) -> None:
    """Accepted-and-ignored sampling fields still get their types checked, as a real server would."""
    _bool(body, "ignore_eos")
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


def parse_completion(body: dict[str, Any], max_model_len: int) -> GenRequest:
    if "prompt" not in body:
        raise HTTPError(400, "'prompt' is required")
    prompt_tokens = _prompt_len(body["prompt"], "prompt")
    max_tokens = _int(body, "max_tokens", 16, 1)  # 16 is the OpenAI / vLLM default
    _check_sampling(body, "max_tokens", max_tokens)
    stream, usage = _stream_flags(body)
    return GenRequest(prompt_tokens, max_tokens, stream, usage)


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


def parse_chat(body: dict[str, Any], max_model_len: int) -> GenRequest:
    if "messages" not in body:
        raise HTTPError(400, "'messages' is required")
    prompt_tokens = _message_words(body["messages"])
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    # vLLM's chat default: whatever room the context leaves.
    max_tokens = _int(body, key, max(1, max_model_len - prompt_tokens), 1)
    _check_sampling(body, key, max_tokens)
    stream, usage = _stream_flags(body)
    return GenRequest(prompt_tokens, max_tokens, stream, usage)


def parse_generate(body: dict[str, Any], max_model_len: int) -> GenRequest:
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
    _check_sampling(params, "max_new_tokens", max_tokens)
    return GenRequest(prompt_tokens, max_tokens, _bool(body, "stream"), False)


# ---------------------------------------------------------------------------------------------------
# Renderers: the bytes of one endpoint's events. finish is None (more to come), "length" or "stop".


class Renderer:
    """Per-request event builder; the stream loop is shared, only the wire format differs."""

    def admitted(self) -> bytes | None:
        """Event to send the moment the engine admits the request (vLLM chat: the role-only delta)."""
        return None

    def content(self, n: int, total: int, verify: int, finish: str | None) -> bytes:
        raise NotImplementedError

    def usage(self, completion_tokens: int) -> bytes | None:
        return None

    def body(self, total: int, verify: int, finish: str) -> dict[str, Any]:
        raise NotImplementedError


class _OpenAIRenderer(Renderer):
    """vLLM's OpenAI events, built from pre-encoded pieces: head + token text + finish + tail."""

    object_name = ""
    text_open = b""
    text_close = b""

    def __init__(self, prefix: str, model: str, model_json: bytes, prompt_tokens: int, include_usage: bool):
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

    def content(self, n: int, total: int, verify: int, finish: str | None) -> bytes:
        return b"".join((self._head, _TOK * n, self.text_close, _FINISH[finish], b"}]}\n\n"))

    def _usage_dict(self, completion_tokens: int) -> dict[str, int]:
        p = self.prompt_tokens
        return {
            "prompt_tokens": p,
            "completion_tokens": completion_tokens,
            "total_tokens": p + completion_tokens,
        }

    def usage(self, completion_tokens: int) -> bytes | None:
        if not self.include_usage:
            return None
        usage = orjson.dumps(self._usage_dict(completion_tokens))
        return b"data: " + self._envelope + b',"choices":[],"usage":' + usage + b"}\n\n"

    def _base(self, object_name: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
        }


class CompletionRenderer(_OpenAIRenderer):
    object_name = "text_completion"
    text_open = b'"text":"'
    text_close = b'","logprobs":null,"finish_reason":'

    def __init__(self, model: str, model_json: bytes, prompt_tokens: int, include_usage: bool):
        super().__init__("cmpl", model, model_json, prompt_tokens, include_usage)

    def body(self, total: int, verify: int, finish: str) -> dict[str, Any]:
        out = self._base("text_completion")
        out["choices"] = [{"index": 0, "text": TOKEN_TEXT * total, "logprobs": None, "finish_reason": finish}]
        out["usage"] = self._usage_dict(total)
        return out


class ChatRenderer(_OpenAIRenderer):
    object_name = "chat.completion.chunk"
    text_open = b'"delta":{"content":"'
    text_close = b'"},"logprobs":null,"finish_reason":'

    def __init__(self, model: str, model_json: bytes, prompt_tokens: int, include_usage: bool):
        super().__init__("chatcmpl", model, model_json, prompt_tokens, include_usage)

    def admitted(self) -> bytes | None:
        return self._head[: -len(self.text_open)] + (
            b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
        )

    def body(self, total: int, verify: int, finish: str) -> dict[str, Any]:
        out = self._base("chat.completion")
        message = {"role": "assistant", "content": TOKEN_TEXT * total}
        out["choices"] = [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}]
        out["usage"] = self._usage_dict(total)
        return out


class GenerateRenderer(Renderer):
    """SGLang /generate: cumulative text and meta_info in every event."""

    def __init__(self, prompt_tokens: int, t_arrival: float, speculative: bool):
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
            "cached_tokens": 0,
        }
        if self.speculative:
            meta["spec_verify_ct"] = verify
        meta["e2e_latency"] = clock() - self.t_arrival
        return {"text": TOKEN_TEXT * total, "meta_info": meta, "index": 0}

    def content(self, n: int, total: int, verify: int, finish: str | None) -> bytes:
        return b"data: " + orjson.dumps(self._obj(total, verify, finish)) + b"\n\n"

    def body(self, total: int, verify: int, finish: str) -> dict[str, Any]:
        return self._obj(total, verify, finish)


# ---------------------------------------------------------------------------------------------------
# Fault application on the wire.


class _Mishaps:
    """Tracks one request's mid-stream faults against the running token count."""

    def __init__(self, plan: RequestFaults, target: int) -> None:
        self.cut_after = plan.cut_after
        self.stall_after = plan.stall_after
        self.stall_s = plan.stall_s
        self.malformed_at = max(1, target // 2) if plan.malformed else None

    @property
    def idle(self) -> bool:
        """Nothing left to do for this request (the fast path may then batch its last writes)."""
        return self.cut_after is None and self.stall_after is None and self.malformed_at is None

    def after(self, sent: int) -> tuple[bytes | None, bool]:
        """Called after each event; returns (extra event to send, whether to cut now).

        A stall only holds this request's bytes back: the engine's deadlines are absolute, so chunks
        that came due meanwhile go out back to back afterwards, as after a network hiccup.
        """
        extra = None
        if self.malformed_at is not None and sent >= self.malformed_at:
            extra, self.malformed_at = MALFORMED_EVENT, None
        if self.cut_after is not None and sent >= self.cut_after:
            return extra, True
        if self.stall_after is not None and sent >= self.stall_after:
            self.stall_after = None
            gevent.sleep(self.stall_s)
        return extra, False


# ---------------------------------------------------------------------------------------------------
# The application.


class SimApp:
    """The httpd app: routing, validation, streaming, metrics. Timing is entirely the engine's."""

    def __init__(
        self,
        engine: Engine,
        model: str = "specload-sim",
        max_model_len: int = 8192,
        metrics_style: str = "sglang",
        faults: Faults | None = None,
    ) -> None:
        if metrics_style not in METRICS_STYLES:
            raise ValueError(f"metrics_style must be one of {METRICS_STYLES}")
        self.engine = engine
        self.model = model
        self.max_model_len = max_model_len
        self.metrics_style = metrics_style
        self.faults = faults or Faults()
        self.injector = FaultInjector(self.faults)
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self._model_json = orjson.dumps(model)
        self._routes: dict[str, tuple[str, Handler]] = {
            "/health": ("GET", self._health),
            "/v1/models": ("GET", self._models),
            "/v1/completions": ("POST", self._completions),
            "/v1/chat/completions": ("POST", self._chat),
            "/generate": ("POST", self._generate),
        }
        if metrics_style != "none":
            self._routes["/metrics"] = ("GET", self._metrics)
            self._routes["/get_server_info"] = ("GET", self._server_info)
            self._routes["/server_info"] = ("GET", self._server_info)

    def __call__(self, request: Request) -> Response | Stream | None:
        path = request.path
        route = self._routes.get(path)
        try:
            if route is None:
                raise HTTPError(404, f"Not found: {path}")
            method, handler = route
            if request.method != method:
                raise HTTPError(405, f"Method {request.method} not allowed on {path}")
            return handler(request)
        except HTTPError as e:
            return Response(e.status, error_body(e.status, e.message))

    @staticmethod
    def _json(obj: Any) -> Response:
        return Response(200, orjson.dumps(obj))

    # -- informational endpoints ---------------------------------------------------------------------

    def _health(self, request: Request) -> Response:
        return Response(200, b"ok", "text/plain; charset=utf-8")

    def _models(self, request: Request) -> Response:
        card = {
            "id": self.model,
            "object": "model",
            "owned_by": "specload-sim",
            "max_model_len": self.max_model_len,
        }
        return self._json({"object": "list", "data": [card]})

    def server_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "model_path": self.model,
            "served_model_name": self.model,
            "context_length": self.max_model_len,
            "version": f"specload-sim {__version__}",
            "simulated": True,
        }
        info.update(self.engine.server_info())
        info["sim_faults"] = asdict(self.faults)
        state = {"num_running_reqs": self.engine.running, "num_queue_reqs": self.engine.queued}
        state.update(self.engine.internal_state())  # e.g. the effective running cap
        info["internal_states"] = [state]
        return info

    def _server_info(self, request: Request) -> Response:
        return self._json(self.server_info())

    def metrics_text(self) -> str:
        running, waiting, prefix = _METRIC_NAMES[self.metrics_style]
        label = self.model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        rows = [
            (running, "gauge", "Number of requests running now.", self.engine.running),
            (waiting, "gauge", "Number of requests waiting for a slot.", self.engine.queued),
            (prefix + "prompt_tokens_total", "counter", "Prompt tokens admitted.", self.prompt_tokens_total),
            (
                prefix + "generation_tokens_total",
                "counter",
                "Tokens generated.",
                self.generation_tokens_total,
            ),
        ]
        c = self.engine.spec_counters()
        if c is not None:
            if self.metrics_style == "vllm":  # vLLM's names, which specload's sampler reads
                rows += [
                    (prefix + "spec_decode_num_drafts_total", "counter", "Verify steps (one per request per step).", c.num_drafts),
                    (prefix + "spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.", c.num_draft_tokens),
                    (prefix + "spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.", c.num_accepted_tokens),
                ]  # fmt: skip
            else:  # SGLang's gauge; here the average since start, bonus token included (0 before any step)
                accept = c.accept_length or 0.0
                rows.append((prefix + "spec_accept_length", "gauge", "Tokens per verify step.", accept))
        lines = []
        for name, kind, help_text, value in rows:
            lines += [
                f"# HELP {name} {help_text}",
                f"# TYPE {name} {kind}",
                f'{name}{{model_name="{label}"}} {value}',
            ]
        return "\n".join(lines) + "\n"

    def _metrics(self, request: Request) -> Response:
        body = self.metrics_text().encode()
        return Response(200, body, "text/plain; version=0.0.4; charset=utf-8")

    # -- generation endpoints ----------------------------------------------------------------------------

    @staticmethod
    def _body(request: Request) -> dict[str, Any]:
        try:
            body = orjson.loads(request.body)
        except orjson.JSONDecodeError as e:
            raise HTTPError(400, f"Invalid JSON body: {e}") from None
        if not isinstance(body, dict):
            raise HTTPError(400, "The request body must be a JSON object")
        return body

    def _check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.model:
            raise HTTPError(404, f"The model `{model}` does not exist.")

    def _check_context(self, req: GenRequest) -> None:
        total = req.prompt_tokens + req.max_tokens
        if total > self.max_model_len:
            raise HTTPError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                f"requested {total} tokens ({req.prompt_tokens} in the messages, {req.max_tokens} in "
                f"the completion). Please reduce the length of the messages or completion.",
            )

    def _completions(self, request: Request) -> Response | Stream | None:
        return self._openai(request, parse_completion, CompletionRenderer)

    def _chat(self, request: Request) -> Response | Stream | None:
        return self._openai(request, parse_chat, ChatRenderer)

    def _openai(self, request: Request, parse: Any, renderer: Any) -> Response | Stream | None:
        """The OpenAI endpoints differ only in how the body is read and how events are written."""
        body = self._body(request)
        self._check_model(body)
        req = parse(body, self.max_model_len)
        return self._serve(request, req, renderer(self.model, self._model_json, req.prompt_tokens, req.include_usage))

    def _generate(self, request: Request) -> Response | Stream | None:
        req = parse_generate(self._body(request), self.max_model_len)
        r = GenerateRenderer(req.prompt_tokens, request.arrived, self.engine.speculative)
        return self._serve(request, req, r)

    def _serve(self, request: Request, req: GenRequest, r: Renderer) -> Response | Stream | None:
        self._check_context(req)
        plan = self.injector.next_request()
        if plan.http_error is not None:
            status = plan.http_error
            msg = f"simulated fault: HTTP {status} on request {self.injector.requests}"
            return Response(status, error_body(status, msg))
        target = max(0, req.max_tokens - plan.short_by)
        finish = "length" if target == req.max_tokens else "stop"
        if req.stream:
            # httpd sends the status line and headers before asking for the first event, so they go
            # out before the request queues for a slot, as Starlette-based servers do.
            return Stream(_SSE, self._stream(request, req, r, plan, target, finish))
        return self._whole(request, req, r, plan, target, finish)

    def _admit(self, req: GenRequest) -> None:
        if self.injector.on_admit():
            sys.stderr.write(
                f"specload-sim: fault die_after_requests={self.faults.die_after_requests} reached, exiting\n"
            )
            sys.stderr.flush()
            os._exit(DIE_EXIT_CODE)
        self.prompt_tokens_total += req.prompt_tokens

    def _stream(
        self,
        request: Request,
        req: GenRequest,
        r: Renderer,
        plan: RequestFaults,
        target: int,
        finish: str,
    ) -> Iterator[bytes]:
        # The engine counts from the request's arrival, not from when this generator got its turn.
        chunks = self.engine.generate(req.prompt_tokens, target, arrival=request.arrived)
        mishaps = _Mishaps(plan, target)
        sent = verify = 0
        try:
            next(chunks)  # ADMITTED; blocks while queued
            self._admit(req)
            event = r.admitted()
            if event is not None:
                yield event
            extra, cut = mishaps.after(0)
            if cut:
                request.abort()
                return
            for chunk in chunks:
                sent += chunk.tokens
                verify += chunk.verify_steps
                self.generation_tokens_total += chunk.tokens
                event = r.content(chunk.tokens, sent, verify, finish if sent >= target else None)
                if sent >= target and mishaps.idle:
                    # One write (one syscall) for the last event and its usage / [DONE] tail.
                    yield event + self._tail(r, plan, sent)
                    return
                yield event
                extra, cut = mishaps.after(sent)
                if extra is not None:
                    yield extra
                if cut:
                    request.abort()
                    return
            if target == 0:
                yield r.content(0, 0, 0, finish)
            tail = self._tail(r, plan, sent)
            if tail:
                yield tail
        finally:
            chunks.close()  # frees the engine slot when the client went away mid-stream

    @staticmethod
    def _tail(r: Renderer, plan: RequestFaults, sent: int) -> bytes:
        usage = r.usage(sent)
        return (usage or b"") + (b"" if plan.omit_done else DONE_EVENT)

    def _whole(
        self,
        request: Request,
        req: GenRequest,
        r: Renderer,
        plan: RequestFaults,
        target: int,
        finish: str,
    ) -> Response | None:
        chunks = self.engine.generate(req.prompt_tokens, target, arrival=request.arrived)
        mishaps = _Mishaps(plan, target)
        sent = verify = 0
        cut = False
        try:
            next(chunks)
            self._admit(req)
            _, cut = mishaps.after(0)
            if not cut:
                for chunk in chunks:
                    sent += chunk.tokens
                    verify += chunk.verify_steps
                    self.generation_tokens_total += chunk.tokens
                    _, cut = mishaps.after(sent)
                    if cut:
                        break
        finally:
            chunks.close()
        if cut:
            request.abort()  # no response at all
            return None
        if plan.malformed:
            return Response(200, b"{not json")
        return self._json(r.body(sent, verify, finish))


# ---------------------------------------------------------------------------------------------------
# Server process.


# Paths that need the API key when one is set (as vLLM's --api-key guards /v1): generation and models.
_KEYED_PATHS = ("/v1/", "/generate")


def _auth_error(message: str) -> Response:
    err = {"message": message, "type": "AuthenticationError", "param": None, "code": 401}
    return Response(401, orjson.dumps({"error": err}))


def require_api_key(app: Handler, api_key: str) -> Handler:
    """``app`` behind ``Authorization: Bearer <api_key>``; 401 otherwise. The key is never echoed."""
    import hmac

    expected = api_key.encode()

    def guarded(request: Request) -> Response | Stream | None:
        if request.path.startswith(_KEYED_PATHS):
            value = request.authorization
            if value is None:
                return _auth_error("Missing API key: send it in an 'Authorization: Bearer <key>' header")
            scheme, _, token = value.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), expected):
                return _auth_error("Incorrect API key provided")
        return app(request)

    return guarded


def tls_context(cert_file: str, key_file: str) -> Any:
    """A server-side TLS context holding the certificate and key.

    gevent's own SSLContext class: ``gevent.ssl.create_default_context`` is the standard library's
    and makes blocking sockets, one of which idle on keep-alive would stall the whole server.
    """
    import gevent.ssl

    ctx = gevent.ssl.SSLContext(gevent.ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert_file, key_file)
    return ctx


def make_server(
    app: SimApp,
    host: str = "127.0.0.1",
    port: int = 0,
    access_log: bool = False,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    api_key: str | None = None,
) -> HTTPServer:
    """A bound-on-start server for ``app``; ``port=0`` picks a free port (see ``server_port``).

    ``tls_cert`` + ``tls_key`` (PEM files): serve https. ``api_key``: generation and model endpoints
    answer 401 unless the request carries ``Authorization: Bearer <api_key>``.
    """
    handler: Handler = app if not api_key else require_api_key(app, api_key)
    return HTTPServer(
        (host, port),
        handler,
        clock=clock,  # Request.arrived on the engine's clock
        error_body=error_body,
        log=sys.stderr if access_log else None,
        backlog=1024,
        ssl_context=tls_context(tls_cert, tls_key) if tls_cert and tls_key else None,
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specload sim",
        description="Simulated LLM inference server (OpenAI / vLLM / SGLang endpoints) with exactly known timing.",
    )
    a = p.add_argument
    a("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    a("--port", type=int, default=30000, help="port to bind; 0 picks a free one (default 30000)")
    a("--model", default="specload-sim", help="served model name (default specload-sim)")
    a("--max-model-len", type=int, default=8192, help="context length; longer requests get HTTP 400")
    a("--metrics-style", choices=METRICS_STYLES, default="sglang", help="/metrics gauge names; none = 404")
    a("--access-log", action="store_true", help="log every request to stderr")
    t = p.add_argument_group(
        "timing",
        "--engine fixed (default): fixed TTFT and ITL behind --max-running (the flags below). --engine batch: "
        "continuous batching with optional speculative decoding, parameters from --preset (docs/simulator.md).",
    )
    t.add_argument("--engine", choices=("fixed", "batch"), default="fixed", help="timing model")
    t.add_argument(
        "--preset",
        default=None,
        help="batch engine parameters: baseline, mtp, or a TOML file of them (default baseline)",
    )
    t.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="batch engine: override one preset parameter (a TOML value), e.g. spec_max_running_requests=128",
    )
    t.add_argument("--ttft-ms", type=float, default=50.0, help="time to first token after admission")
    t.add_argument("--itl-ms", type=float, default=10.0, help="time between tokens")
    t.add_argument("--prefill-us-per-token", type=float, default=0.0, help="extra TTFT per prompt token")
    t.add_argument("--max-running", type=int, default=48, help="running-request cap; the rest queue FIFO")
    t.add_argument("--tokens-per-chunk", type=int, default=1, help="tokens per stream event after the first")
    t.add_argument("--time-scale", type=float, default=1.0, help="multiply every engine duration")
    f = p.add_argument_group(
        "faults",
        "Each fault hits every Nth generation request (--fault-X-every), else a random fraction "
        "(--fault-X-rate), else the --fault-every / --fault-rate defaults, else every request.",
    )
    fa = f.add_argument
    fa("--fault-every", type=int, default=0, help="default every-Nth for the faults below")
    fa("--fault-rate", type=float, default=0.0, help="default probability for the faults below")
    fa("--fault-seed", type=int, default=0, help="seed of the fault RNG")
    fa(
        "--fault-http-status",
        type=int,
        choices=HTTP_ERROR_STATUSES,
        default=0,
        help="answer with this status",
    )
    fa("--fault-http-every", type=int, default=None)
    fa("--fault-http-rate", type=float, default=None)
    fa("--fault-cut-after", type=int, default=None, metavar="K", help="drop the connection after K tokens")
    fa("--fault-cut-every", type=int, default=None)
    fa("--fault-cut-rate", type=float, default=None)
    fa("--fault-stall-after", type=int, default=None, metavar="K", help="stop sending after K tokens ...")
    fa("--fault-stall-s", type=float, default=1.0, help="... for this many seconds (default 1, unscaled)")
    fa("--fault-stall-every", type=int, default=None)
    fa("--fault-stall-rate", type=float, default=None)
    fa("--fault-malformed-every", type=int, default=0, help="every Nth stream gets 'data: {not json' mid-way")
    fa("--fault-malformed-rate", type=float, default=0.0)
    fa("--fault-omit-done", action="store_true", help="end streams without 'data: [DONE]'")
    fa("--fault-omit-done-every", type=int, default=None)
    fa("--fault-omit-done-rate", type=float, default=None)
    fa("--fault-short-by", type=int, default=0, metavar="N", help="finish N tokens short (honest usage)")
    fa("--fault-short-every", type=int, default=None)
    fa("--fault-short-rate", type=float, default=None)
    fa("--fault-die-after", type=int, default=0, metavar="N", help="exit the process at the Nth admission")
    s = p.add_argument_group("server", "TLS and API key, as a production server would have them.")
    s.add_argument(
        "--tls-cert", default=None, metavar="FILE", help="PEM certificate: serve https (with --tls-key)"
    )
    s.add_argument("--tls-key", default=None, metavar="FILE", help="PEM private key of --tls-cert")
    s.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on /v1/* and /generate (else HTTP 401)",
    )
    return p


def build_engine(args: argparse.Namespace) -> Engine:
    if args.engine == "batch":
        from specload.sim.batch import BatchEngine

        return BatchEngine.from_preset(args.preset or "baseline", args.param, time_scale=args.time_scale)
    if args.preset is not None or args.param:
        raise ValueError("--preset and --param need --engine batch")
    return FixedEngine(
        ttft_s=args.ttft_ms / 1e3,
        itl_s=args.itl_ms / 1e3,
        max_running=args.max_running,
        prefill_per_token_s=args.prefill_us_per_token / 1e6,
        tokens_per_chunk=args.tokens_per_chunk,
        time_scale=args.time_scale,
    )


def build_faults(args: argparse.Namespace) -> Faults:
    def sel(every: int | None, rate: float | None) -> tuple[int, float]:
        if every is not None or rate is not None:
            return every or 0, rate or 0.0
        return args.fault_every, args.fault_rate

    http_every, http_rate = sel(args.fault_http_every, args.fault_http_rate)
    cut_every, cut_rate = sel(args.fault_cut_every, args.fault_cut_rate)
    stall_every, stall_rate = sel(args.fault_stall_every, args.fault_stall_rate)
    done_every, done_rate = sel(args.fault_omit_done_every, args.fault_omit_done_rate)
    short_every, short_rate = sel(args.fault_short_every, args.fault_short_rate)
    faults = Faults(
        http_error_status=args.fault_http_status,
        http_error_every=http_every,
        http_error_rate=http_rate,
        cut_after_tokens=args.fault_cut_after,
        cut_every=cut_every,
        cut_rate=cut_rate,
        stall_after_tokens=args.fault_stall_after,
        stall_s=args.fault_stall_s,
        stall_every=stall_every,
        stall_rate=stall_rate,
        malformed_every=args.fault_malformed_every,
        malformed_rate=args.fault_malformed_rate,
        omit_done=args.fault_omit_done,
        omit_done_every=done_every,
        omit_done_rate=done_rate,
        short_by=args.fault_short_by,
        short_every=short_every,
        short_rate=short_rate,
        die_after_requests=args.fault_die_after,
        seed=args.fault_seed,
    )
    faults.validate()
    return faults


def main(argv: list[str] | None = None) -> int:
    """Run the simulator until SIGTERM / SIGINT; prints one 'listening' line for parent processes."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        engine = build_engine(args)
        faults = build_faults(args)
        app = SimApp(engine, args.model, args.max_model_len, args.metrics_style, faults)
    except ValueError as e:
        parser.error(str(e))
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    if args.api_key is not None and not args.api_key:
        parser.error("--api-key must not be empty")
    try:
        server = make_server(
            app, args.host, args.port, args.access_log, args.tls_cert, args.tls_key, args.api_key
        )
    except OSError as e:  # unreadable or mismatched certificate / key (ssl.SSLError is an OSError)
        parser.error(f"cannot load --tls-cert {args.tls_cert} / --tls-key {args.tls_key}: {e}")
    try:
        server.start()
    except OSError as e:
        print(f"specload-sim: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    # Handlers first: a parent may send SIGTERM the moment it reads the listening line.
    stop = Event()
    handlers = [gevent.signal_handler(sig, stop.set) for sig in (signal.SIGTERM, signal.SIGINT)]
    host = f"[{args.host}]" if ":" in args.host else args.host
    scheme = "https" if server.ssl_enabled else "http"
    print(f"specload-sim listening on {scheme}://{host}:{server.server_port}", flush=True)
    try:
        stop.wait()
    finally:
        for h in handlers:
            h.cancel()
        server.stop(timeout=0.5)
    return 0
