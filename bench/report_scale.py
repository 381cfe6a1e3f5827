"""How long ``specload report`` / ``specload compare`` take on a big run, and how much memory.

Writes a synthetic run directory in the real schema (run.json through ``rundir.write_run_meta``,
records.jsonl made by ``records.make_record``, server_samples.jsonl), then runs ``python -m specload
report DIR --no-write`` (and optionally ``compare A B``) in a child process and prints its wall time
and peak RSS (``os.wait4``'s rusage of that child alone).

The synthetic sweep is closed-loop: each level has C users, each sending its next request when the
previous one ends; replies of ~1000 tokens (ttft ~0.1 s, tpot ~15 ms, so ~15 s each), an ``itl``
histogram of ~10 bins per request, 0.3% failed (some HTTP 429) and 0.3% short, a few warmup requests
per level, records written in the order requests end (as the sweep's owner does). C is chosen so
that each level lasts about ``--level-seconds`` (the tok/s series has one bucket per second).

    python bench/report_scale.py gen /tmp/r500k --records 500000
    python bench/report_scale.py time /tmp/r500k                  # report
    python bench/report_scale.py time /tmp/r500k /tmp/r500k-b     # report of the first, then compare A B
    python bench/report_scale.py all --records 500000 --dir /tmp/rs  # gen two runs + time both

Use the repository's virtualenv; the child runs with the same interpreter and PYTHONPATH.
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import BinaryIO

import orjson

from specload.core import histogram
from specload.core.records import (
    FAILED,
    OK,
    PHASE_MEASURE,
    PHASE_WARMUP,
    SHORT,
    SRC_META,
    make_record,
    record_line,
)
from specload.core.rundir import RECORDS, SERVER_SAMPLES, LevelMeta, RunMeta, ServerInfo, write_run_meta

FIELDS = None  # RequestRecord field names, filled on first use
T0 = 1_764_475_200.0
OUT_TOKENS = 1000
PROMPT_TOKENS = 1024
WARMUP = 8


def _itl_pairs(rng: random.Random, tpot: float, gaps: int) -> list[list[int]]:
    """~10 bins around the request's tpot whose counts add up to ``gaps``."""
    b0 = histogram.bin_of(tpot)
    weights = [rng.random() + (3.0 if abs(i) < 2 else 0.2) for i in range(-4, 6)]
    total = sum(weights)
    counts = [int(gaps * w / total) for w in weights]
    counts[4] += gaps - sum(counts)
    return [[b0 + i - 4, c] for i, c in enumerate(counts) if c > 0]


def _record(rng: random.Random, level: int, c: int, phase: str, seq: int, t_send: float, cap: int) -> dict:
    global FIELDS  # noqa: PLW0603 - filled once, on the first record made
    load = 1.0 + 0.1 * level + (0.5 if c > cap else 0.0)
    ttft = 0.05 * load * rng.lognormvariate(0.0, 0.3)
    tpot = 0.015 * load * rng.uniform(0.9, 1.1)
    u = rng.random()
    status, reason, http, n = OK, None, 200, OUT_TOKENS
    if u < 0.003:
        status, n = FAILED, 0
        http = 429 if u < 0.001 else 503
        reason = f"HTTP {http}: " + ("rate limited" if http == 429 else "service unavailable")
    elif u < 0.006:
        status, reason, n = SHORT, "stream ended without terminator", rng.randrange(2, OUT_TOKENS)
    t_first = t_send + ttft if n else None
    t_last = t_first + tpot * (n - 1) if t_first is not None else None
    t_end = (t_last + 0.0005) if t_last is not None else t_send + 0.02
    itl = _itl_pairs(rng, tpot, n - 1) if n >= 2 else None
    rec = make_record(
        t_send=t_send,
        t_first=t_first,
        t_last=t_last,
        t_end=t_end,
        output_tokens=n,
        level=level,
        concurrency=c,
        phase=phase,
        seq=seq,
        backend="sglang",
        status=status,
        reason=reason,
        http_status=http,
        output_tokens_source=SRC_META,
        prompt_tokens=PROMPT_TOKENS if n else None,
        requested_output_tokens=OUT_TOKENS,
        requested_prompt_tokens=PROMPT_TOKENS,
        chunks=max(0, n - 1) // 2 + 1,
        itl_max_s=tpot * 3 if n >= 2 else None,
        spec_verify_ct=(n * 2) // 5 if n else None,
        worker=f"worker-{seq % 4}",
        itl=itl,
        itl_unit="token" if itl else None,
        first_event_tokens=1 if n else None,
    )
    if FIELDS is None:
        FIELDS = [f.name for f in fields(rec)]
    return {k: getattr(rec, k) for k in FIELDS}


