"""The simulator's HTTP application: routing, the generation endpoints and the fault switches.

The engine (specload.sim.timing) decides when each token is due; this module only drives it, hands
its progress to the endpoint's renderer (specload.sim.render) and applies the faults a request was
picked for (specload.sim.faults). One engine loop serves both response kinds: a streamed response
writes an event per chunk as it comes, a whole one waits for the last chunk.

Served by specload.sim.httpd, a minimal HTTP/1.1 server: a streaming response is a generator,
written with chunked transfer encoding one yielded event at a time, so each event leaves the process
the moment it is due. Simultaneous requests are handled one after another, so the engine is given
each request's arrival time (the kernel's receive timestamp, which httpd reads) and counts from it,
not from whenever the request's turn came; what happens before admission is kept short anyway.
"""

from __future__ import annotations

import hmac
import os
import sys
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import gevent
import orjson

from specload.sim.eos import EosLength
from specload.sim.faults import FaultInjector, Faults, RequestFaults
from specload.sim.httpd import App, Request, Response, Stream
from specload.sim.info import METRICS_STYLES, metrics_text, server_info, vllm_server_info
from specload.sim.prefix import PromptKey, chat_units, text_units, word_unit
from specload.sim.promptkind import prompt_kind
from specload.sim.protocol import (
    GenRequest,
    HTTPError,
    Parse,
    Vocab,
    check_context,
    check_model,
    error_body,
    openai_options,
    parse_chat,
    parse_completion,
    parse_generate,
    read_json_object,
)
from specload.sim.render import (
    MALFORMED_EVENT,
    SSE_HEAD,
    TOKEN_TEXT,
    ChatRenderer,
    CompletionRenderer,
    GenerateRenderer,
    OpenAIRendererType,
    Renderer,
)
from specload.sim.specfields import PER_REQUEST_LEVELS
from specload.sim.timing import Engine, clock

# llama.cpp's answer to every request while its weights load, word for word (its "unavailable_error"
# type, where other 503s of this simulator say OpenAI's "ServiceUnavailableError").
LOADING_BODY = orjson.dumps({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})

DIE_EXIT_CODE = 3  # exit status when the die_after_requests fault fires


def _json(obj: Any) -> Response:
    return Response(200, orjson.dumps(obj))


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


@dataclass(slots=True)
class _Job:
    """One valid generation request, with the faults it was picked for."""

    request: Request
    req: GenRequest
    renderer: Renderer
    plan: RequestFaults
    target: int  # tokens to generate: max_tokens, less a short_by fault, or where the model stops (eos)
    finish: str  # "length", or "stop" when a fault or the model's EOS makes the output short


@dataclass(slots=True)
class _Progress:
    """How far one request's generation got: tokens of the last chunk, tokens and verify steps so far."""

    tokens: int = 0
    sent: int = 0
    verify: int = 0
    accepted: list[int] = field(default_factory=list)  # draft tokens each speculative step accepted


