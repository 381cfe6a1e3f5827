"""specload's own results as llm-d Benchmark Reports (v0.2): one report per level.

``python -m specload.present.llmd RUN_DIR [--out DIR]`` writes ``llmd-<level>.json`` for every
level of a run. A v0.2 report describes one load stage (``scenario.load.standardized``: the
concurrency or the rate, the requested lengths) and its aggregate results, so each specload level
(one concurrency or rate, one repeat) is one report. The figures are specload's, by their
definitions in docs/metrics.md: TTFT, TPOT (``time_per_output_token``), ITL
(``inter_token_latency``, per event on OpenAI-style streams: ``itl_unit`` in
``scenario.load.native.config`` says which) and E2E (``request_latency``) as distributions over the
OK requests; the throughputs as rates over the level's wall time (mean only). Per-req tok/s, the
steady window, accept length and the comparisons have no field in v0.2 and are left out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from specload.analysis.metrics import Dist, LevelStats
from specload.analysis.run import NotARunDir, Run, load_run
from specload.workload.recorded import recorded_scenario

VERSION = "0.2"
# specload's percentile -> the v0.2 Statistics key
_P_KEYS = {0.1: "p0p1", 1.0: "p1", 5.0: "p5", 10.0: "p10", 25.0: "p25", 50.0: "p50", 75.0: "p75"}
_P_KEYS |= {90.0: "p90", 95.0: "p95", 99.0: "p99", 99.9: "p99p9"}


def _stats(d: Dist | None, units: str) -> dict[str, Any] | None:
    """A v0.2 Statistics from a distribution (seconds); None without values."""
    if d is None or not d.n or d.mean is None:
        return None
    out: dict[str, Any] = {"units": units, "mean": d.mean}
    if d.std is not None:
        out["stddev"] = d.std
    out |= {_P_KEYS[q]: v for q, v in d.p.items() if q in _P_KEYS}
    return out


def _rate(v: float | None, units: str) -> dict[str, Any] | None:
    return None if v is None else {"units": units, "mean": v}


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seq(n: int | None) -> dict[str, Any] | None:
    return None if not n else {"distribution": "fixed", "value": n}


def level_report(run: Run, s: LevelStats, stage: int) -> dict[str, Any]:
    """The v0.2 report of one level of ``run`` (the ``stage``-th of its levels)."""
    m = run.info
    eid = hashlib.md5(str(run.run_dir.resolve()).encode()).hexdigest()
    load = _drop_none(
        {
            "tool": "specload",
            "tool_version": m.specload_version or "unknown",
            "source": "sampled" if (sc := recorded_scenario(m)) and sc.dataset else "random",
            "stage": stage,
            "input_seq_len": _seq(s.requested_prompt_tokens) or {"distribution": "other", "value": 1},
            "output_seq_len": _seq(s.requested_output_tokens),
            "rate_qps": s.rate,
            "concurrency": None if s.rate is not None else s.concurrency,
        }
    )
    latency = _drop_none(
        {
            "time_to_first_token": _stats(s.dists.get("ttft"), "s"),
            "time_per_output_token": _stats(s.dists.get("tpot"), "s/token"),
            "inter_token_latency": _stats(s.dists.get("itl"), "s/token"),
            "request_latency": _stats(s.dists.get("e2e"), "s"),
        }
    )
    throughput = _drop_none(
        {
            "input_token_rate": _rate(s.input_tok_s, "tokens/s"),
            "output_token_rate": _rate(s.agg_tok_s, "tokens/s"),
            "total_token_rate": _rate(s.total_tok_s, "tokens/s"),
            "request_rate": _rate(s.req_s, "queries/s"),
        }
    )
    requests: dict[str, Any] = {"total": s.sent, "failures": s.failed, "incomplete": s.short}
    if s.prompt_tokens_mean is not None:
        requests["input_length"] = {"units": "count", "mean": s.prompt_tokens_mean}
    return {
        "version": VERSION,
        "run": _drop_none(
            {
                "uid": hashlib.md5(f"{eid}/{s.label}".encode()).hexdigest(),
                "eid": eid,
                "time": _drop_none({"start": _iso(m.started_at), "end": _iso(m.ended_at)}) or None,
            }
        ),
        "scenario": {
            "load": {
                "metadata": {"schema_version": "0.0.1", "description": f"specload {m.label or ''} {s.label}"},
                "standardized": load,
                "native": {"config": {"scenario": m.scenario, "level": s.label, "itl_unit": s.itl_unit}},
            }
        },
        "results": {
            "request_performance": {
                "aggregate": _drop_none(
                    {"requests": requests, "latency": latency or None, "throughput": throughput or None}
                )
            }
        },
    }


def reports(run: Run) -> list[tuple[str, dict[str, Any]]]:
    """(level label, its report) for every measured level, in the run's order."""
    return [(s.label, level_report(run, s, i)) for i, s in enumerate(run.levels) if s.sent > 0]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m specload.present.llmd",
        description="Write a run's levels as llm-d Benchmark Reports v0.2, one JSON file per level.",
    )
    p.add_argument("run", metavar="RUN_DIR")
    p.add_argument("--out", metavar="DIR", help="where to write llmd-<level>.json (default: RUN_DIR)")
    args = p.parse_args(argv)
    try:
        run = load_run(args.run)
    except NotARunDir as e:
        print(f"specload llmd: {e}", file=sys.stderr)
        return 2
    out = Path(args.out or args.run)
    out.mkdir(parents=True, exist_ok=True)
    for label, doc in reports(run):
        path = out / f"llmd-{label}.json"
        path.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
