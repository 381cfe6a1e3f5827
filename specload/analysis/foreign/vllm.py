"""``vllm bench serve --save-result`` (one JSON object) or ``--append-result`` (one per line).

Field names as vllm/benchmarks/serve.py writes them (vLLM 0.32). With ``--save-detailed`` the
per-request lists (output_lens, ttfts, latencies, errors) are there and Per-req tok/s and the TTFT
percentiles are specload's definitions computed from them; without, the tool's own aggregates.
"""

from __future__ import annotations

import msgspec

from specload.analysis.foreign.level import ForeignLevel, ms, pct, per_request_tok_s
from specload.analysis.foreign.marks import Mark

TOOL = "vllm bench serve"


class VllmResult(msgspec.Struct):
    """The fields read; the rest of the file is ignored."""

    duration: float
    completed: int
    total_output_tokens: int
    output_throughput: float
    request_throughput: float
    failed: int = 0  # written since vLLM 0.11
    num_prompts: int | None = None
    max_concurrency: int | None = None
    request_rate: float | str | None = None
    backend: str | None = None
    model_id: str | None = None
    median_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    median_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    p99_itl_ms: float | None = None
    median_e2el_ms: float | None = None
    p99_e2el_ms: float | None = None
    spec_decode_acceptance_length: float | None = None
    output_lens: list[int] | None = None
    ttfts: list[float | None] | None = None
    latencies: list[float | None] | None = None
    errors: list[str] | None = None


def looks_like(obj: dict[str, object]) -> bool:
    return "output_throughput" in obj and "median_ttft_ms" in obj and "server_info" not in obj


def _same_lengths(r: VllmResult) -> None:
    """The per-request lists describe the same requests, one entry each: a file whose lists differ in
    length pairs one request's tokens with another's latency, or runs off the end of one."""
    lists = {"output_lens": r.output_lens, "ttfts": r.ttfts, "latencies": r.latencies, "errors": r.errors}
    lengths = {k: len(v) for k, v in lists.items() if v is not None}
    if len(set(lengths.values())) > 1:
        said = ", ".join(f"{k} {n}" for k, n in lengths.items())
        raise ValueError(f"a {TOOL} result whose per-request lists differ in length ({said})")


def _level(r: VllmResult) -> ForeignLevel:
    _same_lengths(r)
    ok_idx: list[int] = []
    if r.errors is not None and r.output_lens is not None and r.latencies is not None:
        ok_idx = [i for i, e in enumerate(r.errors) if not e]
    tokens = [r.output_lens[i] for i in ok_idx] if r.output_lens is not None else []
    e2e = [float(r.latencies[i] or 0.0) for i in ok_idx] if r.latencies is not None else []
    ttfts = [float(r.ttfts[i] or 0.0) for i in ok_idx] if r.ttfts is not None else []
    rate = None if r.max_concurrency is not None or r.request_rate in (None, "inf") else float(r.request_rate)
    return ForeignLevel(
        concurrency=r.max_concurrency or r.num_prompts or 0,
        rate=rate,
        sent=r.completed + r.failed,
        ok=r.completed,
        failed=r.failed,
        output_tokens=r.total_output_tokens,
        wall_s=r.duration,
        agg_tok_s=r.output_throughput,
        per_req_tok_s=per_request_tok_s(tokens, e2e) if ok_idx else None,
        ttft_p50_ms=ms(pct(ttfts, 50)) if ttfts else r.median_ttft_ms,
        ttft_p99_ms=ms(pct(ttfts, 99)) if ttfts else r.p99_ttft_ms,
        tpot_p50_ms=r.median_tpot_ms,
        tpot_p99_ms=r.p99_tpot_ms,
        itl_p99_ms=r.p99_itl_ms,
        e2e_p50_s=(r.median_e2el_ms or 0) / 1e3 if r.median_e2el_ms is not None else pct(e2e, 50),
        e2e_p99_s=(r.p99_e2el_ms or 0) / 1e3 if r.p99_e2el_ms is not None else pct(e2e, 99),
        req_s=r.request_throughput,
        accept_length=r.spec_decode_acceptance_length,
    )


def marks(results: list[VllmResult]) -> list[Mark]:
    out = [
        Mark(
            "itl_p99",
            "every gap between stream chunks, pooled over requests, whatever a chunk carries: with "
            "several tokens per chunk (speculative decoding, buffered streams) a chunk's gap, not a token's",
        ),
    ]
    if any(r.latencies is not None for r in results):
        out.append(
            Mark(
                "per_req",
                "computed from its per-request latencies, which end at the last chunk with choices "
                "(before the usage chunk and [DONE]), not at the stream's end",
            )
        )
    if any(r.failed for r in results):
        out.append(
            Mark(
                "agg",
                "output_throughput counts the successful requests' tokens only, over the whole "
                "benchmark's duration (failed requests' time included, their tokens not)",
            )
        )
    if any((r.backend or "").endswith("chat") for r in results):
        out += [
            Mark(m, "TTFT ends at the first chunk with choices, which may be a role-only chunk")
            for m in ("ttft_p50", "ttft_p99")
        ]
    return out


def read(objs: list[dict[str, object]]) -> tuple[list[ForeignLevel], list[Mark], dict[str, str | None]]:
    results = [msgspec.convert(o, VllmResult) for o in objs]
    meta = {"model": results[0].model_id, "backend": results[0].backend}
    return [_level(r) for r in results], marks(results), meta
