"""Analysis scale: wall time and peak memory of ``specload report`` and ``specload compare`` on big runs.

Writes two synthetic run directories of N records each (records.jsonl in the real schema, every
per-request figure from ``specload.records.derived``, run.json through ``specload.rundir``, a
locust.json whose counts agree): a closed-loop sweep over C = 1 ... 512, N / 8 measured requests
per level, 1000-token outputs, 0.1% failed and 0.1% short, the second run 10% faster to decode.
Then runs, each in a fresh process, ``specload report A --no-write`` and
``specload compare A B --no-plot`` and reads the child's own rusage (``os.wait4``): wall seconds
and peak RSS. The same at N / 10 gives the fixed part, so the figures scale to 5M records as
time = fixed + slope x N (the goal: 5M records in under a minute and under 1 GB).

    .venv/bin/python -m bench.analysis_scale [--records 500000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from specload.histogram import bin_of  # noqa: E402
from specload.records import (  # noqa: E402
    FAILED,
    OK,
    PHASE_MEASURE,
    PHASE_WARMUP,
    SHORT,
    RequestRecord,
    derived,
    level_label,
    make_record,
)
from specload.rundir import LevelMeta, RunMeta, ServerInfo, write_run_meta  # noqa: E402

LEVELS = [1, 4, 16, 32, 64, 128, 256, 512]
PROMPT, OUTPUT = 1000, 1000
PATH = "/v1/completions"
T0 = 1_764_475_200.0
GOAL_RECORDS = 5_000_000
GOAL_S = 60.0
GOAL_MB = 1000.0
_FIELDS = [f.name for f in fields(RequestRecord)]


def _record(level: int, c: int, seq: int, phase: str, t_send: float, rng: random.Random, speed: float) -> dict:
    """One record as the dict ``RequestRecord.to_json`` would write (checked against make_record)."""
    status, reason, tokens, http = OK, None, OUTPUT if phase == PHASE_MEASURE else 100, 200
    u = rng.random()
    if u < 0.001:
        status, reason, tokens, http = FAILED, "HTTP 503: Service Unavailable", 0, 503
    elif u < 0.002:
        tokens = int(rng.random() * OUTPUT)
        status, reason = SHORT, f"stream ended without [DONE] after {tokens} of {OUTPUT} tokens"
    ttft = 0.05 + 0.002 * c * (0.5 + rng.random())
    itl = (0.009 + 0.0003 * c ** 0.8) * (0.95 + 0.1 * rng.random()) / speed
    if status == FAILED:
        t_first = t_last = None
        t_end = t_send + 0.2
    else:
        t_first = t_send + ttft
        t_last = t_first + max(tokens - 1, 0) * itl
        t_end = t_last + 0.0005
    ttft_s, e2e, tpot, per_req, decode = derived(t_send, t_first, t_last, t_end, tokens, 1 if t_first else None)
    return {
        "level": level, "concurrency": c, "phase": phase, "seq": seq, "backend": "openai", "status": status,
        "reason": reason, "http_status": http, "t_send": t_send, "t_first": t_first, "t_last": t_last,
        "t_end": t_end, "ttft_s": ttft_s, "e2e_s": e2e, "output_tokens": tokens,
        "output_tokens_source": "usage", "prompt_tokens": None if status == FAILED else PROMPT,
        "requested_output_tokens": OUTPUT if phase == PHASE_MEASURE else 100, "requested_prompt_tokens": PROMPT,
        "chunks": tokens, "tpot_s": tpot, "itl_max_s": None if tpot is None else 3 * tpot,
        "per_request_tok_s": per_req, "decode_tok_s": decode, "spec_verify_ct": None, "worker": "local",
        "repeat": 0, "itl": _itl(itl, tokens, rng), "itl_unit": "event", "first_event_tokens": 1 if t_first else None,
        "t_sched": None, "rate": None, "request_class": None, "turn": None, "conversation": None,
        "prefix_group": None, "cached_tokens": None,
    }  # fmt: skip


def _itl(itl: float, tokens: int, rng: random.Random) -> list[list[int]] | None:
    """A realistic per-request gap histogram: ~10 bins around the mean gap (what stream.py writes)."""
    if tokens < 2:
        return None
    centre = bin_of(itl)
    counts: dict[int, int] = {}
    for _ in range(10):
        b = centre + int(rng.gauss(0, 3))
        counts[b] = counts.get(b, 0) + 1
    total, gaps = sum(counts.values()), tokens - 1
    pairs = [[b, c * gaps // total] for b, c in sorted(counts.items())]
    pairs[-1][1] += gaps - sum(c for _, c in pairs)
    return [p for p in pairs if p[1] > 0]


def _check_schema() -> None:
    """The fast path writes exactly what make_record + to_json would (same keys, same order, same values)."""
    d = _record(2, 16, 7, PHASE_MEASURE, T0, random.Random(3), 1.0)
    kw = {k: d[k] for k in _FIELDS if k not in ("ttft_s", "e2e_s", "tpot_s", "per_request_tok_s", "decode_tok_s")}
    rec = make_record(**kw)
    assert list(d) == _FIELDS and orjson.dumps(d) == rec.to_json(), "records drifted from RequestRecord"


def make_run(run_dir: Path, n: int, label: str, speed: float, seed: int) -> None:
    """A closed-loop sweep of n measured records (plus one warmup per level) over LEVELS."""
    _check_schema()
    run_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    levels: list[LevelMeta] = []
    entries = []
    t = T0
    per_level = [n // len(LEVELS) + (1 if i < n % len(LEVELS) else 0) for i in range(len(LEVELS))]
    with open(run_dir / "records.jsonl", "wb") as f:
        buf: list[bytes] = []
        for idx, (c, budget) in enumerate(zip(LEVELS, per_level, strict=True)):
            t_start = t
            warm = _record(idx, c, 0, PHASE_WARMUP, t, rng, speed)
            buf.append(orjson.dumps(warm))
            t_measure = warm["t_end"] + 0.001
            free = [(t_measure + 0.0002 * u, u) for u in range(c)]  # closed loop: each user's next send
            heapq.heapify(free)
            t_last_end = t_measure
            fails = 0
            for seq in range(budget):
                t_send, u = heapq.heappop(free)
                d = _record(idx, c, seq, PHASE_MEASURE, t_send, rng, speed)
                fails += d["status"] == FAILED
                t_last_end = max(t_last_end, d["t_end"])
                heapq.heappush(free, (d["t_end"] + 0.0015, u))
                buf.append(orjson.dumps(d))
                if len(buf) >= 20000:
                    f.write(b"\n".join(buf) + b"\n")
                    buf.clear()
            levels.append(LevelMeta(index=idx, concurrency=c, budget=budget, warmup=1, t_start=t_start,
                                    t_measure_start=t_measure, t_end=t_last_end, status="completed",
                                    granted=budget, received=budget, granted_warmup=1, received_warmup=1))  # fmt: skip
            label_c = level_label(c)
            entries.append({"name": f"{label_c} warmup {PATH}", "method": "POST", "num_requests": 1, "num_failures": 0})
            entries.append({"name": f"{label_c} {PATH}", "method": "POST", "num_requests": budget, "num_failures": fails})
            t = t_last_end + 1.0
        if buf:
            f.write(b"\n".join(buf) + b"\n")
    meta = RunMeta(
        specload_version="0.1.0", locust_version="2.47.0", label=label, host="http://127.0.0.1:30000",
        backend="openai", model="bench-model", model_source="/v1/models", scenario_file=None,
        scenario={"name": label, "input_tokens": PROMPT, "output_tokens": OUTPUT, "levels": LEVELS},
        started_at=T0, ended_at=t, status="completed", mode="local", levels=levels,
        server=ServerInfo.from_json({}), simulated=True, server_metrics="off",
        prompts={"kind": "ids", "origin": "bench/analysis_scale.py", "overhead_tokens": 0, "exact": True},
    )  # fmt: skip
    write_run_meta(run_dir, meta)
    (run_dir / "locust.json").write_bytes(orjson.dumps(entries))


@dataclass
class Timed:
    what: str
    records: int  # per run
    wall_s: float
    peak_mb: float
    code: int
    cpu_s: float = 0.0  # user + system: what the wall time would be on an idle core (one thread)


# A small process between us and the measured one. A child made from this (big) process carries
# our memory's high-water mark into its own ru_maxrss (the kernel keeps the larger of the image
# before exec and after), so the measured command is forked from this tiny wrapper instead.
_WRAPPER = """
import os, sys, time
res, cmd = sys.argv[1], sys.argv[2:]
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execv(cmd[0], cmd)
    finally:
        os._exit(127)
