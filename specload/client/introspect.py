"""What the server says about itself: its configuration before a sweep, its queue during it.

Everything here is optional and failure-tolerant: a server without ``/get_server_info`` or
``/metrics`` is simply not introspected, and the report leaves those columns empty. Prometheus
text is parsed with ``prometheus_client``'s parser, after keeping only the few metric lines we
read, so that parsing a large ``/metrics`` page never stalls the load-generating process.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from specload.client.http import api_key
from specload.client.probe import ServerUnreachable, get_json
from specload.core.rundir import ServerInfo

logger = logging.getLogger("specload")

# sample key -> metric sample names, SGLang, vLLM and llama.cpp spellings (summed over label sets: DP
# ranks, engines). llama.cpp's "deferred" requests are the ones waiting for a free slot.
METRICS: dict[str, tuple[str, ...]] = {
    "running": ("sglang:num_running_reqs", "vllm:num_requests_running", "llamacpp:requests_processing"),
    "queued": ("sglang:num_queue_reqs", "vllm:num_requests_waiting", "llamacpp:requests_deferred"),
    "spec_num_drafts": ("vllm:spec_decode_num_drafts_total", "llamacpp:spec_decode_num_drafts_total"),
    "spec_num_draft_tokens": (
        "vllm:spec_decode_num_draft_tokens_total",
        "llamacpp:spec_decode_num_draft_tokens_total",
    ),
    "spec_num_accepted_tokens": (
        "vllm:spec_decode_num_accepted_tokens_total",
        "llamacpp:spec_decode_num_accepted_tokens_total",
    ),
    # SGLang's speculative counters: verify steps, beside the tokens generated (their ratio is the
    # acceptance length); vLLM's generation_tokens_total is read too (the same count).
    "spec_verify_calls": ("sglang:spec_verify_calls_total",),
    "generation_tokens": ("sglang:generation_tokens_total", "vllm:generation_tokens_total"),
    # The prefix cache: vLLM's cumulative token counters, SGLang's hit-rate gauge (its last prefill batch).
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total",),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total",),
    "cache_hit_rate": ("sglang:cache_hit_rate",),
}
# vLLM's accepted tokens per draft position, one sample per ``position`` label (0-based): kept as
# PER_POS_KEY + position ("spec_accepted_pos_0", ...), summed over the other labels (engines).
PER_POS_METRIC = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
PER_POS_KEY = "spec_accepted_pos_"
_WANTED = {name: key for key, names in METRICS.items() for name in names}
_WANTED[PER_POS_METRIC] = PER_POS_KEY
_AVERAGED = ("cache_hit_rate",)
_PREFIXES = tuple({n.rsplit("_total", 1)[0] for n in _WANTED})

# /get_server_info fields worth a column or a sentence; everything else is kept under "raw".
SGLANG_FIELDS = (
    "model_path",
    "served_model_name",
    "max_running_requests",
    "max_total_num_tokens",
    "context_length",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_draft_model_path",
    "tp_size",
    "dp_size",
    "chunked_prefill_size",
    "mem_fraction_static",
    "disable_overlap_schedule",
    "cuda_graph_max_bs",
    "version",
    "simulated",
)


def parse_metrics(text: str) -> dict[str, float | None]:
    """The sample values we read from a Prometheus text page (None when absent)."""
    kept: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("TYPE", "HELP") and parts[2].startswith(_PREFIXES):
                kept.append(line)
        elif line.startswith(_PREFIXES):
            kept.append(line)
    out: dict[str, float | None] = dict.fromkeys(METRICS)
    if not kept:
        return out
    try:
        families = list(text_string_to_metric_families("\n".join(kept) + "\n"))
    except Exception as e:  # noqa: BLE001 - a page we cannot parse is a page without these numbers
        logger.debug("unparseable /metrics (%s)", e)
        return out
    seen: dict[str, int] = {}
    for fam in families:
        for s in fam.samples:
            key = _WANTED.get(s.name)  # `_created` samples never match: they are not counts
            if key is PER_POS_KEY:
                key = PER_POS_KEY + str(s.labels.get("position", ""))
            if key is not None:
                out[key] = (out.get(key) or 0.0) + float(s.value)
                seen[key] = seen.get(key, 0) + 1
    for key in _AVERAGED:  # a rate per DP rank: their mean, not their sum
        if seen.get(key, 0) > 1:
            out[key] = (out[key] or 0.0) / seen[key]
    for key, v in out.items():  # a count or gauge below zero, or not finite, measures nothing
        if v is not None and (not math.isfinite(v) or v < 0):
            out[key] = None
    return out


@dataclass(frozen=True)
class ServedModel:
    """The first model a ``/v1/models`` answer lists."""

    id: str | None  # None when the entry has no usable id
    max_model_len: int | None  # vLLM lists it (SGLang does not), so it also tells the engine apart


def parse_models(body: Any) -> ServedModel | None:
    """The first model of a parsed ``/v1/models`` body (OpenAI list format); None when none is listed.

    The one reader of that answer, for everything that asks the server which model it serves.
    """
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        return None
    first = data[0]
    model_id = first.get("id")
    max_len = first.get("max_model_len")
    return ServedModel(
        id=str(model_id) if model_id else None,
        max_model_len=max_len if isinstance(max_len, int) and not isinstance(max_len, bool) else None,
    )


def discover_model(
    host: str, timeout: float = 10.0, insecure: bool = False, send_key: bool = True
) -> tuple[str | None, str]:
    """(model id, how it was found). Raises ServerUnreachable when the host does not answer."""
    status, body = get_json(host, "/v1/models", timeout, insecure, send_key)
    served = parse_models(body) if status == 200 else None
    if served is not None and served.id:
        return served.id, "/v1/models"
    return (
        None,
        f"/v1/models answered HTTP {status}: {body}" if status != 200 else "/v1/models listed no model",
    )


def server_config(
    host: str, timeout: float = 10.0, insecure: bool = False, send_key: bool = True
) -> dict[str, Any]:
    """The server's own account of its configuration; {} for a server that gives none.

    This is what run.json ``server`` holds (``rundir.ServerInfo`` reads it).
    """
    cfg: dict[str, Any] = {}
    try:
        status, info = get_json(host, "/get_server_info", timeout, insecure, send_key)
        if status == 200 and isinstance(info, dict):
            cfg["engine"] = "sglang"
            for k in SGLANG_FIELDS:
                if k in info:
                    cfg[k] = info[k]
            states = info.get("internal_states")
            if isinstance(states, list) and states and isinstance(states[0], dict):
                # The effective cap (SGLang resets it for speculative decoding) lives here when present.
                eff = states[0].get("max_running_requests") or states[0].get("max_running_reqs")
                if isinstance(eff, int):
                    cfg["max_running_requests_effective"] = eff
            cfg["raw"] = {k: v for k, v in info.items() if k not in SGLANG_FIELDS}
        status, models = get_json(host, "/v1/models", timeout, insecure, send_key)
        served = parse_models(models) if status == 200 else None
        if served is not None and served.max_model_len is not None:
            cfg.setdefault("engine", "vllm")
            cfg["max_model_len"] = served.max_model_len
        if cfg.get("engine") == "vllm":
            status, dev = get_json(host, VLLM_SERVER_INFO, timeout, insecure, send_key)
            if status == 200:
                cfg.update(vllm_dev_config(dev))
        elif "engine" not in cfg:
            status, props = get_json(host, "/props", timeout, insecure, send_key)
            if status == 200:
                cfg.update(llamacpp_props(props))
        status, version = get_json(host, "/version", timeout, insecure, send_key)
        if status == 200 and isinstance(version, dict) and "version" in version:
            cfg["version"] = version["version"]
    except ServerUnreachable as e:
        logger.warning("server introspection stopped: %s", e)
    return scrub_secrets(cfg, api_key())


# run.json ``server`` key: where the cap in ``max_running_requests`` was read, when not from SGLang's own field.
CAP_SOURCE = "max_running_requests_source"
# vLLM's dev-mode endpoint (VLLM_SERVER_DEV_MODE=1): its whole config, here as JSON.
VLLM_SERVER_INFO = "/server_info?config_format=json"
_VLLM_SPEC_FIELDS = ("method", "num_speculative_tokens", "model", "prompt_lookup_max", "prompt_lookup_min")


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def vllm_dev_config(body: Any) -> dict[str, Any]:
    """What run.json keeps of vLLM's ``/server_info`` (dev mode): ``max_num_seqs`` (also as the cap,
    ``max_running_requests``) and ``speculative_config``'s draft settings; {} for another shape."""
    vc = body.get("vllm_config") if isinstance(body, dict) else None
    if not isinstance(vc, dict):
        return {}
    out: dict[str, Any] = {}
    sched = vc.get("scheduler_config")
    n = _count(sched.get("max_num_seqs")) if isinstance(sched, dict) else None
    if n is not None:
        out["max_num_seqs"] = n
        out["max_running_requests"] = n
        out[CAP_SOURCE] = "vLLM /server_info scheduler_config.max_num_seqs"
    spec = vc.get("speculative_config")
    if isinstance(spec, dict):
        out["speculative_config"] = {k: spec[k] for k in _VLLM_SPEC_FIELDS if k in spec}
    elif "speculative_config" in vc:
        out["speculative_config"] = None
    return out


