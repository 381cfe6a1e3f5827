"""What a run is, decided before its run directory exists: the scenario from the options (flags,
scenario file, web form), the host, the model, the server's configuration, the prompts and the
dataset, and whether the API key goes along. Everything here may fail with CannotStart, whose
message is the whole explanation the user gets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from specload.analysis.capacity import SearchSpace
from specload.client.backends import get_backend
from specload.client.http import api_key, check_host, key_may_go_to, redact_host
from specload.client.introspect import discover_model, max_running, server_config
from specload.client.probe import ServerUnreachable, StillLoading, wait_while_loading
from specload.core.slo import parse_slo
from specload.locust.options import (
    FORM_SOURCE,
    LAUNCH_HOST,
    SEND_KEY_DEST,
    SEND_KEY_FLAG,
    explicit_from,
    launch_values,
    scenario_from_options,
)
from specload.locust.protocol import RunConfig
from specload.sweep.capacity import CapacityRun
from specload.sweep.levels import plan_levels
from specload.workload.config import REAL, Scenario, ScenarioError
from specload.workload.datasets import DatasetError, Item, load_items
from specload.workload.prompt_source import PromptProbeFailed, discover_prompts
from specload.workload.prompts import IDS, TEXT
from specload.workload.realtext import ORIGIN, RealTextError, real_items
from specload.workload.replay import Replay, TraceError, replay_of
from specload.workload.traceprompt import block_size_of, real_tape, real_trace_prompt, salt_of
from specload.workload.traces import TraceRequest
from specload.workload.vocab import LocalTokenizer, ServerTokenizer, VocabError

logger = logging.getLogger("specload")

_TIMEBOXED_ITEMS = 1024  # dataset prompts drawn for a time-boxed level (they are reused in turn)


class CannotStart(Exception):
    """The run cannot start; the message says why (logged, exit code 2)."""


@dataclass(frozen=True)
class ResolvedRun:
    """Everything decided before the run directory exists."""

    scenario: Scenario
    config: RunConfig
    model_source: str
    label: str
    server: dict[str, Any]
    items: list[Item] = field(default_factory=list)  # dataset prompts, handed out with the grants
    # A capacity search (specload capacity) instead of the scenario's levels.
    capacity: CapacityRun | None = None
    replay: Replay | None = None  # a trace replay (--trace): its window, handed out with the grants
    # A real-text trace replay's prompts, made by the owner per request (None: each process makes them).
    trace_prompt: Callable[[TraceRequest, int], list[int]] | None = None  # (request, level)

    def trace_meta(self) -> dict[str, Any]:
        """run.json ``trace``: the replay's description and the text that filled its lengths."""
        if self.replay is None:
            return {}
        p = self.config.prompts
        if self.trace_prompt is not None:
            text = f"{p.origin}, as token ids (code for one hash id in five, prose otherwise)"
        elif p.kind == IDS:
            text = f"random token ids ({p.origin})"
        else:
            text = f"random one-token words ({p.origin})"
        return {**self.replay.describe(), "text": text}


def _trace_fits(replay: Replay, server: dict[str, Any]) -> None:
    """Warn when some of the window's requests are longer than the server's context (they will fail,
    and the report counts them as failed): a trace recorded on a long-context model, replayed on a
    short one."""
    ctx = server.get("max_model_len") or server.get("context_length")
    if not isinstance(ctx, int) or isinstance(ctx, bool) or ctx <= 0:
        return
    over = [r for r in replay.requests if r.input_tokens + r.output_tokens > ctx]
    if over:
        logger.warning(
            "trace: %d of the window's %d requests need more than the server's context of %d tokens "
            "(the longest %d): the server will refuse them; a window of shorter requests, or a server "
            "with a longer context, replays them all",
            len(over),
            len(replay.requests),
            ctx,
            max(r.input_tokens + r.output_tokens for r in over),
        )