class SimApp:
    """The httpd app: routing, validation, streaming, metrics. Timing is entirely the engine's."""

    def __init__(
        self,
        engine: Engine,
        model: str = "specload-sim",
        max_model_len: int = 8192,
        metrics_style: str = "sglang",
        faults: Faults | None = None,
        vocab: Vocab | None = None,
        close_after_stream: bool = False,
        loading_s: float = 0.0,
        cache_report: bool = False,
        spec_metrics: str = "none",
        reasoning_tokens: int = 0,
        reasoning_field: str = "reasoning",
        vllm: bool = False,
        vllm_dev_mode: bool = False,
        emission_log: IO[str] | None = None,
        eos: EosLength | None = None,
    ) -> None:
        if metrics_style not in METRICS_STYLES:
            raise ValueError(f"metrics_style must be one of {METRICS_STYLES}")
        self.engine = engine
        self.model = model
        self.max_model_len = max_model_len
        self.metrics_style = metrics_style
        self.faults = faults or Faults()
        self.vocab = vocab or Vocab()
        self.secrets: dict[str, Any] = {}  # server-info fields that carry secrets (see sim.cli.make_server)
        self.close_after_stream = close_after_stream
        # One JSON line per finished stream: when its first and last token events were handed to the
        # socket, on the engine's clock (what the simulator really did, for tests to hold a client's
        # figures against: TPOT is (t_last - t_first) / (tokens - first_tokens) of these).
        self.emission_log = emission_log
        # llama.cpp listens before its weights are loaded and answers every endpoint, /health
        # included, with 503 "Loading model" meanwhile: a client must not take that for "back".
        self.loading_until = time.monotonic() + loading_s if loading_s > 0 else 0.0
        self.injector = FaultInjector(self.faults)
        self.eos = eos  # None: the model never emits EOS (every answer runs to max_tokens)
        # The prefix cache (the engine's, if any): generated tokens are " tok", one unit each, as the
        # client sends an answer back: token ids from this server's /tokenize, or the words themselves.
        self.cache_report = cache_report
        if spec_metrics not in PER_REQUEST_LEVELS:
            raise ValueError(f"spec_metrics must be one of {PER_REQUEST_LEVELS}")
        self.spec_metrics = spec_metrics  # vLLM's --per-request-spec-decode-metrics
        if reasoning_tokens < 0:
            raise ValueError(f"--reasoning-tokens must be >= 0, got {reasoning_tokens}")
        self.reasoning = (reasoning_tokens, reasoning_field)  # chat streams' reasoning first (ChatRenderer)
        self._out_unit_ids = self.vocab.tokenize(TOKEN_TEXT)[0]
        self._out_unit_text = word_unit(TOKEN_TEXT.strip())
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self._model_json = orjson.dumps(model)
        self._routes: dict[str, tuple[str, App]] = {
            "/health": ("GET", self._health),
            "/v1/models": ("GET", self._models),
            "/v1/completions": ("POST", self._completions),
            "/v1/chat/completions": ("POST", self._chat),
            "/generate": ("POST", self._generate),
            "/tokenize": ("POST", self._tokenize),
        }
        if metrics_style != "none":
            self._routes["/metrics"] = ("GET", self._metrics)
            self._routes["/get_server_info"] = ("GET", self._server_info)
            self._routes["/server_info"] = ("GET", self._server_info)
        if vllm:  # vLLM's endpoints: no SGLang server info; its own /server_info only in dev mode
            self._routes.pop("/get_server_info", None)
            self._routes.pop("/server_info", None)
            if vllm_dev_mode:
                self._routes["/server_info"] = ("GET", self._vllm_server_info)

    def __call__(self, request: Request) -> Response | Stream | None:
        path = request.path
        route = self._routes.get(path)
        try:
            if self.loading_until and time.monotonic() < self.loading_until:
                return Response(503, LOADING_BODY)
            if route is None:
                raise HTTPError(404, f"Not found: {path}")
            method, handler = route
            if request.method != method:
                raise HTTPError(405, f"Method {request.method} not allowed on {path}")
            return handler(request)
        except HTTPError as e:
            return Response(e.status, error_body(e.status, e.message))

    # -- informational endpoints ---------------------------------------------------------------------

    def _health(self, request: Request) -> Response:
        return Response(200, b"ok", "text/plain; charset=utf-8")

    def _tokenize(self, request: Request) -> Response:
        """llama.cpp's ``{"content"}`` or vLLM's ``{"prompt"}``; ``{"tokens": [...]}`` either way."""
        body = read_json_object(request.body)
        text = body.get("content", body.get("prompt"))
        if not isinstance(text, str):
            raise HTTPError(400, "'content' (or 'prompt') must be a string")
        return _json({"tokens": self.vocab.tokenize(text)})

    def _models(self, request: Request) -> Response:
        card = {
            "id": self.model,
            "object": "model",
            "owned_by": "specload-sim",
            "max_model_len": self.max_model_len,
        }
        return _json({"object": "list", "data": [card]})

    def server_info(self) -> dict[str, Any]:
        return {**server_info(self.engine, self.model, self.max_model_len, self.faults), **self.secrets}

    def _server_info(self, request: Request) -> Response:
        return _json(self.server_info())

    def _vllm_server_info(self, request: Request) -> Response:
        return _json(vllm_server_info(self.engine, self.model, self.max_model_len))

    def metrics_text(self) -> str:
        return metrics_text(
            self.engine,
            self.metrics_style,
            self.model,
            self.prompt_tokens_total,
            self.generation_tokens_total,
        )

    def _metrics(self, request: Request) -> Response:
        body = self.metrics_text().encode()
        return Response(200, body, "text/plain; version=0.0.4; charset=utf-8")

    # -- generation endpoints ----------------------------------------------------------------------------

    def _completions(self, request: Request) -> Response | Stream | None:
        return self._openai(request, parse_completion, CompletionRenderer)

    def _chat(self, request: Request) -> Response | Stream | None:
        return self._openai(request, parse_chat, ChatRenderer)

    def _openai(
        self, request: Request, parse: Parse, renderer: OpenAIRendererType
    ) -> Response | Stream | None:
        """The OpenAI endpoints differ only in how the body is read and how events are written."""
        body = read_json_object(request.body)
        check_model(body, self.model)
        self.vocab.check_ids(body.get("prompt"))
        req = parse(body, self.max_model_len)
        if renderer is ChatRenderer:
            req.prompt_tokens += self.vocab.chat_template_tokens
            req.key = self._key(messages=body.get("messages"))
            req.kind = self._kind(None, body.get("messages"))
        else:
            req.key = self._key(body.get("prompt"))
            req.kind = self._kind(body.get("prompt"))
        r = renderer(self.model, self._model_json, req.prompt_tokens, req.include_usage)
        r.cache_report = self.cache_report
        r.continuous_usage, spec_details = openai_options(body)
        r.spec_metrics = self.spec_metrics
        r.sglext = spec_details and self.metrics_style == "sglang"
        if isinstance(r, ChatRenderer) and self.reasoning[0]:
            r.reason(*self.reasoning)
        return self._respond(request, req, r)

    def _generate(self, request: Request) -> Response | Stream | None:
        body = read_json_object(request.body)
        self.vocab.check_ids(body.get("input_ids"))
        req = parse_generate(body, self.max_model_len)
        prompt = body["input_ids"] if body.get("input_ids") is not None else body.get("text")
        req.key = self._key(prompt)
        req.kind = self._kind(prompt)
        r = GenerateRenderer(req.prompt_tokens, request.arrived, self.engine.speculative)
        return self._respond(request, req, r)

    def _kind(self, prompt: Any, messages: Any = None) -> str | None:
        """The prompt's kind, for an engine whose acceptance depends on it (specload.sim.promptkind)."""
        engine = self.engine
        if not engine.speculative:
            return None
        return prompt_kind(prompt, messages, engine.openings, engine.multi_turn)

    def _key(self, prompt: Any = None, messages: Any = None) -> PromptKey | None:
        """The prompt as prefix-cache units, only when the engine has a cache (it costs O(prompt))."""
        cache = self.engine.prefix_cache
        if cache is None:
            return None
        if messages is not None:
            return PromptKey(chat_units(messages), cache.block, self._out_unit_text)
        if isinstance(prompt, str):
            return PromptKey(text_units(prompt), cache.block, self._out_unit_text)
        return PromptKey(list(prompt), cache.block, self._out_unit_ids)

    def _respond(self, request: Request, req: GenRequest, r: Renderer) -> Response | Stream | None:
        """Pick the request's faults, then answer with an error, a stream or a whole response."""
        check_context(req, self.max_model_len)
        plan = self.injector.next_request()
        if plan.http_error is not None:
            status = plan.http_error
            msg = f"simulated fault: HTTP {status} on request {self.injector.requests}"
            return Response(status, error_body(status, msg))
        target = max(0, req.max_tokens - plan.short_by)
        finish = "length" if target == req.max_tokens else "stop"
        if self.eos is not None:  # the model's own end (--eos-length), unless ignore_eos
            end, why = self.eos.end(req.max_tokens, req.may_stop, req.min_tokens)
            target, finish = (end, why) if end < target else (target, finish)
        job = _Job(request, req, r, plan, target, finish)
        if req.stream:
            # httpd sends the status line and headers before asking for the first event, so they go
            # out before the request queues for a slot, as Starlette-based servers do.
            return Stream(SSE_HEAD, self._stream(job))
        return self._whole(job)

    def _admit(self, req: GenRequest) -> None:
        if self.injector.on_admit():
            sys.stderr.write(
                f"specload-sim: fault die_after_requests={self.faults.die_after_requests} reached, exiting\n"
            )
            sys.stderr.flush()
            os._exit(DIE_EXIT_CODE)
        self.prompt_tokens_total += req.prompt_tokens

    def _engine_loop(self, job: _Job, progress: _Progress) -> Generator[_Progress, None, None]:
        """Run ``job`` through the engine: yield ``progress`` once admitted, then after each chunk.

        The one engine loop of both response kinds. The engine counts from the request's arrival,
        not from when this generator got its turn. Closing this generator (the client went away, a
        fault cut the request) closes the engine's, which frees the engine slot.
        """
        key = job.req.key
        chunks = self.engine.generate(
            job.req.prompt_tokens, job.target, arrival=job.request.arrived, key=key, kind=job.req.kind
        )
        try:
            next(chunks)  # ADMITTED; blocks while queued
            if key is not None:
                job.renderer.cached_tokens = key.cached
            spec = self.engine.spec_counters() if self.engine.speculative else None
            if spec is not None:  # the renderer reads the steps as they grow
                job.renderer.spec_steps, job.renderer.spec_k = progress.accepted, spec.num_spec_tokens
            self._admit(job.req)
            yield progress
            for chunk in chunks:
                progress.tokens = chunk.tokens
                progress.sent += chunk.tokens
                progress.verify += chunk.verify_steps
                if chunk.accepted:
                    progress.accepted.extend(chunk.accepted)
                self.generation_tokens_total += chunk.tokens
                yield progress
        finally:
            chunks.close()

    def _stream(self, job: _Job) -> Iterator[bytes]:
        """A streamed response's events, each yielded the moment it is due."""
        r, target, done = job.renderer, job.target, not job.plan.omit_done
        mishaps = _Mishaps(job.plan, target)
        progress = _Progress()
        sent: list[tuple[float, int]] = []  # (when, tokens) of each token event, for the emission log
        loop = self._engine_loop(job, progress)
        try:
            next(loop)  # admitted (blocks while queued)
            event = r.admitted()
            if event is not None:
                yield event
            _, cut = mishaps.after(0)  # (no malformed event before the first token)
            if cut:
                job.request.abort()
                return
            for p in loop:
                last = p.sent >= target
                event = r.content(p.tokens, p.sent, p.verify, job.finish if last else None)
                if self.emission_log is not None:
                    sent.append((clock(), p.tokens))
                if last and mishaps.idle:
                    # One write (one syscall) for the last event and its usage / [DONE] tail.
                    yield event + r.tail(p.sent, done)
                    return
                yield event
                extra, cut = mishaps.after(p.sent)
                if extra is not None:
                    yield extra
                if cut:
                    job.request.abort()
                    return
            if target == 0:
                yield r.content(0, 0, 0, job.finish)
            tail = r.tail(progress.sent, done)
            if tail:
                yield tail
        finally:
            loop.close()
            if sent and self.emission_log is not None:
                self._log_emission(sent, progress.sent >= target)
            if self.close_after_stream:
                # The headers already said keep-alive; the connection closes anyway (llama.cpp).
                job.request.keep_alive = False

    def _log_emission(self, sent: list[tuple[float, int]], complete: bool) -> None:
        log = self.emission_log
        assert log is not None
        line = {
            "t_first": sent[0][0],
            "t_last": sent[-1][0],
            "first_tokens": sent[0][1],
            "tokens": sum(n for _, n in sent),
            "events": len(sent),
            "complete": complete,
        }
        log.write(orjson.dumps(line).decode() + "\n")
        log.flush()

    def _whole(self, job: _Job) -> Response | None:
        """The whole response, once the engine produced the last token; None if a fault cut it."""
        mishaps = _Mishaps(job.plan, job.target)
        progress = _Progress()
        loop = self._engine_loop(job, progress)
        cut = False
        try:
            for p in loop:
                _, cut = mishaps.after(p.sent)  # stalls and cuts; the malformed fault is the body below
                if cut:
                    break
        finally:
            loop.close()
        if cut:
            job.request.abort()  # no response at all
            return None
        if job.plan.malformed:
            return Response(200, b"{not json")
        return _json(job.renderer.body(progress.sent, progress.verify, job.finish))


# ---------------------------------------------------------------------------------------------------
# API key


# Paths that need the API key when one is set (as vLLM's --api-key guards /v1): generation and models.
_KEYED_PATHS = ("/v1/", "/generate")


def _auth_error(message: str) -> Response:
    err = {"message": message, "type": "AuthenticationError", "param": None, "code": 401}
    return Response(401, orjson.dumps({"error": err}))


def require_api_key(app: App, api_key: str) -> App:
    """``app`` behind ``Authorization: Bearer <api_key>``; 401 otherwise. The key is never echoed."""
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