def llamacpp_props(body: Any) -> dict[str, Any]:
    """What run.json keeps of llama.cpp's ``/props``: ``total_slots``, its cap on running requests."""
    n = _count(body.get("total_slots")) if isinstance(body, dict) else None
    if n is None:
        return {}
    return {"total_slots": n, "max_running_requests": n, CAP_SOURCE: "llama.cpp /props total_slots"}


_SECRET_NAME = re.compile(r"key|secret|passw|token|credential|auth", re.IGNORECASE)
_NOT_SECRET = re.compile(  # token counts, rates and tokenizer settings are no secrets
    r"tokens|tokenizer|_len$|_size$|per_token|_token_ids?$|^(bos|eos|pad|unk|sep|cls|mask)_token",
    re.IGNORECASE,
)
REDACTED = "<redacted>"


def scrub_secrets(value: Any, key_in_use: str | None = None) -> Any:
    """``value`` with every secret-looking field (api_key, admin_api_key, ssl_keyfile_password, ...)
    and every string equal to the API key in use replaced, at any depth: SGLang's /get_server_info
    returns its own keys, and nothing a server says is written or shown before this."""
    if isinstance(value, dict):
        return {
            k: REDACTED if _is_secret_name(k) and v not in (None, "", False) else scrub_secrets(v, key_in_use)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [scrub_secrets(v, key_in_use) for v in value]
    if key_in_use and isinstance(value, str) and key_in_use in value:
        return value.replace(key_in_use, REDACTED)
    return value


def _is_secret_name(name: Any) -> bool:
    return isinstance(name, str) and bool(_SECRET_NAME.search(name)) and not _NOT_SECRET.search(name)


def max_running(cfg: dict[str, Any]) -> int | None:
    """The server's cap on requests decoded at once (see rundir.ServerInfo.max_running)."""
    return ServerInfo.from_json(cfg).max_running
