"""``make bench``, trace replay: the readers on whole real files, and a replay that keeps its schedule.

1. Whole files (when the shared copies are there: ``--traces DIR``, ``$SPECLOAD_TRACE_DATA``, else
   ``shared/data/traces`` beside or above this checkout): each Mooncake and Azure file read by its
   reader, its request count, token totals and span against the same figures computed here with
   the json and csv modules alone; Mooncake's blocks checked to be 512 tokens (every row has
   ceil(input / 512) ids); the file refused when read as a generic file in seconds.
2. Replay: a window of Mooncake's conversation trace (one minute of trace time from minute 10 by
   default, at its own speed) against the simulator with a prefix cache, each pinned to a CPU of its
   own (bench.client_cost.pinning; with --processes only the simulator): every request's send
   lateness (t_send - t_sched) p50 / p99 / max against the goal of p99 within due + 5 ms on a
   quiet machine, and the simulator's prefix-cache hit rate against the trace's ideal one.

A benchmark, not a test: it prints figures with PASS / MISS and the machine's load, whatever they are.

    .venv/bin/python -m bench.trace_replay [--window-start 600] [--window 60] [--processes N]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.client_cost import Row, child_env, pinning, print_table, verdict  # noqa: E402
from specload.sim import process as simproc  # noqa: E402

GOAL_P99_MS = 5.0
CONVERSATION = "mooncake/conversation_trace.jsonl"


def traces_dir(given: str | None) -> Path | None:
    for cand in (
        given,
        os.environ.get("SPECLOAD_TRACE_DATA"),
        REPO.parent / "shared" / "data" / "traces",
        REPO.parent.parent / "shared" / "data" / "traces",
    ):
        if cand and (Path(cand) / CONVERSATION).is_file():
            return Path(cand)
    return None


def _independent_jsonl(path: Path) -> tuple[int, int, int, float]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    ts = [r["timestamp"] for r in rows]
    return (
        len(rows),
        sum(r["input_length"] for r in rows),
        sum(r["output_length"] for r in rows),
        (max(ts) - min(ts)) / 1000,
    )


def _independent_csv(path: Path) -> tuple[int, int, int, float]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    ts = [datetime.fromisoformat(r["TIMESTAMP"][:26]).timestamp() for r in rows]  # (6 decimals: to the µs)
    return (
        len(rows),
        sum(int(r["ContextTokens"]) for r in rows),
        sum(int(r["GeneratedTokens"]) for r in rows),
        max(ts) - min(ts),
    )


def whole_files(root: Path) -> list[Row]:
    from specload.workload.traces import Layout, TraceError, read_trace

    out: list[Row] = []
    files = [("mooncake", p) for p in sorted((root / "mooncake").glob("*.jsonl"))] + [
        ("azure", p) for p in sorted((root / "azure-2023").glob("*.csv"))
    ]
    for fmt, p in files:
        t0 = time.perf_counter()
        t = read_trace(p, fmt)
        took = time.perf_counter() - t0
        n, tin, tout, span = (_independent_jsonl if fmt == "mooncake" else _independent_csv)(p)
        ok = (
            len(t.requests) == n
            and t.input_tokens == tin
            and t.output_tokens == tout
            and abs(t.span_s - span) < 1e-3
        )
        extra = ""
        if fmt == "mooncake":
            blocks = all(len(r.hash_ids) == math.ceil(r.input_tokens / 512) for r in t.requests)
            try:
                read_trace(p, "jsonl", Layout("s"))
                refused = False
            except TraceError:
                refused = True
            ok = ok and blocks and refused and t.time_unit == "ms" and t.block_size == 512
            extra = f"; ms, 512-token blocks {'all rows' if blocks else 'NOT all rows'}; as seconds: {'refused' if refused else 'ACCEPTED'}"
        out.append(
            Row(
                f"trace reader: {p.parent.name}/{p.name}",
                fmt,
                f"{len(t.requests):,} requests, {t.input_tokens:,} in / {t.output_tokens:,} out tokens, "
                f"{t.span_s:.1f} s span{extra}; read in {took:.2f} s",
                "= the file (json/csv)",
                verdict(ok),
            )
        )
    return out


def replay(
    root: Path, work: Path, start_s: float, window_s: float, processes: int | None, log: Callable[[str], None]
) -> tuple[list[Row], list[str]]:
    from specload.core.records import read_records
    from specload.core.rundir import read_run_meta
    from specload.core.stats import percentiles

    trace = root / CONVERSATION
    # The simulator and one Locust process each on a CPU of their own, as client_cost runs them: a
    # server never shares the load generator's machine, and here the simulator, woken by each send
    # onto the sender's CPU, took it for a scheduler tick (~4 ms) in the middle of a burst. With
    # --processes, only the simulator is pinned (the processes spread over what is left).
    sim_prefix, client_prefix, pin = pinning()
    if processes:
        client_prefix, pin = [], pin.split(",")[0] + ", Locust processes unpinned"
    sim = simproc.start_sim(
        [
            "--model",
            "m",
            "--ttft-ms",
            "20",
            "--itl-ms",
            "2",
            "--max-running",
            "1024",
            "--max-model-len",
            "1000000",
            "--prefix-cache-tokens",
            "100000000",
            "--prefix-cache-block",
            "16",
            "--cache-report",
        ],
        timeout=30,
        prefix=sim_prefix,
        env=child_env(),
    )
    load_before = os.getloadavg()
    try:
        cmd = [
            *client_prefix,
            sys.executable,
            "-m",
            "specload",
            "sweep",
            "--host",
            sim.url,
            "--trace",
            str(trace),
            "--trace-format",
            "mooncake",
            "--trace-start",
            str(start_s),
            "--trace-duration",
            str(window_s),
            "--read-timeout",
            "120",
            "--out",
            str(work),
            *(["--processes", str(processes)] if processes else []),
        ]
        log(f"trace replay: {window_s:g} s of {CONVERSATION} from {start_s:g} s against the simulator")
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=window_s * 3 + 300, env=child_env())
    finally:
        sim.stop()
    load_after = os.getloadavg()
    if res.returncode != 0:
        raise RuntimeError(f"the replay failed: {res.stderr[-2000:]}")
    (run_dir,) = [d for d in work.iterdir() if d.is_dir()]
    recs = [r for r in read_records(str(run_dir / "records.jsonl")) if r.trace_index is not None]
    meta = read_run_meta(run_dir).trace
    lag = [(r.t_send - r.t_sched) * 1e3 for r in recs if r.t_sched is not None]
    p50, p99 = percentiles(lag, (50.0, 99.0))
    # The trace's bursts (requests due at one instant) are sent one after another by one process:
    # the first of each instant shows the client's wake-up alone.
    from specload.workload.traces import read_trace

    arrival = {q.index: q.arrival_s for q in read_trace(trace, "mooncake").requests}
    firsts: dict[float, float] = {}
    for r in sorted((r for r in recs if r.t_sched is not None), key=lambda r: r.t_send):
        firsts.setdefault(arrival[r.trace_index or 0], (r.t_send - (r.t_sched or 0.0)) * 1e3)
    (first_p99,) = percentiles(list(firsts.values()), (99.0,))
    served = sum(r.cached_tokens or 0 for r in recs) / max(1, sum(r.prompt_tokens or 0 for r in recs))
    ideal = meta.get("ideal_hit_rate") or 0.0
    where = f"{len(recs)} requests, {window_s:g} s from {start_s:g} s" + (
        f", --processes {processes}" if processes else ""
    )
    rows = [
        Row(
            "trace replay: send lateness p99",
            where,
            f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {max(lag):.2f} ms; the first request of each of the "
            f"{len(firsts)} due instants: p99 {first_p99:.2f} ms",
            f"p99 <= {GOAL_P99_MS:g} ms (quiet machine)",
            verdict(p99 is not None and p99 <= GOAL_P99_MS),
        ),
        Row(
            "trace replay: prefix-cache hit rate",
            where,
            f"simulator {served:.1%} vs the trace's ideal {ideal:.1%}",
            "near the ideal, not above it",
            verdict(0.8 * ideal <= served <= ideal + 0.005),
        ),
        Row(
            "trace replay: lengths exact",
            where,
            f"{sum(1 for r in recs if r.prompt_tokens == r.requested_prompt_tokens)} of {len(recs)} prompts, "
            f"{sum(1 for r in recs if r.output_tokens == r.requested_output_tokens)} outputs",
            "all",
            verdict(
                all(
                    r.prompt_tokens == r.requested_prompt_tokens
                    and r.output_tokens == r.requested_output_tokens
                    for r in recs
                )
            ),
        ),
    ]
    cond = [
        f"trace replay: load average {load_before[0]:.2f} before, {load_after[0]:.2f} after, on {os.cpu_count()} "
        "CPUs (other work on the machine delays the client's wake-ups: lateness is a quiet machine's goal); "
        f"simulator TTFT 20 ms, ITL 2 ms, prefix cache of 16-token blocks; {pin}"
    ]
    return rows, cond


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--traces", default=None, help="the folder of real traces (mooncake/, azure-2023/)")
    p.add_argument("--window-start", type=float, default=600.0, help="trace seconds before the window")
    p.add_argument("--window", type=float, default=60.0, help="trace seconds replayed")
    p.add_argument("--processes", type=int, default=None, help="Locust worker processes")
    args = p.parse_args(argv)
    rows, cond = measure(
        args.traces, args.window_start, args.window, args.processes, lambda m: print(m, file=sys.stderr)
    )
    print_table(rows)
    print("\nConditions:")
    for line in cond:
        print(f"- {line}")
    return 0


def measure(
    given: str | None, start_s: float, window_s: float, processes: int | None, log: Callable[[str], None]
) -> tuple[list[Row], list[str]]:
    root = traces_dir(given)
    if root is None:
        return [], ["trace replay: skipped (no shared/data/traces beside the checkout; --traces DIR)"]
    rows = whole_files(root)
    with tempfile.TemporaryDirectory(prefix="specload-trace-bench-") as work:
        more, cond = replay(root, Path(work), start_s, window_s, processes, log)
    return rows + more, cond


if __name__ == "__main__":
    sys.exit(main())
