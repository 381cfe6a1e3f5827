"""A genai-bench experiment folder: one JSON per run (scenario × concurrency), each with
``aggregated_metrics`` and ``individual_request_metrics``, beside ``experiment_metadata.json``.
Field names as genai_bench/metrics writes them (genai-bench 0.0.5).

The per-request entries have no timestamps, so Agg tok/s is genai-bench's own whole-run figure;
Per-req tok/s and the TTFT and TPOT percentiles are specload's definitions computed from the
per-request values (seconds, or milliseconds when ``_time_unit`` says so).
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from specload.analysis.foreign.level import ForeignLevel, ms, pct, per_request_tok_s
from specload.analysis.foreign.marks import Mark
from specload.core import safeopen

TOOL = "genai-bench"
METADATA = "experiment_metadata.json"


class GenaiRequest(msgspec.Struct):
    ttft: float | None = None
    tpot: float | None = None
    e2e_latency: float | None = None
    num_output_tokens: int | None = None
    error_code: int | None = None


class GenaiAggregated(msgspec.Struct):
    run_duration: float
    mean_output_throughput_tokens_per_s: float
    requests_per_second: float
    num_completed_requests: int
    num_error_requests: int = 0
    num_requests: int = 0
    num_concurrency: int | None = None
    scenario: str | None = None


class GenaiRun(msgspec.Struct):
    aggregated_metrics: GenaiAggregated
    individual_request_metrics: list[GenaiRequest] = []
    time_unit: str = msgspec.field(default="s", name="_time_unit")


class GenaiMeta(msgspec.Struct):
    api_model_name: str | None = None
    api_backend: str | None = None


def is_experiment(folder: Path) -> bool:
    return (folder / METADATA).is_file()


def run_files(folder: Path) -> list[Path]:
    """The per-run JSON files: every *.json but the metadata, in concurrency order."""
    return sorted(p for p in folder.glob("*.json") if p.name != METADATA)


def _bytes(path: Path) -> bytes:
    """The file through ``safeopen`` (a FIFO or a device among the folder's *.json is refused, not read)."""
    try:
        return safeopen.read_bytes(path)
    except OSError as e:
        raise ValueError(str(e)) from None


def _level(r: GenaiRun) -> ForeignLevel:
    a = r.aggregated_metrics
    scale = 1e-3 if r.time_unit == "ms" else 1.0
    ok = [q for q in r.individual_request_metrics if q.error_code is None and q.e2e_latency]
    e2e = [(q.e2e_latency or 0.0) * scale for q in ok]
    tokens = [q.num_output_tokens or 0 for q in ok]
    ttft = [(q.ttft or 0.0) * scale for q in ok if q.ttft is not None]
    tpot = [(q.tpot or 0.0) * scale for q in ok if q.tpot is not None]
    return ForeignLevel(
        concurrency=a.num_concurrency or 0,
        sent=a.num_requests or a.num_completed_requests + a.num_error_requests,
        ok=a.num_completed_requests,
        failed=a.num_error_requests,
        output_tokens=sum(tokens),
        wall_s=a.run_duration,
        agg_tok_s=a.mean_output_throughput_tokens_per_s,
        per_req_tok_s=per_request_tok_s(tokens, e2e),
        ttft_p50_ms=ms(pct(ttft, 50)),
        ttft_p99_ms=ms(pct(ttft, 99)),
        tpot_p50_ms=ms(pct(tpot, 50)),
        tpot_p99_ms=ms(pct(tpot, 99)),
        e2e_p50_s=pct(e2e, 50),
        e2e_p99_s=pct(e2e, 99),
        req_s=a.requests_per_second,
    )


MARKS = (
    Mark(
        "agg",
        "mean_output_throughput_tokens_per_s: completed requests' tokens over run_duration, the "
        "whole Locust run from its start to its stop, which includes the requests in flight when the "
        "run was stopped (killed, their tokens not counted)",
    ),
    Mark(
        "tpot_p50",
        "(E2E − TTFT)/(N − 1) with E2E ending at the stream's end, not at the last token",
    ),
)


def read(folder: Path) -> tuple[list[ForeignLevel], list[Mark], dict[str, str | None]]:
    runs = [msgspec.json.decode(_bytes(p), type=GenaiRun) for p in run_files(folder)]
    scenarios = sorted({r.aggregated_metrics.scenario or "" for r in runs})
    if len(scenarios) > 1:  # levels of different workloads are no sweep: not repeats of each other
        raise ValueError(f"{folder}: runs of several traffic scenarios ({', '.join(scenarios)}); compare one")
    meta = msgspec.json.decode(_bytes(folder / METADATA), type=GenaiMeta)
    levels = sorted((_level(r) for r in runs), key=lambda f: f.concurrency)
    return levels, list(MARKS), {"model": meta.api_model_name, "backend": meta.api_backend}