def _run_level(
    f: BinaryIO, rng: random.Random, li: int, c: int, n_meas: int, start: float, cap: int
) -> float:
    """Write one closed-loop level's records (warmup first), in the order they end; its last t_end."""
    heap: list[tuple[float, int, bytes]] = []
    sent = {PHASE_WARMUP: 0, PHASE_MEASURE: 0}
    budget = {PHASE_WARMUP: WARMUP, PHASE_MEASURE: n_meas}

    def send(ts: float, user: int) -> None:
        phase = PHASE_WARMUP if sent[PHASE_WARMUP] < budget[PHASE_WARMUP] else PHASE_MEASURE
        if sent[phase] >= budget[phase]:
            return
        d = _record(rng, li, c, phase, sent[phase], ts, cap)
        sent[phase] += 1
        heapq.heappush(heap, (d["t_end"], user, record_line(d)))

    for u in range(c):
        send(start + u * 0.0005, u)
    end = start
    while heap:
        t_end, user, line = heapq.heappop(heap)
        f.write(line + b"\n")
        end = t_end
        send(t_end + rng.uniform(0.0, 0.002), user)
    return end


def generate(run_dir: Path, n_records: int, n_levels: int, level_seconds: float, seed: int, cap: int) -> None:
    rng = random.Random(seed)
    run_dir.mkdir(parents=True, exist_ok=False)
    per_level = n_records // n_levels
    mean_e2e = 0.1 + 0.015 * OUT_TOKENS
    t = T0
    metas: list[LevelMeta] = []
    samples: list[bytes] = []
    with open(run_dir / RECORDS, "wb") as f:
        for li in range(n_levels):
            n_meas = per_level + (n_records - per_level * n_levels if li == n_levels - 1 else 0)
            c = max(1, round(n_meas * mean_e2e / level_seconds * (1 + 0.25 * li)))
            start = t
            end = _run_level(f, rng, li, c, n_meas, start, cap)
            metas.append(
                LevelMeta(
                    index=li,
                    concurrency=c,
                    budget=n_meas,
                    warmup=WARMUP,
                    t_start=start,
                    t_measure_start=start,
                    t_end=end,
                    status="completed",
                    granted=n_meas,
                    received=n_meas,
                    granted_warmup=WARMUP,
                    received_warmup=WARMUP,
                )
            )
            s = start
            while s < end:
                samples.append(
                    orjson.dumps({"t": s, "running": float(min(c, cap)), "queued": float(max(0, c - cap))})
                )
                s += 1.0
            t = end + 1.0
    (run_dir / SERVER_SAMPLES).write_bytes(b"\n".join(samples) + b"\n")
    write_run_meta(
        run_dir,
        RunMeta(
            specload_version="bench",
            label=run_dir.name,
            host="http://synthetic",
            backend="sglang",
            model="synthetic",
            started_at=T0,
            ended_at=t,
            status="completed",
            mode="local",
            levels=metas,
            server=ServerInfo({"engine": "synthetic", "max_running_requests": cap}),
            server_metrics="sampled",
        ),
    )


def timed(argv: list[str]) -> tuple[float, float, int]:
    """(wall s, peak RSS MB, exit code) of one child process."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    t = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "specload", *argv], stdout=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss / 1024.0, p.returncode


def _print(what: str, result: tuple[float, float, int]) -> None:
    wall, rss, rc = result
    print(f"{what}: {wall:.1f} s, peak RSS {rss:.0f} MB, exit {rc}", flush=True)


def time_runs(a: Path, b: Path | None) -> None:
    size = (a / RECORDS).stat().st_size / 1e6
    print(
        f"{a}: records.jsonl {size:.0f} MB; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
        flush=True,
    )
    _print(f"specload report {a} --no-write", timed(["report", str(a), "--no-write"]))
    if b is not None:
        out = a.parent / f"cmp-{a.name}-{b.name}"
        _print(f"specload compare {a} {b}", timed(["compare", str(a), str(b), "--out", str(out)]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("dir", type=Path)
    t = sub.add_parser("time")
    t.add_argument("dirs", type=Path, nargs="+")
    a = sub.add_parser("all")
    a.add_argument("--dir", type=Path, required=True)
    for q in (g, a):
        q.add_argument("--records", type=int, default=500_000)
        q.add_argument("--levels", type=int, default=4)
        q.add_argument("--level-seconds", type=float, default=600.0)
        q.add_argument("--seed", type=int, default=1)
        q.add_argument("--cap", type=int, default=100_000, help="server max_running_requests")
    args = p.parse_args()
    if args.cmd == "gen":
        t0 = time.perf_counter()
        generate(args.dir, args.records, args.levels, args.level_seconds, args.seed, args.cap)
        print(f"generated {args.dir} ({args.records} records) in {time.perf_counter() - t0:.0f} s")
    elif args.cmd == "time":
        time_runs(args.dirs[0], args.dirs[1] if len(args.dirs) > 1 else None)
    else:
        names = [args.dir / f"a-{args.records}", args.dir / f"b-{args.records}"]
        for i, d in enumerate(names):
            if not d.exists():
                generate(d, args.records, args.levels, args.level_seconds, args.seed + i, args.cap)
        time_runs(names[0], names[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
