"""The simulator's replaceable timing model.

The HTTP layer knows nothing about time: it asks an :class:`Engine` for a request's chunks and writes
each one as soon as the engine hands it over. Everything that decides *when* a token appears
(queueing, prefill, decode pace, later batching and speculative decoding) lives behind that one
method, so a new model (a ``BatchEngine``) can be dropped in without touching the server.

Engines block with gevent sleeps, so they must run inside gevent greenlets (the simulator's HTTP
server does this; unit tests may simply iterate from the main greenlet or spawn greenlets).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

from gevent.event import Event

from specload.clock.hrtimer import clock, sleep_until  # the one clock engines schedule against
from specload.sim.prefix import PrefixCache, PromptKey

__all__ = ["ADMITTED", "Chunk", "Engine", "FifoSlots", "FixedEngine", "SpecCounters", "clock", "sleep_until"]


@dataclass(frozen=True, slots=True)
class Chunk:
    """What one stream event carries.

    ``verify_steps`` is kept apart from ``tokens`` because a speculative engine emits several tokens
    per target-model forward pass; SGLang reports the pass count as ``meta_info.spec_verify_ct`` and
    clients derive the acceptance length from the two.
    """

    tokens: int
    verify_steps: int
    # Draft tokens each speculative verify step of this event accepted, in order (the prefill's first
    # token is no such step): what vLLM's per-request metrics and SGLang's spec_* fields are made of.
    accepted: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SpecCounters:
    """Speculative-decoding totals since the engine started, as /metrics reports them.

    ``num_drafts`` counts verify steps (one per request per step), ``num_draft_tokens`` the draft
    tokens proposed and ``num_accepted_tokens`` those accepted; ``accept_length`` is tokens per verify
    step, bonus token included, or None before any step.
    """

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accept_length: float | None
    # vLLM's per-position counter: index i, the steps that accepted draft position i (0-based)
    accepted_per_pos: tuple[int, ...] = ()
    verify_calls: int = 0  # SGLang's spec_verify_calls_total: every request's verify steps, summed
    num_spec_tokens: int = 0  # k, the draft tokens proposed per step


ADMITTED = Chunk(0, 0)
"""First item of every :meth:`Engine.generate` stream: the request just got a running slot.

