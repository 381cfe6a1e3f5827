"""One request to a fresh server: does it answer, and does its speculation accept draft tokens?

Acceptance is read the way a sweep reads it (``specload.analysis.metrics``): from the response itself
(SGLang's ``meta_info.spec_verify_ct``, llama.cpp's ``timings``, both parsed by the backends into the
record's ``spec_verify_ct``), else from the server's ``/metrics`` spec_decode counters (vLLM,
llama.cpp) read before and after the request. A speculative arm whose server shows neither cannot be
compared as one: the sweep would measure a baseline under a speculative label.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from specload.analysis.metrics import ServerSample, accept_length_from_counters, accept_length_from_records
from specload.client.backends import get_backend
from specload.client.http import base_headers, endpoint, make_client
from specload.client.introspect import discover_model, parse_metrics
from specload.client.probe import ServerUnreachable
from specload.client.stream import RequestSpec, stream_request
from specload.core.records import OK
from specload.workload.config import Scenario

SMOKE_OUTPUT_TOKENS = 32  # enough verify steps for an acceptance length, short enough on any server
# A pattern any model continues, so that every kind of drafter has something to get right: a draft
# model, MTP/EAGLE heads, and n-gram lookup in the prompt (which drafts nothing on text that never repeats).
SMOKE_PROMPT = "Repeat after me. " + " ".join(["one two three four five six seven eight."] * 8)
SMOKE_PROMPT_TOKENS = len(SMOKE_PROMPT.split())

FROM_RESPONSE = {
    "sglang": "meta_info.spec_verify_ct",
    "openai": "llama.cpp timings",
    "chat": "llama.cpp timings",
}
# The record's spec_source (specload.core.records.SPEC_*) -> the response field it came from.
FROM_SPEC_SOURCE = {
    "vllm_metrics": "metrics.speculative_decoding",
    "meta_info": "meta_info.spec_verify_ct",
    "sglext": "sglext.spec_tokens_details",
    "timings": "llama.cpp timings",
}
FROM_COUNTERS = "/metrics spec_decode counters"


@dataclass(frozen=True)
class SmokeResult:
    ok: bool  # the request succeeded
    reason: str | None  # why not (the record's reason), when not ok
    output_tokens: int
    accept_length: float | None  # tokens per verify step; None: acceptance cannot be seen
    source: str | None  # where accept_length came from (FROM_RESPONSE's values, FROM_COUNTERS)
    model: str | None
    backend: str
    drafted: bool = True  # False: the spec_decode counters show no draft proposed at all

    @property
    def active(self) -> bool:
        """Some draft token was accepted (more than one token per verify step)."""
        return self.accept_length is not None and self.accept_length > 1.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "active": self.active}


def speculation_problem(label: str, r: SmokeResult) -> str | None:
    """Why a speculative arm cannot be swept as one; None when its speculation is seen working."""
    if not r.ok:
        return f"the smoke request to {label} failed: {r.reason}"
    if r.active:
        return None
    if r.accept_length is None:
        return (
            f"speculation on {label} cannot be seen on this endpoint: its responses carry no "
            f"spec_verify_ct or llama.cpp timings (backend {r.backend}) and its /metrics "
            "has no spec_decode counters; use the sglang backend on SGLang, or a server that exports them"
        )
    what = "no draft token accepted" if r.drafted else "no draft token proposed"
    return (
        f"speculation is not active on {label}: accept length {r.accept_length:.2f} from {r.source} "
        f"over {r.output_tokens} tokens ({what}); check its speculative flags"
    )


def _metrics(host: str, insecure: bool, timeout: float) -> dict[str, float | None] | None:
    client = make_client(host, timeout, timeout, insecure)
    try:
        resp = client.get(endpoint(host, "/metrics"), headers=base_headers(stream=False))
        body = resp.read()
        resp.release()
    except Exception:  # noqa: BLE001 - no /metrics is a server without counters, not an error
        return None
    finally:
        client.close()
    return parse_metrics(body.decode("utf-8", "replace")) if resp.status_code == 200 else None


def _sample(t: float, values: dict[str, float | None] | None) -> ServerSample | None:
    if values is None:
        return None
    return ServerSample(
        t=t,
        spec_num_drafts=values.get("spec_num_drafts"),
        spec_num_draft_tokens=values.get("spec_num_draft_tokens"),
        spec_num_accepted_tokens=values.get("spec_num_accepted_tokens"),
    )


def smoke_check(host: str, sc: Scenario, insecure: bool = False) -> SmokeResult:
    """One short streaming request with the sweep's backend, model and sampling; raises
    ServerUnreachable when the server does not answer at all."""
    backend = get_backend(sc.backend)
    model = sc.model
    if model is None:
        model, _how = discover_model(host, sc.connect_timeout_s, insecure)
    body = backend.body(SMOKE_PROMPT, SMOKE_OUTPUT_TOKENS, model, sc.temperature, sc.extra_body)
    spec = RequestSpec(
        level=-1,
        concurrency=0,
        phase="smoke",
        seq=0,
        repeat=0,
        requested_output_tokens=SMOKE_OUTPUT_TOKENS,
        requested_prompt_tokens=SMOKE_PROMPT_TOKENS,
    )
    before = _sample(0.0, _metrics(host, insecure, sc.connect_timeout_s))
    client = make_client(host, sc.read_timeout_s, sc.connect_timeout_s, insecure)
    try:
        rec = stream_request(
            client,
            endpoint(host, backend.path),
            body,
            base_headers(True),
            backend,
            spec,
            "smoke",
            sc.read_timeout_s,
            sc.connect_timeout_s,
        )
    finally:
        client.close()
    if rec.status != OK:
        if rec.http_status is None and rec.chunks == 0 and rec.t_first is None:
            # no answer at all: the caller says the server went away
            raise ServerUnreachable(f"{host}{backend.path}: {rec.reason}")
        return SmokeResult(False, rec.reason, rec.output_tokens, None, None, model, sc.backend)
    accept, _used = accept_length_from_records([rec])
    drafted = True
    named = FROM_SPEC_SOURCE.get(rec.spec_source or "", FROM_RESPONSE[sc.backend])  # the record says which
    source: str | None = named if accept is not None else None
    if accept is None:
        after = _sample(1.0, _metrics(host, insecure, sc.connect_timeout_s))
        if before is not None and after is not None:
            accept = accept_length_from_counters([before, after], 0.0, 1.0)
            if accept is None and after.spec_num_drafts is not None:
                accept = 1.0  # the counters exist and did not move: no draft was made, none accepted
                drafted = False
            source = FROM_COUNTERS if accept is not None else None
    return SmokeResult(True, None, rec.output_tokens, accept, source, model, sc.backend, drafted)
