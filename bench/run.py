"""``make bench``: the client's CPU cost and the analysis side's scale, as one table against the goals.

1. Client cost (bench/client_cost.py): one Locust process (``specload sweep``, no ``--processes``)
   pinned to one core against the simulator on the other: CPU per streamed token and per request,
   TTFT p50 over the simulator's exact 50 ms, aggregate tok/s vs the exact rate.
2. Analysis scale (bench/analysis_scale.py): ``specload report`` and ``specload compare`` on
   synthetic runs of N records each: wall time and peak RSS, per run and per 1M records, and
   scaled to the goal's 5M.
3. Trace replay (bench/trace_replay.py): the trace readers on the whole real files (when
   shared/data/traces is there), and a minute of Mooncake's conversation trace replayed against
   the simulator: send lateness p99 vs due + 5 ms, prefix-cache hit rate vs the trace's ideal.

A benchmark, not a test: it prints figures and PASS / MISS against the goals, and exits 0 whatever
they are (1 only when something could not be measured). The machine's other load is printed
with the figures; CPU *time* per unit of work is little affected by it, wall-clock figures are.

    .venv/bin/python -m bench.run                     # ~3 min: three levels, 500k-record runs
    .venv/bin/python -m bench.run --records 5000000   # the analysis goal at full size (~7 GB of cached runs)
    .venv/bin/python -m bench.run --quick             # a smoke run: one tiny level, 20k records
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import analysis_scale, client_cost, trace_replay  # noqa: E402
from bench.client_cost import Row, print_table, verdict  # noqa: E402


def analysis_rows(scales: list[analysis_scale.Scale]) -> list[Row]:
    goal_n = analysis_scale.GOAL_RECORDS
    out: list[Row] = []
    for s in scales:
        cmd = f"specload {s.what}" + (" (2 runs)" if s.what.startswith("compare") else "")
        big = s.big
        where = f"{big.records / 1e6:g}M records per run"
        busy = f", others {big.others:.1f} cores" if big.others >= 0.2 else ""
        out.append(
            Row(
                f"{cmd}: wall time",
                where,
                f"{big.wall_s:.1f} s ({s.per_m('wall_s'):.1f} s per 1M{busy})",
                "-",
                "-",
            )
        )
        out.append(
            Row(
                f"{cmd}: CPU time",
                where,
                f"{big.cpu_s:.1f} s ({s.per_m('cpu_s'):.1f} s per 1M), all processes",
                "-",
                "-",
            )
        )
        out.append(
            Row(
                f"{cmd}: peak RSS",
                where,
                f"{big.tree_mb:.0f} MB all processes ({big.peak_mb:.0f} MB the "
                f"largest; {s.per_m('tree_mb'):.0f} MB per 1M)",
                "-",
                "-",
            )
        )
        t5, c5, m5 = s.at(goal_n)
        if big.records == goal_n:
            how = "measured"
        elif s.small is None:
            how = f"scaled from {big.records:,} records"
        else:
            how = f"scaled from {s.small.records:,} and {big.records:,} records"
        # The wall time is the figure; other processes on the machine lengthen it (shown above,
        # and flagged with the verdict).
        flag = f" (others {big.others:.1f} cores)" if big.others >= 0.2 else ""
        out.append(
            Row(
                f"{cmd}: at 5M records, time",
                how,
                f"{t5:.0f} s wall ({c5:.0f} s CPU)",
                f"< {analysis_scale.GOAL_S:g} s",
                verdict(t5 < analysis_scale.GOAL_S) + flag,
            )
        )
        out.append(
            Row(
                f"{cmd}: at 5M records, memory",
                how,
                f"{m5:.0f} MB",
                f"< {analysis_scale.GOAL_MB:g} MB",
                verdict(m5 < analysis_scale.GOAL_MB),
            )
        )
    return out


def machine() -> str:
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    return (
        f"{platform.node()}: {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
        f"Python {platform.python_version()}, load average {load} at the start"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument(
        "--quick", action="store_true", help="smoke run: one tiny level and 20k records (not a measurement)"
    )
    p.add_argument(
        "--records", type=int, default=None, help="records per synthetic run (default 500000; quick 20000)"
    )
    p.add_argument("--repeat", type=int, default=1, help="runs of each client level; the median is shown")
    p.add_argument("--no-client", action="store_true", help="skip the client cost part")
    p.add_argument("--no-analysis", action="store_true", help="skip the analysis scale part")
    p.add_argument("--no-trace", action="store_true", help="skip the trace replay part")
    p.add_argument(
        "--traces", default=None, help="the real traces' folder (default: shared/data/traces found)"
    )
    p.add_argument("--keep", default=None, help="keep run directories and logs here (default: removed)")
    p.add_argument(
        "--cache",
        default=str(analysis_scale.CACHE),
        help="where the analysis part keeps its synthetic runs of 200k records or more",
    )
    p.add_argument("--no-cache", action="store_true", help="write the analysis part's runs anew, delete them")
    args = p.parse_args(argv)
    records = args.records or (20_000 if args.quick else 500_000)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="specload-bench-"))
    work.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    started = time.monotonic()
    conditions = [machine()]
    table: list[Row] = []
    try:
        if not args.no_client:
            levels = client_cost.QUICK if args.quick else client_cost.FULL
            results, pin = client_cost.measure(levels, args.repeat, work / "client", log)
            table += client_cost.rows(results)
            conditions += client_cost.conditions(results, pin)
        if not args.no_analysis:
            cache = None if args.quick or args.no_cache else Path(args.cache)
            scales, gen_s = analysis_scale.measure(
                records, work / "analysis", log, fixed_part=not args.quick, cache=cache
            )
            table += analysis_rows(scales)
            made = f"written in {gen_s:.0f} s" if gen_s >= 1 else "found"
            conditions.append(
                f"analysis: synthetic runs of {records:,} records (~730 bytes each; {made}, "
                f"{'kept in ' + str(cache) if cache else 'removed after'}); "
                "`specload report A --no-write`, `specload compare A B --no-plot`, each in a fresh "
                "process (one core: numpy columns); CPU time, peak RSS "
                "(rusage), peak memory (PSS, sampled every 0.1 s)"
            )
        if not args.no_trace:
            window = 10.0 if args.quick else 60.0
            rows, cond = trace_replay.measure(args.traces, 600.0, window, None, log)
            table += rows
            conditions += cond
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n## specload bench{' (quick: a smoke run, not a measurement)' if args.quick else ''}\n")
    print_table(table)
    print("\nConditions:")
    for line in conditions:
        print(f"- {line}")
    print(f"- bench wall time {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
