"""One request to a fresh server: does it answer, and does its speculation accept draft tokens?

Acceptance is read by the one function the report reads it with (``specload.analysis.acceptance``):
from the response itself (vLLM's ``metrics.speculative_decoding``, SGLang's ``meta_info`` or
``sglext``, llama.cpp's ``timings``), and from the server's ``/metrics`` spec_decode counters read
before and after the request (vLLM, llama.cpp). A speculative arm whose server shows neither cannot be
compared as one: the sweep would measure a baseline under a speculative label.

An n-gram drafter proposes only when the text so far repeats itself, so the request asks the model to
copy a passage that repeats: a prompt-lookup drafter finds its n-grams there, and a draft model or
MTP/EAGLE head has an easy continuation to get right. A server whose own configuration says it
speculates, yet whose counters show no draft for this request, is warned about, not refused: the
drafter may simply have found nothing to propose.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from specload.analysis.acceptance import FROM_COUNTERS as ACCEPT_FROM_COUNTERS
from specload.analysis.acceptance import acceptance
from specload.analysis.columns import LevelColumns
from specload.analysis.metrics import ServerSample
from specload.client.backends import get_backend
from specload.client.http import base_headers, endpoint, make_client
from specload.client.introspect import discover_model, parse_metrics
from specload.client.probe import ServerUnreachable
from specload.client.stream import RequestSpec, stream_request
from specload.core.records import OK, PHASE_MEASURE
from specload.workload.config import Scenario

# A passage repeated, the last copy begun: a chat model copies it, a completion model continues it.
# Prompt lookup drafts the tokens that followed the last match of the latest n tokens, so the passage
# (35 tokens) is longer than twice llama.cpp's default n-gram (ngram-simple: 12); 64 output tokens
# give such a drafter several steps to draft in.
SMOKE_OUTPUT_TOKENS = 64
SMOKE_PASSAGE = (
    "The quick brown fox jumps over the lazy dog, then runs across the green field to the old barn, "
    "where the farmer keeps his seven white horses and a small grey cat."
)
SMOKE_PROMPT = (
    "Copy this text exactly, word for word:\n\n" + " ".join([SMOKE_PASSAGE] * 4) + " The quick brown fox"
)
SMOKE_PROMPT_TOKENS = len(SMOKE_PROMPT.split())

# The record's spec_source (specload.core.records.SPEC_*) -> the response field it came from.
FROM_SPEC_SOURCE = {
    "vllm_metrics": "metrics.speculative_decoding",
    "meta_info": "meta_info.spec_verify_ct",
    "sglext": "sglext.spec_tokens_details",
    "timings": "llama.cpp timings",
}
FROM_COUNTERS = "/metrics spec_decode counters"
# Command-line flags that turn speculation on: vLLM's, SGLang's, llama.cpp's (whose --spec-type takes
# "none" too; its -md alone loads a draft model without speculating, tests/real/FINDINGS.md).
SPEC_FLAGS = ("--speculative-config", "--speculative-algorithm", "--spec-default")
SPEC_TYPE_FLAG = "--spec-type"
VLLM_SPEC_COUNTER = "vllm:spec_decode_num_drafts"


@dataclass(frozen=True)
class SmokeResult:
    ok: bool  # the request succeeded
    reason: str | None  # why not (the record's reason), when not ok
    output_tokens: int
    accept_length: float | None  # 1 + accepted / drafting steps; None: acceptance cannot be seen
    source: str | None  # where accept_length came from (FROM_SPEC_SOURCE's values, FROM_COUNTERS)
    model: str | None
    backend: str
    drafted: bool = True  # False: the spec_decode counters show no draft proposed at all
    configured: str | None = None  # why the server is known to speculate (its flags, its counters)
    tokens_per_pass: float | None = None  # output tokens / target passes, where the counts say it
    accept_rate: float | None = None  # accepted / drafted tokens

    @property
    def active(self) -> bool:
        """Some draft token was accepted (more than one token per drafting step, or a response
        that counts accepted drafts where no drafting steps are counted)."""
        if self.accept_length is not None:
            return self.accept_length > 1.0
        return bool(self.accept_rate)

    def seen(self) -> str:
        """What showed the acceptance, for a message: "accept length 2.31 from <source>"."""
        if self.accept_length is None and self.accept_rate is not None:
            return f"accept rate {self.accept_rate:.0%} from {self.source}"
        length = "-" if self.accept_length is None else f"{self.accept_length:.2f}"
        return f"accept length {length} from {self.source}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "active": self.active}


def speculation_problem(label: str, r: SmokeResult) -> str | None:
    """Why a speculative arm cannot be swept as one; None when its speculation is seen working, or
    its server is known to speculate but drafted nothing for this request (speculation_warning)."""
    if not r.ok:
        return f"the smoke request to {label} failed: {r.reason}"
    if r.active or (not r.drafted and r.configured is not None):
        return None
    if r.accept_length is None:
        return (
            f"speculation on {label} cannot be seen on this endpoint: its responses carry no "
            f"acceptance fields (backend {r.backend}) and its /metrics "
            "has no spec_decode counters; use the sglang backend on SGLang, or a server that exports them"
        )
    what = "no draft token accepted" if r.drafted else "no draft token proposed"
    return (
        f"speculation is not active on {label}: {r.seen()} "
        f"over {r.output_tokens} tokens ({what}); check its speculative flags"
    )


def speculation_warning(label: str, r: SmokeResult) -> str | None:
    """A sentence when the server speculates by its own configuration yet drafted nothing for the
    smoke request (an n-gram drafter that found no match): the arm is swept, with this said."""
    if not r.ok or r.drafted or r.configured is None:
        return None
    return (
        f"{label} speculates ({r.configured}), but proposed no draft token for the smoke request "
        f"({r.output_tokens} tokens): its drafter may find nothing to propose in the sweep's prompts either"
    )


def configured_by(argv: Sequence[str], metrics_page: str | None) -> str | None:
    """Why the server is known to speculate, whatever this request drafted: a speculative flag on
    its command line, or vLLM's spec_decode counters (vLLM exports them only when it speculates;
    llama.cpp always does, so its counters say nothing)."""
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag in SPEC_FLAGS:
            return f"{flag} on its command line"
        if flag == SPEC_TYPE_FLAG:
            kind = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if kind and kind != "none":
                return f"{flag} {kind} on its command line"
    if metrics_page is not None and VLLM_SPEC_COUNTER in metrics_page:
        return "vLLM's spec_decode counters"
    return None


def _metrics_page(host: str, insecure: bool, timeout: float) -> str | None:
    client = make_client(host, timeout, timeout, insecure)
    try:
        resp = client.get(endpoint(host, "/metrics"), headers=base_headers(stream=False))
        body = resp.read()
        resp.release()
    except Exception:  # noqa: BLE001 - no /metrics is a server without counters, not an error
        return None
    finally:
        client.close()
    return body.decode("utf-8", "replace") if resp.status_code == 200 else None


def _sample(t: float, page: str | None) -> ServerSample | None:
    if page is None:
        return None
    values = parse_metrics(page)
    return ServerSample(
        t=t,
        spec_num_drafts=values.get("spec_num_drafts"),
        spec_num_draft_tokens=values.get("spec_num_draft_tokens"),
        spec_num_accepted_tokens=values.get("spec_num_accepted_tokens"),
        spec_verify_calls=values.get("spec_verify_calls"),
        generation_tokens=values.get("generation_tokens"),
    )


def smoke_check(host: str, sc: Scenario, insecure: bool = False, argv: Sequence[str] = ()) -> SmokeResult:
    """One short streaming request with the sweep's backend, model and sampling; raises
    ServerUnreachable when the server does not answer at all. ``argv``: the server's command line,
    when specload started it (its speculative flags say it speculates)."""
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
    before = _sample(0.0, _metrics_page(host, insecure, sc.connect_timeout_s))
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
    page = _metrics_page(host, insecure, sc.connect_timeout_s)
    after = _sample(1.0, page)
    samples = [x for x in (before, after) if x is not None]
    # The level's own function, over this request as if it were a level's one measured request.
    a = acceptance(LevelColumns.of([replace(rec, phase=PHASE_MEASURE)]), samples, 0.0, 1.0)
    accept = a.length if a is not None else None
    source: str | None = None
    if a is not None and accept is not None:
        how = a.sources.get("length", "")
        source = (
            FROM_COUNTERS if how == ACCEPT_FROM_COUNTERS else FROM_SPEC_SOURCE.get(how, backend.spec_fields)
        )
    drafted = True
    counted = before is not None and after is not None and after.spec_num_drafts is not None
    if accept is None and not rec.spec_drafted and counted:  # the counters exist and did not move
        accept, source, drafted = 1.0, FROM_COUNTERS, False
    rate = a.rate if a is not None else None
    if accept is None and a is not None and rate is not None:  # drafts counted, not the steps
        source = FROM_SPEC_SOURCE.get(a.sources.get("rate", ""), backend.spec_fields)
    if accept is None and rate is None and rec.spec_drafted == 0:  # the response says it drafted nothing
        accept, drafted = 1.0, False
        source = FROM_SPEC_SOURCE.get(rec.spec_source or "", backend.spec_fields)
    return SmokeResult(
        True,
        None,
        rec.output_tokens,
        accept,
        source,
        model,
        sc.backend,
        drafted,
        configured_by(argv, page),
        a.tokens_per_pass if a is not None else None,
        rate,
    )