class RunResolver:
    """Resolves each run of a Locust process from its options as they are at the run's start (a web
    UI's form edits them between runs).

    ``explicit``: the options the process was started with, each overriding the scenario file even
    at its default value; ``launch``: every option's value at launch, to tell a form edit from an
    untouched field. Both come from Locust's parsed options, never from ``sys.argv``.
    """

    def __init__(self, environment: Any) -> None:
        self.env = environment
        opts = environment.parsed_options
        self.explicit = explicit_from(opts)
        self.launch = launch_values(opts) if opts else None

    def _drop_credentials(self) -> None:
        """A host typed into the web UI's form with a user:password: dropped before Locust sends
        it to the workers (its spawn messages carry ``environment.host`` and the parsed options),
        as the CLI drops it from ``--host`` (specload.launch.locust_env). Nothing in specload sends
        it to the server (no HTTP basic auth)."""
        raw = self.env.host
        if not raw or redact_host(raw) == raw:
            return
        logger.warning(
            "the user:password in the host URL is not sent to the server and is dropped; "
            "a bearer key goes in SPECLOAD_API_KEY"
        )
        self.env.host = redact_host(raw)
        opts = self.env.parsed_options
        if opts is not None and isinstance(getattr(opts, "host", None), str):
            opts.host = redact_host(opts.host)

    def resolve(self) -> ResolvedRun:
        """The scenario, the host, the model and the server's configuration, or CannotStart."""
        opts = self.env.parsed_options
        try:
            source = FORM_SOURCE if getattr(self.env, "web_ui", None) is not None else "command line"
            sc = scenario_from_options(opts, self.explicit, self.launch, source)
            self._drop_credentials()
            host = check_host(self.env.host)
        except (ScenarioError, ValueError) as e:
            raise CannotStart(str(e)) from None
        try:
            replay = replay_of(sc)  # before any request: a trace that cannot be replayed stops here
        except TraceError as e:
            raise CannotStart(f"trace: {e}") from None
        if replay is not None:
            logger.info(
                "trace %s (%s): %d requests of %d, %.1f s of trace time replayed in %.1f s (speed-up %g)",
                sc.trace,
                sc.trace_format,
                len(replay.requests),
                len(replay.trace.requests),
                replay.requests[-1].arrival_s - replay.requests[0].arrival_s,
                replay.offsets[-1],
                sc.trace_speedup,
            )
        insecure = bool(getattr(opts, "insecure", False))
        if insecure and host.startswith("https://"):
            logger.warning("--insecure: the server's TLS certificate is NOT verified")
        send_key = self.send_key(host)
        try:
            wait_while_loading(
                host, sc.loading_timeout_s, logger.warning, sc.connect_timeout_s, insecure, send_key
            )
        except StillLoading as e:
            raise CannotStart(str(e)) from None
        except ServerUnreachable as e:
            raise CannotStart(f"cannot reach the server before the sweep: {e}") from None
        model, how = sc.model, "scenario/flag"
        if not model:
            try:
                model, how = discover_model(host, sc.connect_timeout_s, insecure, send_key)
            except ServerUnreachable as e:
                raise CannotStart(f"cannot reach the server before the sweep: {e}") from None
            if model is None and get_backend(sc.backend).needs_model:
                raise CannotStart(f"no model name: {how}; pass --model NAME")
        server = server_config(host, sc.connect_timeout_s, insecure, send_key)
        if replay is not None:
            _trace_fits(replay, server)
        cap = max_running(server)
        if cap is not None and replay is None and max(sc.levels) > cap:
            logger.warning(
                "the server runs at most %d requests at once (max_running_requests); "
                "levels above C=%d will queue the excess",
                cap,
                cap,
            )
        trace_prompt: Callable[[TraceRequest, int], list[int]] | None = None  # (request, level)
        try:
            prompts = discover_prompts(sc, get_backend(sc.backend), host, model, insecure, send_key)
            items = self._dataset(sc, host, model, insecure, prompts.overhead, send_key)
            if replay is not None and sc.prompt_method == REAL:
                tape = real_tape(self._tokenizer(sc, host, model, insecure, send_key), sc.seed)
                logger.info(
                    "real text for the trace: %d code and %d prose tokens by %s",
                    len(tape.code),
                    len(tape.prose),
                    tape.tokenizer,
                )
                block, seed, overhead = block_size_of(sc), sc.seed, prompts.overhead
                trace_prompt = lambda r, level: real_trace_prompt(  # noqa: E731
                    tape, seed, r, block, overhead, salt_of(sc, level)
                )
                prompts = replace(prompts, origin=f"{ORIGIN} by {tape.tokenizer}")
        except (VocabError, PromptProbeFailed, ServerUnreachable, DatasetError, RealTextError) as e:
            raise CannotStart(f"prompts: {e}") from None
        if items:
            origin = f"dataset {sc.dataset} ({len(items)} prompts by vLLM's sampling rules)"
            real = sc.prompt_method == REAL  # (text, whatever the API: the report's header says "text from")
            prompts = (
                replace(prompts, origin=ORIGIN, kind=TEXT, ids=None)
                if real
                else replace(prompts, origin=origin)
            )
        config = RunConfig(sc, model, host, prompts, insecure, send_key)
        return ResolvedRun(
            sc,
            config,
            how,
            opts.label or sc.name,
            server,
            items,
            self._capacity_run(sc),
            replay,
            trace_prompt,
        )

    def _capacity_run(self, sc: Scenario) -> CapacityRun | None:
        """The capacity search --capacity-search asks for (specload capacity), or None for a sweep."""
        text = getattr(self.env.parsed_options, "capacity_search", "") or ""
        if not text:
            return None
        if not sc.slo:
            raise CannotStart("a capacity search needs an SLO (--slo ttft_p99=2s,...)")
        try:
            return CapacityRun(SearchSpace.from_option(text), parse_slo(sc.slo), sc)
        except ValueError as e:
            raise CannotStart(str(e)) from None

    def send_key(self, host: str) -> bool:
        """Whether this run's requests (probes included) carry the API key: to the host given at
        launch always, to another (typed in the web form) only when the user ticked the form's box.
        A withheld key is said, so a run that the server then refuses is not a mystery."""
        launched = self.launch.get(LAUNCH_HOST) if self.launch else None
        confirmed = bool(getattr(self.env.parsed_options, SEND_KEY_DEST, False))
        send = key_may_go_to(host, launched, confirmed)
        if api_key() is None:
            return send  # no key in this environment: nothing to send or withhold
        was = f"started for {redact_host(launched)}" if launched else "started without a host"
        if not send:
            logger.warning(
                'the API key is NOT sent to %s: specload was %s; tick "Send key to new host" in the '
                "start form (%s) to send it there",
                redact_host(host),
                was,
                SEND_KEY_FLAG,
            )
        elif not key_may_go_to(host, launched, False):
            logger.warning("the API key goes to %s, as confirmed (specload was %s)", redact_host(host), was)
        return send

    @staticmethod
    def _tokenizer(
        sc: Scenario, host: str, model: str | None, insecure: bool, send_key: bool
    ) -> LocalTokenizer | ServerTokenizer:
        if sc.tokenizer:
            return LocalTokenizer(sc.tokenizer)
        return ServerTokenizer(host, model, sc.connect_timeout_s, insecure, send_key)

    def _dataset(
        self, sc: Scenario, host: str, model: str | None, insecure: bool, overhead: int, send_key: bool
    ) -> list[Item]:
        """The run's dataset prompts, as many as the plan needs (time-boxed levels cycle through them).

        ``overhead``: the tokens the server adds to each prompt, left out of a fixed prompt length."""
        if (not sc.dataset and sc.prompt_method != REAL) or sc.trace:
            return []  # (a trace's real text is made per request: resolve)
        plans = plan_levels(sc)
        n = sum((p.budget or _TIMEBOXED_ITEMS) + p.warmup for p in plans)
        tok = self._tokenizer(sc, host, model, insecure, send_key)
        if sc.prompt_method == REAL:  # specload's real text, each prompt sized to the input tokens
            items = real_items(n, sc.seed, tok, sc.input_tokens - overhead, sc.output_tokens)
            logger.info("real text: %d prompts of %d tokens by %s", len(items), sc.input_tokens, tok.name)
            return items
        assert sc.dataset is not None
        fixed = sc.dataset_lengths == "fixed"
        items = load_items(
            sc.dataset,
            n,
            sc.seed,
            tok,
            sc.output_tokens if fixed else None,
            sc.input_tokens - overhead if fixed else None,
            sc.output_tokens,
        )
        logger.info(
            "dataset %s: %d prompts (%d asked for), prompt tokens %d..%d, output tokens %d..%d",
            sc.dataset,
            len(items),
            n,
            min(i.prompt_tokens for i in items),
            max(i.prompt_tokens for i in items),
            min(i.output_tokens for i in items),
            max(i.output_tokens for i in items),
        )
        return items
