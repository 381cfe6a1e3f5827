"""Continuous batching with optional speculative decoding: the simulator's realistic timing model.

A real inference server (SGLang, vLLM) runs one *step* (a forward pass of the target model) after
another over every running request: a request in decode gets one token per step, or with speculative
decoding (MTP / EAGLE / NEXTN) one plus the draft tokens the step accepted; a newly admitted request
has its prompt prefilled in chunks and gets its first token from the step that finishes its prefill.
How long a step takes depends on what is in it, and that is where every effect the reference
deployment shows comes from (docs/simulator.md has the model, the presets and the calibration):

    step = decode_ms(batch)                  table, piecewise linear in the batch size
         + ctx_us_per_token   * context tokens of the batch / 1000
         + prefill_us_per_token * prompt tokens prefilled in this step / 1000
    speculative: verify_ms(batch) (default decode_ms) instead of decode_ms, plus k * draft_ms(batch)

times ``time_scale``. Admission is FIFO under a cap on running requests and a KV budget: a request
reserves ``prompt + max_tokens`` tokens when admitted and holds them until it ends (no retraction).
With a prefix cache (specload.sim.prefix), what it holds of a prompt is not prefilled again. Speculation shrinks the budget by the draft's memory and replaces the cap (SGLang
resets max_running_requests to 48 for speculative decoding).

Two layers: :class:`BatchScheduler` is the pure bookkeeping (no clock, no gevent; time only enters
as arrival stamps and step start times it is given), so tests and bench/calibrate.py can drive it in
virtual time; :class:`BatchEngine` runs it in real time with one scheduler greenlet, stepping
against absolute deadlines so that no sleep overshoot accumulates.
"""

from __future__ import annotations

import bisect
import contextlib
import random
import sys
from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

import gevent
from gevent.event import Event

from specload.sim.prefix import PrefixCache, PromptKey
from specload.sim.timing import ADMITTED, Chunk, Engine, SpecCounters, clock, sleep_until

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PRESETS = ("baseline", "mtp", "ngram")


# ---------------------------------------------------------------------------------------------------
# Parameters


class Table:
    """A piecewise-linear function of the batch size from ``(batch, ms)`` points.

    Between points: linear interpolation. Past the last point: the last segment's line, extended.
    Below the first point (or with a single point): the first value.
    """

    __slots__ = ("xs", "ys", "_cache")

    def __init__(self, points: Sequence[Sequence[float]]) -> None:
        pts = [tuple(p) for p in points]
        if not pts or any(len(p) != 2 for p in pts):
            raise ValueError(f"a table is a non-empty list of [batch, ms] pairs, got {points!r}")
        xs = [float(x) for x, _ in pts]
        ys = [float(y) for _, y in pts]
        if any(b <= a for a, b in zip(xs, xs[1:], strict=False)):
            raise ValueError(f"table batch sizes must increase strictly, got {xs}")
        if xs[0] <= 0 or min(ys) < 0:
            raise ValueError(f"table batch sizes must be > 0 and times >= 0, got {pts}")
        self.xs, self.ys = xs, ys
        self._cache: dict[int, float] = {}

    def __call__(self, batch: float) -> float:
        cached = self._cache.get(batch)  # type: ignore[call-overload]
        if cached is not None:
            return cached
        xs, ys = self.xs, self.ys
        if len(xs) == 1 or batch <= xs[0]:
            y = ys[0]
        else:
            i = min(bisect.bisect_right(xs, batch), len(xs) - 1)  # segment [i-1, i]; the last one beyond
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
            y = max(0.0, y0 + (y1 - y0) * (batch - x0) / (x1 - x0))
        if isinstance(batch, int):
            self._cache[batch] = y
        return y

    def points(self) -> list[list[float]]:
        return [[x, y] for x, y in zip(self.xs, self.ys, strict=True)]