_, status, ru = os.wait4(pid, 0)
with open(res, "w") as f:
    f.write(f"{time.perf_counter() - t0} {ru.ru_maxrss} {os.waitstatus_to_exitcode(status)} {ru.ru_utime + ru.ru_stime}")
"""


def timed(cmd: list[str], what: str, records: int, log: Path) -> Timed:
    """Run cmd in a fresh process: its wall time and its own peak RSS (its rusage, from os.wait4)."""
    old = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": str(REPO) + (os.pathsep + old if old else "")}
    res = log.with_suffix(".rusage")
    with open(log, "wb") as out:
        subprocess.run([sys.executable, "-c", _WRAPPER, str(res), *cmd], stdout=out, stderr=subprocess.STDOUT,
                       cwd=REPO, env=env, check=False)  # fmt: skip
    wall, maxrss_kib, code, cpu = res.read_text().split()
    if int(code) != 0:
        raise RuntimeError(f"{what} failed (exit {code}); see {log}:\n{log.read_text(errors='replace')[-2000:]}")
    return Timed(what, records, float(wall), int(maxrss_kib) / 1024.0, int(code), float(cpu))  # maxrss: KiB


def report_cmd(a: Path) -> list[str]:
    return [sys.executable, "-m", "specload", "report", str(a), "--no-write"]


def compare_cmd(a: Path, b: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "specload", "compare", str(a), str(b), "--no-plot", "--out", str(out)]


@dataclass
class Scale:
    what: str
    records: int
    wall_s: float
    peak_mb: float
    cpu_s: float
    small: Timed  # the same at records / 10: the fixed part

    def at(self, n: int) -> tuple[float, float, float]:
        """(wall s, CPU s, MB) at n records per run, on the line through the two measured sizes."""
        if n == self.records:
            return self.wall_s, self.cpu_s, self.peak_mb
        k = (n - self.records) / (self.records - self.small.records)
        return (self.wall_s + k * (self.wall_s - self.small.wall_s), self.cpu_s + k * (self.cpu_s - self.small.cpu_s),
                self.peak_mb + k * (self.peak_mb - self.small.peak_mb))  # fmt: skip

    @property
    def s_per_m(self) -> float:
        return 1e6 * (self.wall_s - self.small.wall_s) / (self.records - self.small.records)

    @property
    def cpu_s_per_m(self) -> float:
        return 1e6 * (self.cpu_s - self.small.cpu_s) / (self.records - self.small.records)

    @property
    def mb_per_m(self) -> float:
        return 1e6 * (self.peak_mb - self.small.peak_mb) / (self.records - self.small.records)


def measure(n: int, work: Path, log=print, fixed_part: bool = True) -> tuple[list[Scale], float]:  # type: ignore[no-untyped-def]
    """Report and compare at n and n / 10 records per run (only n without ``fixed_part``: the
    figures then scale from zero); also returns the seconds spent generating the runs."""
    out: dict[str, list[Timed]] = {k: [] if fixed_part else [Timed(k, 0, 0.0, 0.0, 0)] for k in ("report", "compare")}
    gen_s = 0.0
    for size in (max(n // 10, 1000), n) if fixed_part else (n,):
        a, b = work / f"base-{size}", work / f"other-{size}"
        log(f"analysis scale: writing 2 runs of {size:,} records ...")
        t0 = time.perf_counter()
        make_run(a, size, "base", 1.0, 1)
        make_run(b, size, "other", 1.1, 2)
        gen_s += time.perf_counter() - t0
        log(f"analysis scale: specload report / compare on {size:,} records ...")
        out["report"].append(timed(report_cmd(a), "report", size, work / f"report-{size}.log"))
        out["compare"].append(timed(compare_cmd(a, b, work / f"cmp-{size}"), "compare", size, work / f"compare-{size}.log"))
        if size != n:
            shutil.rmtree(a)
            shutil.rmtree(b)
    scales = [Scale(k, v[1].records, v[1].wall_s, v[1].peak_mb, v[1].cpu_s, v[0]) for k, v in out.items()]
    return scales, gen_s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--records", type=int, default=500_000, help="records per run (default 500000; the goal: 5000000)")
    p.add_argument("--keep", default=None, help="write the runs here and keep them (default: a temporary dir)")
    args = p.parse_args(argv)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="specload-bench-scale-"))
    try:
        scales, gen_s = measure(args.records, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    for s in scales:
        t5, c5, m5 = s.at(GOAL_RECORDS)
        print(f"{s.what}: {s.records:,} records {s.wall_s:.1f} s (CPU {s.cpu_s:.1f} s) {s.peak_mb:.0f} MB; "
              f"{s.s_per_m:.1f} s and {s.mb_per_m:.0f} MB per 1M; at 5M {t5:.0f} s (CPU {c5:.0f} s) {m5:.0f} MB")  # fmt: skip
    print(f"(generating the runs took {gen_s:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