The HTTP layer needs this moment (vLLM sends the chat role-only event then, and the die-after-N
fault counts admissions), yet it must not know how admission works, hence a marker in the stream
rather than a callback. Every later chunk carries at least one token.
"""


class Engine(ABC):
    """A timing model: turns (prompt length, output length) into chunks delivered on schedule."""

    #: True when the engine models speculative decoding; the server then reports ``spec_verify_ct``.
    speculative: bool = False
    #: The simulated prefix cache (specload.sim.prefix), or None: every prompt is prefilled in full.
    prefix_cache: PrefixCache | None = None
    #: Prompt categories the engine tells apart (category -> opening sentence), and the category of a
    #: conversation of several turns that no opening matched (specload.sim.promptkind); an engine
    #: whose timing depends on the prompt's kind (a speculative one: acceptance) sets them.
    openings: Mapping[str, str] = {}
    multi_turn: str | None = None

    @abstractmethod
    def generate(
        self,
        prompt_tokens: int,
        max_tokens: int,
        arrival: float | None = None,
        key: PromptKey | None = None,
        kind: str | None = None,
    ) -> Generator[Chunk, None, None]:
        """Yield :data:`ADMITTED` once admitted, then chunks summing to exactly ``max_tokens`` tokens.

        ``key``: the prompt as prefix-cache units (made only when the engine has a ``prefix_cache``);
        the engine looks it up at admission (``key.cached``: the prompt tokens it skips) and stores it.
        ``kind``: the prompt's kind (specload.sim.promptkind.prompt_kind; None: plain real text).

        Each item is yielded only when it is due (the generator sleeps), so the caller just iterates
        and writes. Closing the generator early (client gone) must free whatever the request held.

        ``arrival`` is when the request arrived, on :data:`clock` (the HTTP layer takes the kernel's
        receive timestamp of its last bytes); None means now. The caller may start the generator a
        little later (simultaneous requests are parsed one after another), and the engine decides
        what that gap means: a request that would have been admitted on arrival should count from
        its arrival.
        """

    @property
    @abstractmethod
    def running(self) -> int:
        """Requests holding a running slot now (SGLang ``num_running_reqs``)."""

    @property
    @abstractmethod
    def queued(self) -> int:
        """Requests waiting for a slot now (SGLang ``num_queue_reqs``)."""

    @abstractmethod
    def server_info(self) -> dict[str, Any]:
        """Engine-specific ``/get_server_info`` fields (capacity, speculative settings, timing)."""

    # Optional hooks: an engine that has something to report overrides them.

    def spec_counters(self) -> SpecCounters | None:
        """Speculative-decoding totals for /metrics; None (the default) when there is no speculation."""
        return None

    def internal_state(self) -> dict[str, Any]:
        """Extra fields of /get_server_info's ``internal_states[0]``, next to the running and queued
        counts (SGLang reports the effective running cap there); none by default."""
        return {}


class _Waiter:
    __slots__ = ("event", "admitted_at")

    def __init__(self) -> None:
        self.event = Event()
        self.admitted_at = 0.0


class FifoSlots:
    """A counting gate with strict first-come-first-served admission.

    A freed slot is handed straight to the oldest waiter (``running`` never dips), so a newcomer can
    never overtake a queued request, which gevent's Semaphore does not promise. The hand-over time is
    recorded as the waiter's admission time, so scheduling jitter in waking it up does not shift its
    timeline. Likewise a request that finds a free slot is admitted as of its arrival (when the caller
    gives one), or as of when a slot last came free if that was later.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.running = 0
        self._waiters: deque[_Waiter] = deque()
        self._freed_at = float("-inf")  # when the gate last went from full to not full

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def acquire(self, arrival: float | None = None) -> float:
        """Block until admitted; return the admission time on :data:`clock`.

        Admitted at once: the later of ``arrival`` (default now) and the moment a slot came free,
        never later than now. Queued: the moment a slot was handed over.
        """
        if self.running < self.capacity and not self._waiters:
            self.running += 1
            now = clock()
            if arrival is None:
                return now
            return min(now, max(arrival, self._freed_at))
        waiter = _Waiter()
        self._waiters.append(waiter)
        try:
            waiter.event.wait()
        except BaseException:
            # Killed while queued: give back a slot that was already handed over, else leave the queue.
            if waiter.event.is_set():
                self.release()
            else:
                self._waiters.remove(waiter)
            raise
        return waiter.admitted_at

    def release(self) -> None:
        if self._waiters:
            waiter = self._waiters.popleft()
            waiter.admitted_at = clock()
            waiter.event.set()
        else:
            if self.running == self.capacity:
                self._freed_at = clock()
            self.running -= 1