@dataclass(frozen=True)
class PromptCategory:
    """A kind of prompt with its own acceptance (a preset's ``[prompt_categories.NAME]`` table).

    A prompt is of the category when its first user text starts with ``opening``; ``multi_turn``
    makes it the category of conversations of several turns that no opening matched; the category
    named ``token_ids`` is that of prompts of token ids, told by their shape (specload.sim.promptkind).
    ``spec_accept_prob`` and ``spec_accept_decay`` replace the preset's own for its prompts (None:
    the preset's)."""

    name: str
    opening: str = ""
    multi_turn: bool = False
    spec_accept_prob: float | None = None
    spec_accept_decay: float | None = None


_CATEGORY_KEYS = {f.name for f in fields(PromptCategory)} - {"name"}


def _categories(table: Any, where: str) -> tuple[PromptCategory, ...]:
    """``[prompt_categories.NAME]`` tables (name -> keys) as PromptCategory, checked."""
    if isinstance(table, (tuple, list)) and all(isinstance(c, PromptCategory) for c in table):
        return tuple(table)
    if not isinstance(table, dict):
        raise ValueError(f"{where}: prompt_categories must be a table of tables, got {table!r}")
    out = []
    for name, keys in table.items():
        if not isinstance(keys, dict):
            raise ValueError(f"{where}: prompt_categories.{name} must be a table, got {keys!r}")
        unknown = sorted(set(keys) - _CATEGORY_KEYS)
        if unknown:
            raise ValueError(
                f"{where}: prompt_categories.{name}: unknown key(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(_CATEGORY_KEYS))}"
            )
        try:
            out.append(PromptCategory(str(name), **keys))
        except TypeError as e:
            raise ValueError(f"{where}: prompt_categories.{name}: {e}") from None
    return tuple(out)


def accept_length(p: float, k: int) -> float:
    """Tokens per verify step that k drafts accepted in sequence with probability p each give, the
    bonus token included: 1 + p + p^2 + ... + p^k (SGLang's spec_accept_length, vLLM's
    mean_acceptance_length, in expectation)."""
    return 1.0 + sum(p**i for i in range(1, k + 1))


