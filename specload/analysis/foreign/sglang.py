"""SGLang ``bench_serving --output-file`` (JSON lines, one line per run; ``--output-details`` adds
the per-request lists). Field names as sglang/benchmark/serving.py writes them (SGLang 0.5.23).

The file has no failed count and no per-request E2E: Per-req tok/s is left out, and the failed
requests are counted from ``errors`` only when the details are there.
"""

from __future__ import annotations

import msgspec

from specload.analysis.foreign.level import ForeignLevel
from specload.analysis.foreign.marks import Mark

TOOL = "sglang bench_serving"
NATIVE = ("sglang", "sglang-native")  # backends that stream SGLang's /generate (per-token ITL)


class SglangResult(msgspec.Struct):
    duration: float
    completed: int
    total_output_tokens: int
    output_throughput: float
    request_throughput: float
    backend: str | None = None
    max_concurrency: int | None = None
    request_rate: float | str | None = None
    random_output_len: int | None = None
    median_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    median_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    p99_itl_ms: float | None = None
    median_e2e_latency_ms: float | None = None
    p99_e2e_latency_ms: float | None = None
    accept_length: float | None = None
    errors: list[str | None] | None = None


def looks_like(obj: dict[str, object]) -> bool:
    return "output_throughput" in obj and "mean_e2e_latency_ms" in obj


def _level(r: SglangResult) -> ForeignLevel:
    failed = sum(1 for e in r.errors if e) if r.errors is not None else 0
    rate = None if r.max_concurrency is not None or r.request_rate in (None, "inf") else float(r.request_rate)
    return ForeignLevel(
        concurrency=r.max_concurrency or (len(r.errors) if r.errors else r.completed),
        rate=rate,
        sent=r.completed + failed,
        ok=r.completed,
        failed=failed,
        output_tokens=r.total_output_tokens,
        wall_s=r.duration,
        agg_tok_s=r.output_throughput,
        ttft_p50_ms=r.median_ttft_ms,
        ttft_p99_ms=r.p99_ttft_ms,
        tpot_p50_ms=r.median_tpot_ms,
        tpot_p99_ms=r.p99_tpot_ms,
        itl_p99_ms=r.p99_itl_ms,
        e2e_p50_s=None if r.median_e2e_latency_ms is None else r.median_e2e_latency_ms / 1e3,
        e2e_p99_s=None if r.p99_e2e_latency_ms is None else r.p99_e2e_latency_ms / 1e3,
        req_s=r.request_throughput,
        accept_length=r.accept_length if r.accept_length and r.accept_length > 0 else None,
    )


def marks(results: list[SglangResult]) -> list[Mark]:
    out = [
        Mark(
            "tpot_p50",
            "(E2E − TTFT)/(N − 1) with E2E ending at the stream's last line ([DONE]), not at the last token",
        ),
        Mark(
            "agg",
            "output_throughput: the successful requests' tokens over the whole benchmark's duration; "
            "without --output-details the file does not say how many failed",
        ),
    ]
    if any((r.backend or "") not in NATIVE for r in results):
        out.append(
            Mark(
                "itl_p99",
                "per stream chunk on OpenAI-style backends (a chunk's gap, whatever it carries), "
                "retokenized per token only for speculative sglang-oai runs",
            )
        )
    return out


def read(objs: list[dict[str, object]]) -> tuple[list[ForeignLevel], list[Mark], dict[str, str | None]]:
    results = [msgspec.convert(o, SglangResult) for o in objs]
    return [_level(r) for r in results], marks(results), {"backend": results[0].backend, "model": None}