class FixedEngine(Engine):
    """Fixed TTFT and inter-token latency behind a cap on running requests.

    Timeline of one request (every duration multiplied by ``time_scale``): wait in FIFO order for one
    of ``max_running`` slots (admitted as of its arrival if one is free then); the first token (one
    token, as from prefill) is due at ``admit + ttft_s + prefill_per_token_s * (prompt_tokens - cached)``,
    ``cached`` being what the prefix cache serves (0 without one); token
    ``i`` (1-based) is due at ``first + (i - 1) * itl_s``. Tokens are emitted ``tokens_per_chunk`` at
    a time when the last token of the chunk is due, so a short last chunk comes proportionally sooner
    and, whatever the chunking, ``e2e = ttft + (max_tokens - 1) * itl`` exactly. Deadlines are
    absolute, so sleep overshoot on one chunk is not carried into the next.
    """

    def __init__(
        self,
        ttft_s: float,
        itl_s: float,
        max_running: int,
        prefill_per_token_s: float = 0.0,
        tokens_per_chunk: int = 1,
        time_scale: float = 1.0,
        prefix_cache: PrefixCache | None = None,
        speed_up_after: int | None = None,
        speed_up: float = 2.0,
    ) -> None:
        if speed_up <= 0:
            raise ValueError(f"speed_up must be > 0, got {speed_up}")
        if min(ttft_s, itl_s, prefill_per_token_s) < 0:
            raise ValueError("ttft_s, itl_s and prefill_per_token_s must be >= 0")
        if tokens_per_chunk < 1:
            raise ValueError(f"tokens_per_chunk must be >= 1, got {tokens_per_chunk}")
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.max_running = max_running
        self.prefill_per_token_s = prefill_per_token_s
        self.tokens_per_chunk = tokens_per_chunk
        self.time_scale = time_scale
        self._slots = FifoSlots(max_running)
        self.prefix_cache = prefix_cache
        # A server that changes speed mid-run (a warm-up, a compilation, a neighbour leaving): every
        # request admitted after the first ``speed_up_after`` runs ``speed_up`` times faster.
        self.speed_up_after = speed_up_after
        self.speed_up = speed_up
        self._admitted = 0

    @property
    def running(self) -> int:
        return self._slots.running

    @property
    def queued(self) -> int:
        return self._slots.queued

    def generate(
        self,
        prompt_tokens: int,
        max_tokens: int,
        arrival: float | None = None,
        key: PromptKey | None = None,
        kind: str | None = None,
    ) -> Generator[Chunk, None, None]:
        admitted_at = self._slots.acquire(arrival)
        try:
            cache, cached = self.prefix_cache, 0
            if cache is not None and key is not None:
                cache.begin_batch()  # one admission is one batch here
                cached = cache.match(key, prompt_tokens)
            yield ADMITTED
            if max_tokens <= 0:
                return
            scale = self.time_scale
            self._admitted += 1
            if self.speed_up_after is not None and self._admitted > self.speed_up_after:
                scale /= self.speed_up
            first = admitted_at + (self.ttft_s + self.prefill_per_token_s * (prompt_tokens - cached)) * scale
            itl = self.itl_s * scale
            per_chunk = self.tokens_per_chunk
            sleep_until(first)
            if cache is not None and key is not None:
                cache.insert(key)  # the prompt's KV exists from its first token on
                if max_tokens == 1:
                    self._store_answer(cache, key, max_tokens)
            yield Chunk(1, 1)
            done = 1
            while done < max_tokens:
                n = min(per_chunk, max_tokens - done)
                done += n
                sleep_until(first + (done - 1) * itl)
                if done == max_tokens and cache is not None and key is not None:
                    # Before the last chunk goes out: the caller may close this generator right after it.
                    self._store_answer(cache, key, max_tokens)
                yield Chunk(n, n)
        finally:
            self._slots.release()

    @staticmethod
    def _store_answer(cache: PrefixCache, key: PromptKey, tokens: int) -> None:
        """The prompt with its answer into the cache (a next turn resends both)."""
        key.add_output(tokens)
        cache.insert(key)

    def server_info(self) -> dict[str, Any]:
        return {
            "max_running_requests": self.max_running,
            "speculative_algorithm": None,
            "speculative_num_steps": None,
            "speculative_num_draft_tokens": None,
            "sim_engine": "fixed",
            **({"sim_prefix_cache": self.prefix_cache.describe()} if self.prefix_cache is not None else {}),
            "sim_timing": {
                "ttft_s": self.ttft_s,
                "itl_s": self.itl_s,
                "prefill_per_token_s": self.prefill_per_token_s,
                "tokens_per_chunk": self.tokens_per_chunk,
                "time_scale": self.time_scale,
                **(
                    {"speed_up_after": self.speed_up_after, "speed_up": self.speed_up}
                    if self.speed_up_after
                    else {}
                ),
            },
        }