@dataclass(frozen=True)
class BatchParams:
    """Everything a preset file sets (specload/sim/presets/*.toml); see docs/simulator.md."""

    name: str = "custom"
    description: str = ""
    decode_ms: tuple[tuple[float, float], ...] = ((1, 10.0),)
    ctx_us_per_token: float = 0.0
    prefill_us_per_token: float = 0.0
    chunked_prefill_tokens: int = 8192
    max_running_requests: int = 256
    kv_budget_tokens: int = 1_000_000
    speculative_algorithm: str | None = None  # None: no speculation, the spec_* fields are ignored
    spec_num_steps: int = 1  # k: draft tokens per step
    spec_accept_prob: float = 1.0  # p: each draft token accepted with p, in sequence, until a rejection
    # p falls by this much per 1000 output tokens (p at output position x: max(0, p - decay * x / 1000)),
    # the decay of acceptance along a long output; 0: none
    spec_accept_decay: float = 0.0
    draft_ms: tuple[tuple[float, float], ...] = ((1, 0.0),)  # per draft token
    verify_ms: tuple[tuple[float, float], ...] | None = None  # None: decode_ms
    # The verify pass's cost of each draft token of each running request (k x batch of them a step):
    # what makes a longer draft pay at small batches and cost at large ones.
    verify_us_per_draft_token: float = 0.0
    draft_kv_tokens: int = 0  # KV tokens the draft's memory takes from kv_budget_tokens
    spec_max_running_requests: int | None = None  # replaces max_running_requests when speculative
    # Kinds of prompt with their own acceptance (PromptCategory); a prompt of none of them (plain
    # real text) gets spec_accept_prob and spec_accept_decay above.
    prompt_categories: tuple[PromptCategory, ...] = ()
    seed: int = 0

    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm is not None

    @property
    def effective_max_running(self) -> int:
        if self.speculative and self.spec_max_running_requests is not None:
            return self.spec_max_running_requests
        return self.max_running_requests

    @property
    def effective_kv_budget(self) -> int:
        return self.kv_budget_tokens - (self.draft_kv_tokens if self.speculative else 0)

    def validate(self) -> None:
        for t in ("decode_ms", "draft_ms") + (("verify_ms",) if self.verify_ms is not None else ()):
            Table(getattr(self, t))
        if min(self.ctx_us_per_token, self.prefill_us_per_token) < 0:
            raise ValueError("ctx_us_per_token and prefill_us_per_token must be >= 0")
        if self.chunked_prefill_tokens < 1:
            raise ValueError(f"chunked_prefill_tokens must be >= 1, got {self.chunked_prefill_tokens}")
        if self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {self.max_running_requests}")
        if self.speculative:
            if self.spec_num_steps < 1:
                raise ValueError(f"spec_num_steps must be >= 1, got {self.spec_num_steps}")
            if not 0.0 <= self.spec_accept_prob <= 1.0:
                raise ValueError(f"spec_accept_prob must be in [0, 1], got {self.spec_accept_prob}")
            if self.spec_accept_decay < 0:
                raise ValueError(f"spec_accept_decay must be >= 0, got {self.spec_accept_decay}")
            if self.draft_kv_tokens < 0:
                raise ValueError(f"draft_kv_tokens must be >= 0, got {self.draft_kv_tokens}")
            if self.spec_max_running_requests is not None and self.spec_max_running_requests < 1:
                raise ValueError(
                    f"spec_max_running_requests must be >= 1, got {self.spec_max_running_requests}"
                )
            for c in self.prompt_categories:
                if c.spec_accept_prob is not None and not 0.0 <= c.spec_accept_prob <= 1.0:
                    raise ValueError(f"prompt_categories.{c.name}.spec_accept_prob must be in [0, 1]")
                if c.spec_accept_decay is not None and c.spec_accept_decay < 0:
                    raise ValueError(f"prompt_categories.{c.name}.spec_accept_decay must be >= 0")
            if sum(c.multi_turn for c in self.prompt_categories) > 1:
                raise ValueError("at most one of prompt_categories may be multi_turn")
        if self.effective_kv_budget < 1:
            raise ValueError(
                f"the KV budget left for requests must be >= 1 token, got {self.effective_kv_budget}"
            )

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for t in ("decode_ms", "draft_ms", "verify_ms"):
            if d[t] is not None:
                d[t] = [list(p) for p in d[t]]
        d["prompt_categories"] = {
            c.name: {k: v for k, v in asdict(c).items() if k != "name" and v is not None}
            for c in self.prompt_categories
        }
        return d

    def acceptance(self, kind: str | None) -> tuple[float, float]:
        """(p, decay per 1000 output tokens) of a prompt of ``kind`` (None: plain real text)."""
        for c in self.prompt_categories:
            if c.name == kind:
                p = self.spec_accept_prob if c.spec_accept_prob is None else c.spec_accept_prob
                decay = self.spec_accept_decay if c.spec_accept_decay is None else c.spec_accept_decay
                return p, decay
        return self.spec_accept_prob, self.spec_accept_decay

    @property
    def openings(self) -> dict[str, str]:
        """Category -> its opening sentence, for the categories that have one."""
        return {c.name: c.opening for c in self.prompt_categories if c.opening}

    @property
    def multi_turn(self) -> str | None:
        return next((c.name for c in self.prompt_categories if c.multi_turn), None)


_FIELDS = {f.name for f in fields(BatchParams)}
_TABLES = ("decode_ms", "draft_ms", "verify_ms")


def params_from_dict(
    data: dict[str, Any], base: BatchParams | None = None, where: str = "preset"
) -> BatchParams:
    """``base`` (default: the dataclass defaults) with ``data``'s keys set; unknown keys are errors."""
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(_FIELDS))}")
    values = dict(data)
    for t in _TABLES:
        if values.get(t) is not None:
            try:
                values[t] = tuple((float(x), float(y)) for x, y in values[t])
            except (TypeError, ValueError):
                raise ValueError(
                    f"{where}: {t} must be a list of [batch, ms] pairs, got {values[t]!r}"
                ) from None
    if "prompt_categories" in values:
        values["prompt_categories"] = _categories(values["prompt_categories"], where)
    if values.get("speculative_algorithm") in ("", "none", "None"):
        values["speculative_algorithm"] = None
    try:
        params = replace(base or BatchParams(), **values)
    except TypeError as e:  # a category's key of the wrong shape
        raise ValueError(f"{where}: {e}") from None
    try:
        params.validate()
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return params


