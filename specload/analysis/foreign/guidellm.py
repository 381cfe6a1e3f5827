"""GuideLLM's JSON report (``--output kind=json``; GuideLLM 0.8, report metadata version 2).

Each benchmark keeps its requests (``requests.successful``/``errored``/``incomplete``) with their
own timings, so every figure here is specload's definition computed from GuideLLM's per-request
fields; only the names differ: GuideLLM's ``inter_token_latency_ms`` is specload's TPOT, and its
``time_per_output_token_ms`` (E2E / N, TTFT included) is not shown.
"""

from __future__ import annotations

import msgspec

from specload.analysis.foreign.level import ForeignLevel, mean_of, pct, per_request_tok_s
from specload.analysis.foreign.marks import Mark

TOOL = "guidellm"


class GuideRequest(msgspec.Struct):
    request_start_time: float | None = None
    request_end_time: float | None = None
    request_latency: float | None = None
    output_tokens: int | None = None
    time_to_first_token_ms: float | None = None
    inter_token_latency_ms: float | None = None


class GuideRequests(msgspec.Struct):
    successful: list[GuideRequest] = []
    errored: list[GuideRequest] = []
    incomplete: list[GuideRequest] = []


class GuideStrategy(msgspec.Struct):
    type_: str
    streams: int | None = None
    max_concurrency: int | None = None
    rate: float | None = None


class GuideConfig(msgspec.Struct):
    strategy: GuideStrategy


class GuideBenchmark(msgspec.Struct):
    config: GuideConfig
    requests: GuideRequests
    duration: float | None = None


class GuideReport(msgspec.Struct):
    benchmarks: list[GuideBenchmark]


def looks_like(obj: dict[str, object]) -> bool:
    meta = obj.get("metadata")
    return "benchmarks" in obj and isinstance(meta, dict) and "guidellm_version" in meta


def _level(b: GuideBenchmark) -> ForeignLevel:
    ok = b.requests.successful
    every = ok + b.requests.errored + b.requests.incomplete
    starts = [r.request_start_time for r in every if r.request_start_time is not None]
    ends = [r.request_end_time for r in every if r.request_end_time is not None]
    wall = max(ends) - min(starts) if starts and ends else None
    tokens = sum(r.output_tokens or 0 for r in every)
    done = [r for r in ok if r.request_latency and r.output_tokens is not None]
    s = b.config.strategy
    c = s.streams or s.max_concurrency or 0
    ttft = [r.time_to_first_token_ms for r in ok if r.time_to_first_token_ms is not None]
    tpot = [r.inter_token_latency_ms for r in ok if r.inter_token_latency_ms is not None]
    e2e = [r.request_latency for r in done if r.request_latency is not None]
    return ForeignLevel(
        concurrency=c,
        rate=s.rate if s.type_ in ("constant", "poisson") else None,
        sent=len(every),
        ok=len(ok),
        failed=len(b.requests.errored),
        output_tokens=tokens,
        wall_s=wall,
        agg_tok_s=tokens / wall if wall else None,
        per_req_tok_s=per_request_tok_s([r.output_tokens or 0 for r in done], e2e),
        ttft_p50_ms=pct(ttft, 50),
        ttft_p99_ms=pct(ttft, 99),
        tpot_p50_ms=pct(tpot, 50),
        tpot_p99_ms=pct(tpot, 99),
        e2e_p50_s=pct(e2e, 50),
        e2e_p99_s=pct(e2e, 99),
        req_s=len(ok) / wall if wall else None,
        extra={"e2e_mean_s": mean_of(e2e) or 0.0},
    )


def marks(report: GuideReport) -> list[Mark]:
    out = [
        Mark(
            "tpot_p50",
            "named ITL by GuideLLM (inter_token_latency_ms = (last token − first token)/(N − 1), "
            "specload's TPOT); GuideLLM's own TPOT (time_per_output_token_ms) includes TTFT",
        )
    ]
    if any(b.requests.incomplete for b in report.benchmarks):
        out.append(
            Mark(
                "agg",
                "the level's span includes the requests GuideLLM cancelled at its end (incomplete), "
                "their delivered tokens counted",
            )
        )
    return out


def read(obj: dict[str, object]) -> tuple[list[ForeignLevel], list[Mark], dict[str, str | None]]:
    report = msgspec.convert(obj, GuideReport)
    return [_level(b) for b in report.benchmarks], marks(report), {"model": None, "backend": None}
