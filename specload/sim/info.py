"""What the simulator says about itself: ``/get_server_info`` and ``/metrics``.

Both mimic the real servers closely enough for specload's own readers (``specload.client.introspect``):
SGLang's server-info fields and ``internal_states``, and SGLang's or vLLM's Prometheus gauge and
counter names, including the speculative-decoding counters when the engine models speculation.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from specload import __version__
from specload.sim.faults import Faults
from specload.sim.prefix import PrefixCache
from specload.sim.timing import Engine, SpecCounters

METRICS_STYLES = ("sglang", "vllm", "llamacpp", "none")

# style -> (running gauge, waiting gauge, prompt counter, generated counter)
_METRIC_NAMES = {
    "sglang": (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
    ),
    "vllm": (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
    ),
    "llamacpp": (
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamacpp:prompt_tokens_total",
        "llamacpp:tokens_predicted_total",
    ),
}

# One Prometheus sample: (name, type, help text, value).
_Row = tuple[str, str, str, float]


def server_info(engine: Engine, model: str, max_model_len: int, faults: Faults) -> dict[str, Any]:
    """The ``/get_server_info`` document: served model, the engine's settings, faults, live state."""
    info: dict[str, Any] = {
        "model_path": model,
        "served_model_name": model,
        "context_length": max_model_len,
        "version": f"specload-sim {__version__}",
        "simulated": True,
    }
    info.update(engine.server_info())
    info["sim_faults"] = asdict(faults)
    state = {"num_running_reqs": engine.running, "num_queue_reqs": engine.queued}
    state.update(engine.internal_state())  # e.g. the effective running cap
    info["internal_states"] = [state]
    return info


def metrics_text(
    engine: Engine, style: str, model: str, prompt_tokens_total: int, generation_tokens_total: int
) -> str:
    """Prometheus text exposition in ``style``'s names (``sglang`` or ``vllm``)."""
    running, waiting, prompt, generated = _METRIC_NAMES[style]
    prefix = running.split(":", 1)[0] + ":"
    rows: list[_Row] = [
        (running, "gauge", "Number of requests running now.", engine.running),
        (waiting, "gauge", "Number of requests waiting for a slot.", engine.queued),
        (prompt, "counter", "Prompt tokens admitted.", prompt_tokens_total),
        (generated, "counter", "Tokens generated.", generation_tokens_total),
    ]
    counters = engine.spec_counters()
    if counters is not None:
        rows += _spec_rows(style, prefix, counters)
    cache = engine.prefix_cache
    if cache is not None:
        rows += _cache_rows(style, prefix, cache)
    label = model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    lines: list[str] = []
    seen: set[str] = set()
    for name, kind, help_text, value in rows:
        name, _, extra = name.partition("|")  # "name|label=..." adds a label to the sample
        if name not in seen:  # one HELP and TYPE per metric, however many samples
            seen.add(name)
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        labels = f'model_name="{label}"' + (f",{extra}" if extra else "")
        lines.append(f"{name}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


def _cache_rows(style: str, prefix: str, cache: PrefixCache) -> list[_Row]:
    """The prefix cache as each server shows it: vLLM's token counters, SGLang's hit-rate gauge of the
    last batch of admissions (llama.cpp has neither)."""
    if style == "vllm":
        return [
            (
                prefix + "prefix_cache_queries_total",
                "counter",
                "Prompt tokens looked up in the prefix cache.",
                cache.queries,
            ),
            (
                prefix + "prefix_cache_hits_total",
                "counter",
                "Prompt tokens served by the prefix cache.",
                cache.hits,
            ),
        ]
    if style == "sglang":
        return [(prefix + "cache_hit_rate", "gauge", "The prefix cache hit rate.", cache.last_batch_rate)]
    return []


def _spec_rows(style: str, prefix: str, c: SpecCounters) -> list[_Row]:
    if style in ("vllm", "llamacpp"):  # the same three counters in both, which specload's sampler reads
        per_pos: list[_Row] = []
        if style == "vllm":  # one sample per draft position, labelled position="0".."k-1"
            per_pos = [
                (
                    prefix + f'spec_decode_num_accepted_tokens_per_pos_total|position="{i}"',
                    "counter",
                    "Accepted tokens per draft position.",
                    n,
                )
                for i, n in enumerate(c.accepted_per_pos)
            ]
        return per_pos + [
            (
                prefix + "spec_decode_num_drafts_total",
                "counter",
                "Verify steps (one per request per step).",
                c.num_drafts,
            ),
            (
                prefix + "spec_decode_num_draft_tokens_total",
                "counter",
                "Draft tokens proposed.",
                c.num_draft_tokens,
            ),
            (
                prefix + "spec_decode_num_accepted_tokens_total",
                "counter",
                "Draft tokens accepted.",
                c.num_accepted_tokens,
            ),
        ]
    # SGLang's gauge; here the average since start, bonus token included (0 before any step)
    accept = c.accept_length or 0.0
    return [
        (prefix + "spec_accept_length", "gauge", "Tokens per verify step.", accept),
        (prefix + "spec_verify_calls_total", "counter", "Verify steps of all requests.", c.verify_calls),
    ]


def vllm_server_info(engine: Engine, model: str, max_model_len: int) -> dict[str, Any]:
    """vLLM's dev-mode ``/server_info?config_format=json`` (VLLM_SERVER_DEV_MODE=1), the fields specload
    reads: ``vllm_config.scheduler_config.max_num_seqs`` and ``vllm_config.speculative_config``."""
    info = engine.server_info()
    k = info.get("speculative_num_steps")
    spec = (
        {"method": str(info.get("speculative_algorithm") or "ngram").lower(), "num_speculative_tokens": k}
        if k
        else None
    )
    return {
        "vllm_config": {
            "model_config": {"model": model, "max_model_len": max_model_len},
            "scheduler_config": {"max_num_seqs": info.get("max_running_requests")},
            "speculative_config": spec,
        },
        "vllm_env": {},
        "system_env": {},
    }