def load_preset(name_or_path: str, overrides: Sequence[str] = ()) -> BatchParams:
    """A packaged preset by name (``baseline``, ``mtp``, ``ngram``) or a TOML file, then ``KEY=VALUE`` overrides.

    An override's value is a TOML value: ``max_running_requests=128``, ``spec_accept_prob=0.8``,
    ``decode_ms=[[1, 9], [64, 25]]``, ``speculative_algorithm="EAGLE"``.
    """
    if name_or_path in PRESETS:
        text = (resources.files("specload.sim") / "presets" / f"{name_or_path}.toml").read_text("utf-8")
        where = f"preset {name_or_path}"
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise ValueError(f"--preset {name_or_path!r}: not one of {', '.join(PRESETS)} nor a TOML file")
        text, where = path.read_text("utf-8"), str(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{where}: {e}") from None
    data.setdefault("name", Path(name_or_path).stem)
    params = params_from_dict(data, where=where)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--param {item!r}: expected KEY=VALUE")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw  # a bare word: a string
        params = params_from_dict({key.strip(): value}, params, where=f"--param {item}")
    return params


# ---------------------------------------------------------------------------------------------------
# The pure scheduler

QUEUED, PREFILL, DECODE, DONE = 0, 1, 2, 3


class BatchRequest:
    """One request's state inside :class:`BatchScheduler` (plus the engine's wake-up event)."""

    __slots__ = (
        "prompt",
        "max_tokens",
        "arrival",
        "reserve",
        "state",
        "prefilled",
        "generated",
        "chunk_now",
        "pending_tokens",
        "pending_verify",
        "pending_accepted",
        "admitted_at",
        "event",
        "key",
        "accept",
    )

    def __init__(
        self,
        prompt_tokens: int,
        max_tokens: int,
        arrival: float,
        key: PromptKey | None = None,
        accept: tuple[float, float] | None = None,
    ) -> None:
        self.key = key  # the prompt as prefix-cache units (None: no cache, or not looked up)
        # (p, decay per 1000 output tokens) of this prompt's kind (BatchParams.acceptance); None: the preset's
        self.accept = accept
        self.prompt = prompt_tokens
        self.max_tokens = max_tokens
        self.arrival = arrival
        self.reserve = prompt_tokens + max_tokens  # KV tokens held from admission to the end
        self.state = QUEUED
        self.prefilled = 0
        self.generated = 0  # tokens produced so far (by completed steps)
        self.chunk_now = 0  # prompt tokens prefilled in the current step
        self.pending_tokens = 0  # produced but not yet taken by the consumer
        self.pending_verify = 0
        self.pending_accepted: list[int] = []  # draft tokens each pending verify step accepted
        self.admitted_at: float | None = None
        self.event: Event | None = None


@dataclass
class Step:
    """What one step serves, and when it ends (``end`` may grow while late arrivals join it)."""

    start: float
    end: float
    batch: list[BatchRequest]
    prefill_tokens: int
    ctx_tokens: int
    budget_left: int
    admitted: list[BatchRequest] = field(default_factory=list)  # requests admitted as the step began


class BatchScheduler:
    """Continuous-batching bookkeeping: admission, step composition, token accounting. No clock.

    Driver protocol: :meth:`submit` requests; :meth:`begin_step` at a step's start time (admits what
    may start then and returns the step, or None when there is nothing to do); :meth:`end_step` when
    that step's ``end`` has come (hands out its tokens and retires finished requests); :meth:`cancel`
    at any time. Durations returned are already multiplied by ``time_scale``.
    """

    def __init__(
        self, params: BatchParams, time_scale: float = 1.0, cache: PrefixCache | None = None
    ) -> None:
        params.validate()
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.cache = cache  # a request's cached prompt start is not prefilled again
        self.params = params
        self.time_scale = time_scale
        self.speculative = params.speculative
        self.max_running = params.effective_max_running
        self.kv_budget = params.effective_kv_budget
        self.k = params.spec_num_steps if self.speculative else 0
        self.p = params.spec_accept_prob
        self._decode = Table(params.verify_ms if self.speculative and params.verify_ms else params.decode_ms)
        self._draft = Table(params.draft_ms)
        self._rng = random.Random(params.seed)
        self.queue: deque[BatchRequest] = deque()
        self.running: list[BatchRequest] = []  # admission order
        self.kv_used = 0
        self.step: Step | None = None
        self.decided_at = float("-inf")  # start of the last step: when admission was last decided
        # cumulative counters (speculative: one draft = one verify step of one request)
        self.steps = 0
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * self.k
        self.verify_calls = 0
        self.decay = params.spec_accept_decay / 1000.0

    # -- timing -----------------------------------------------------------------------------------------

    def step_seconds(self, batch: int, ctx_tokens: int, prefill_tokens: int) -> float:
        """The duration of a step serving ``batch`` requests, already scaled."""
        p = self.params
        ms = (
            self._decode(batch)
            + p.ctx_us_per_token * ctx_tokens / 1e3
            + p.prefill_us_per_token * prefill_tokens / 1e3
        )
        if self.k:
            ms += self.k * self._draft(batch) + self.k * batch * p.verify_us_per_draft_token / 1e3
        return ms * self.time_scale / 1e3

    # -- requests ---------------------------------------------------------------------------------------

    def submit(self, req: BatchRequest) -> bool:
        """Queue a request; True when it joined the step in progress (it arrived before that step began)."""
        step = self.step
        if step is not None and not self.queue and req.arrival <= step.start and self._admissible(req):
            self._admit(req, step.start)
            if self._wants_prefill(req, step):
                self._take_prefill(req, step)
                step.end = step.start + self.step_seconds(
                    len(step.batch), step.ctx_tokens, step.prefill_tokens
                )
            return True
        self.queue.append(req)
        return False

    def cancel(self, req: BatchRequest) -> None:
        """Forget a request wherever it is and give back its KV reservation. Idempotent."""
        if req.state == QUEUED:
            with contextlib.suppress(ValueError):
                self.queue.remove(req)
        elif req.state in (PREFILL, DECODE):
            self.running.remove(req)
            self.kv_used -= req.reserve
        req.state = DONE  # a request in the current step's batch is skipped when the step ends

    def _admissible(self, req: BatchRequest) -> bool:
        if len(self.running) >= self.max_running:
            return False
        # Alone, a request larger than the whole budget still runs (see docs/simulator.md).
        return self.kv_used + req.reserve <= self.kv_budget or not self.running

    def _admit(self, req: BatchRequest, at: float) -> None:
        req.state = PREFILL
        req.admitted_at = at
        self.running.append(req)
        self.kv_used += req.reserve
        if self.cache is not None and req.key is not None:
            # What the cache holds counts as prefilled: only the rest takes prefill budget and time.
            # (Its KV is still reserved in full: the budget stays conservative, see docs/simulator.md.)
            req.prefilled = self.cache.match(req.key, req.prompt)

    @staticmethod
    def _wants_prefill(req: BatchRequest, step: Step) -> bool:
        return step.budget_left > 0 or req.prefilled >= req.prompt  # (an empty prompt needs no budget)

    def _take_prefill(self, req: BatchRequest, step: Step) -> None:
        n = min(req.prompt - req.prefilled, step.budget_left)
        req.chunk_now = n
        step.budget_left -= n
        step.prefill_tokens += n
        step.ctx_tokens += req.prefilled
        step.batch.append(req)

    # -- steps ------------------------------------------------------------------------------------------

    def begin_step(self, start: float) -> Step | None:
        """Compose the step starting at ``start``; None (and no step) when nothing can run.

        First admission: FIFO, requests that arrived by ``start``, while the cap and the KV budget
        allow (the head of the queue blocks those behind it). Then the batch: every decoding request,
        and prefilling ones in admission order while this step's prefill budget lasts.
        """
        queue = self.queue
        self.decided_at = start
        admitted = []
        if self.cache is not None and queue and queue[0].arrival <= start:
            self.cache.begin_batch()
        while queue and queue[0].arrival <= start and self._admissible(queue[0]):
            req = queue.popleft()
            self._admit(req, start)
            admitted.append(req)
        step = Step(start, start, [], 0, 0, self.params.chunked_prefill_tokens, admitted)
        for req in self.running:
            if req.state == DECODE:
                req.chunk_now = 0
                step.ctx_tokens += req.prompt + req.generated
                step.batch.append(req)
            elif self._wants_prefill(req, step):
                self._take_prefill(req, step)
        if not step.batch:
            self.step = None
            return None
        step.end = start + self.step_seconds(len(step.batch), step.ctx_tokens, step.prefill_tokens)
        self.step = step
        return step

    def end_step(self) -> list[BatchRequest]:
        """Apply the current step: the requests that got tokens (finished ones are retired)."""
        step = self.step
        assert step is not None, "end_step without begin_step"
        self.step = None
        self.steps += 1
        out: list[BatchRequest] = []
        k, p, rng = self.k, self.p, self._rng
        for req in step.batch:
            if req.state == DONE:  # cancelled during the step
                continue
            if req.state == PREFILL:
                req.prefilled += req.chunk_now
                if req.prefilled < req.prompt:
                    continue
                req.state = DECODE
                if self.cache is not None and req.key is not None:
                    self.cache.insert(req.key)  # the prompt's KV is complete
                n, verify = 1, 1  # the pass that finishes the prefill gives the first token
            elif k:
                accepted = 0
                q, decay = (p, self.decay) if req.accept is None else (req.accept[0], req.accept[1] / 1000.0)
                if decay:
                    q = max(0.0, q - decay * req.generated)
                if q >= 1.0:
                    accepted = k
                else:
                    while accepted < k and rng.random() < q:
                        accepted += 1
                n, verify = min(1 + accepted, req.max_tokens - req.generated), 1
                self.num_drafts += 1
                self.num_draft_tokens += k
                self.num_accepted_tokens += n - 1
                for i in range(n - 1):
                    self.accepted_per_pos[i] += 1
                req.pending_accepted.append(n - 1)
            else:
                n, verify = 1, 1
            if n <= 0:
                continue
            req.generated += n
            req.pending_tokens += n
            req.pending_verify += verify
            self.verify_calls += verify
            out.append(req)
            if req.generated >= req.max_tokens:
                req.state = DONE
                self.running.remove(req)
                self.kv_used -= req.reserve
                if self.cache is not None and req.key is not None:
                    req.key.add_output(req.generated)  # the answer's KV too: a next turn resends it
                    self.cache.insert(req.key)
        return out

    def waiting(self) -> int:
        """Queued requests the last admission decision left waiting (SGLang's ``num_queue_reqs``).

        SGLang sets its gauge when it forms a batch, after moving what it can into it, so a request
        that arrives during a step and is admitted at the next one is never counted; neither is it
        here. What remains are the requests held back by the cap or the KV budget.
        """
        t = self.decided_at
        return sum(1 for r in self.queue if r.arrival <= t)

    def admit_empty(self, req: BatchRequest, now: float) -> None:
        """A request for zero tokens: admitted (and finished) without a step."""
        req.state = DONE
        req.admitted_at = now

    @property
    def accept_length(self) -> float | None:
        """Tokens per verify step so far (bonus token included), or None before any."""
        if not self.num_drafts:
            return None
        return 1.0 + self.num_accepted_tokens / self.num_drafts


# ---------------------------------------------------------------------------------------------------
# The real-time engine


class BatchEngine(Engine):
    """Continuous batching (and speculative decoding) in real time; see the module docstring.

    One scheduler greenlet, started on the first request, runs the steps: each one starts where the
    previous one ended (absolute deadlines), and when nothing runs and nothing waits it sleeps until
    a request comes. A request that finds the scheduler idle starts a step as of its arrival; one that
    arrived before the step in progress began (the HTTP layer handles simultaneous requests one after
    another) joins that step, which is what arriving on time would have meant.
    """

    def __init__(
        self, params: BatchParams, time_scale: float = 1.0, prefix_cache: PrefixCache | None = None
    ) -> None:
        self.params = params
        self.prefix_cache = prefix_cache
        self.sched = BatchScheduler(params, time_scale, prefix_cache)
        self.time_scale = time_scale
        self.speculative = params.speculative
        self._wake = Event()
        self._loop: gevent.Greenlet | None = None
        self._last_end = float("-inf")  # end of the last step run
        if self.speculative:  # the prompt's kind sets its acceptance
            self.openings, self.multi_turn = params.openings, params.multi_turn

    @classmethod
    def from_preset(
        cls,
        name_or_path: str,
        overrides: Sequence[str] = (),
        time_scale: float = 1.0,
        prefix_cache: PrefixCache | None = None,
    ) -> BatchEngine:
        return cls(load_preset(name_or_path, overrides), time_scale, prefix_cache)

    @property
    def running(self) -> int:
        return len(self.sched.running)

    @property
    def queued(self) -> int:
        return self.sched.waiting()

    def generate(
        self,
        prompt_tokens: int,
        max_tokens: int,
        arrival: float | None = None,
        key: PromptKey | None = None,
        kind: str | None = None,
    ) -> Generator[Chunk, None, None]:
        now = clock()
        accept = self.params.acceptance(kind) if self.speculative else None
        req = BatchRequest(
            prompt_tokens, max_tokens, now if arrival is None else min(arrival, now), key, accept
        )
        sched = self.sched
        if max_tokens <= 0:
            sched.admit_empty(req, now)
            yield ADMITTED
            return
        event = req.event = Event()
        if not sched.submit(req):
            self._wake.set()
        if self._loop is None or self._loop.dead:
            self._loop = gevent.spawn(self._run)
        try:
            while req.admitted_at is None:
                event.wait()
                event.clear()
            yield ADMITTED
            taken = 0
            while taken < max_tokens:
                while not req.pending_tokens:
                    event.wait()
                    event.clear()
                n, v, acc = req.pending_tokens, req.pending_verify, req.pending_accepted
                req.pending_tokens = req.pending_verify = 0
                req.pending_accepted = []
                taken += n
                yield Chunk(n, v, tuple(acc))
        finally:
            sched.cancel(req)

    def _run(self) -> None:
        sched = self.sched
        while True:
            if not sched.queue and not sched.running:
                self._wake.clear()
                self._wake.wait()
                continue
            start = self._last_end
            if not sched.running:  # idle until now: the step starts when its first request arrived
                start = max(start, sched.queue[0].arrival)
            step = sched.begin_step(start)
            if step is None:  # queued requests that cannot start yet (a reservation too large for now)
                self._wake.clear()
                self._wake.wait()
                continue
            for req in step.admitted:
                if req.event is not None:
                    req.event.set()  # ADMITTED
            while clock() < step.end:  # late joiners may push the end back while we sleep
                sleep_until(step.end)
            self._last_end = step.end
            for req in sched.end_step():
                if req.event is not None:
                    req.event.set()

    def spec_counters(self) -> SpecCounters | None:
        if not self.speculative:
            return None
        s = self.sched
        return SpecCounters(
            s.num_drafts,
            s.num_draft_tokens,
            s.num_accepted_tokens,
            s.accept_length,
            tuple(s.accepted_per_pos),
            s.verify_calls,
            s.k,
        )

    def internal_state(self) -> dict[str, Any]:
        """Extra ``internal_states[0]`` fields of /get_server_info (SGLang reports the effective cap there)."""
        return {"max_running_requests": self.sched.max_running, "max_total_num_tokens": self.sched.kv_budget}

    def server_info(self) -> dict[str, Any]:
        p, s = self.params, self.sched
        spec = self.speculative
        return {
            "max_running_requests": s.max_running,
            "max_total_num_tokens": s.kv_budget,
            "chunked_prefill_size": p.chunked_prefill_tokens,
            "speculative_algorithm": p.speculative_algorithm if spec else None,
            "speculative_num_steps": s.k if spec else None,
            "speculative_num_draft_tokens": s.k + 1 if spec else None,
            "speculative_eagle_topk": 1 if spec else None,
            "sim_engine": "batch",
            **({"sim_prefix_cache": self.prefix_cache.describe()} if self.prefix_cache is not None else {}),
            "sim_preset": p.name,
            "sim_timing": {**p.as_dict(), "time_scale": self.time_scale},
        }
