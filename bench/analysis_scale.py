"""Analysis scale: wall time, CPU time and peak memory of ``specload report`` and ``specload compare`` on big runs.

Writes two synthetic run directories of N records each (records.jsonl in the real schema, every
per-request figure from ``specload.core.records.derived``, run.json through ``specload.core.rundir``, a
locust.json whose counts agree): a closed-loop sweep over C = 1 ... 512 in which every level lasts
the same time (as with a per-level duration: the records of a level are proportional to its
throughput, so C = 512 has the most), 1000-token outputs with a ~10-bin ITL histogram each, 0.1%
failed and 0.1% short, the second run 10% faster to decode. Then runs, each in a fresh process with
the records it reads dropped from the page cache first (a cold read), ``specload report A
--no-write --reread`` and ``specload compare A B --no-plot --reread``, and measures the command
and any process it forks: wall seconds, CPU seconds (rusage), the command's own peak RSS (rusage)
and the peak of the processes' memory together (the sum of their PSS, sampled every 0.1 s), and what other processes
used of the machine meanwhile (/proc/stat). Without ``--records 5000000`` the same at N / 10 gives the
fixed part and the figures are scaled to 5M records along the line through both.

Runs of 200k records or more are generated once into ``~/.cache/specload/bench`` (``--cache``) and
reused: writing 2 x 5M records (~7 GB) takes a minute or two, the two runs are written by two processes.

    .venv/bin/python -m bench.analysis_scale [--records 500000] [--keep DIR] [--cache DIR]
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
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields
from multiprocessing import get_context
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from specload.analysis.savedfigures import FIGURES_FILE  # noqa: E402
from specload.core.histogram import bin_of  # noqa: E402
from specload.core.records import (  # noqa: E402
    FAILED,
    OK,
    PHASE_MEASURE,
    PHASE_WARMUP,
    SCHEMA_VERSION,
    SHORT,
    RequestRecord,
    derived,
    level_label,
    make_record,
    record_line,
)
from specload.core.rundir import LevelMeta, RunMeta, ServerInfo, write_run_meta  # noqa: E402

LEVELS = [1, 4, 16, 32, 64, 128, 256, 512]
PROMPT, OUTPUT = 1000, 1000
PATH = "/v1/completions"
T0 = 1_764_475_200.0
GOAL_RECORDS = 5_000_000
GOAL_S = 60.0
GOAL_MB = 1000.0
GENERATOR = 3  # the version of what make_run writes: a cached run of another version is written anew
CACHE = Path.home() / ".cache" / "specload" / "bench"
CACHE_FROM = 200_000  # runs at least this big are cached
KEPT = "compare of kept figures"  # compare of two runs whose figures a former reading kept
_FIELDS = [f.name for f in fields(RequestRecord)]


def _itl_mean(c: int, speed: float) -> float:
    return (0.009 + 0.0003 * c**0.8) / speed


def _record(
    level: int, c: int, seq: int, phase: str, t_send: float, rng: random.Random, speed: float
) -> dict:
    """One record as ``RequestRecord.to_dict`` gives it (checked against make_record)."""
    status, reason, tokens, http = OK, None, OUTPUT if phase == PHASE_MEASURE else 100, 200
    u = rng.random()
    if u < 0.001:
        status, reason, tokens, http = FAILED, "HTTP 503: Service Unavailable", 0, 503
    elif u < 0.002:
        tokens = int(rng.random() * OUTPUT)
        status, reason = SHORT, f"stream ended without [DONE] after {tokens} of {OUTPUT} tokens"
    ttft = 0.05 + 0.002 * c * (0.5 + rng.random())
    itl = _itl_mean(c, speed) * (0.95 + 0.1 * rng.random())
    if status == FAILED:
        t_first = t_last = None
        t_end = t_send + 0.2
    else:
        t_first = t_send + ttft
        t_last = t_first + max(tokens - 1, 0) * itl
        t_end = t_last + 0.0005
    ttft_s, e2e, tpot, per_req, decode = derived(
        t_send, t_first, t_last, t_end, tokens, 1 if t_first else None
    )
    return {
        "level": level,
        "concurrency": c,
        "phase": phase,
        "seq": seq,
        "backend": "openai",
        "status": status,
        "reason": reason,
        "http_status": http,
        "t_send": t_send,
        "t_first": t_first,
        "t_last": t_last,
        "t_end": t_end,
        "ttft_s": ttft_s,
        "e2e_s": e2e,
        "output_tokens": tokens,
        "output_tokens_source": "usage",
        "prompt_tokens": None if status == FAILED else PROMPT,
        "requested_output_tokens": OUTPUT if phase == PHASE_MEASURE else 100,
        "requested_prompt_tokens": PROMPT,
        "chunks": tokens,
        "tpot_s": tpot,
        "itl_max_s": None if tpot is None else 3 * tpot,
        "per_request_tok_s": per_req,
        "decode_tok_s": decode,
        "spec_verify_ct": None,
        "worker": "local",
        "repeat": 0,
        "itl": _itl(itl, tokens, rng),
        "itl_unit": "event",
        "first_event_tokens": 1 if t_first else None,
        "t_sched": None,
        "rate": None,
        "request_class": None,
        "turn": None,
        "conversation": None,
        "prefix_group": None,
        "cached_tokens": None,
        "spec_drafted": None,
        "spec_accepted": None,
        "spec_hist": None,
        "spec_along": None,
        "spec_source": None,
        "category": None,
        "t_first_answer": None,
        "reasoning_tokens": None,
        "reasoning_tokens_source": None,
        "finish_reason": "length" if status == OK else None,
        "trace_index": None,
        "v": SCHEMA_VERSION,
    }


def _shape(rng: random.Random) -> list[tuple[int, int]]:
    """~10 gaps around the mean, as (bin offset, how many of 10), sorted by bin."""
    counts: dict[int, int] = {}
    for _ in range(10):
        b = int(rng.gauss(0, 3))
        counts[b] = counts.get(b, 0) + 1
    return sorted(counts.items())


_SHAPES = [_shape(random.Random(i)) for i in range(4096)]  # drawn once: the generator's hot path picks one


def _itl(itl: float, tokens: int, rng: random.Random) -> list[list[int]] | None:
    """A realistic per-request gap histogram: ~10 bins around the mean gap (what stream.py writes)."""
    if tokens < 2:
        return None
    centre = bin_of(itl)
    gaps = tokens - 1
    pairs = [[centre + b, c * gaps // 10] for b, c in _SHAPES[rng.getrandbits(12)]]
    pairs[-1][1] += gaps - sum(c for _, c in pairs)
    return [p for p in pairs if p[1] > 0]


def _check_schema() -> None:
    """The fast path writes exactly what make_record + to_json would (same keys, same order, same values)."""
    d = _record(2, 16, 7, PHASE_MEASURE, T0, random.Random(3), 1.0)
    kw = {
        k: d[k]
        for k in _FIELDS
        if k not in ("ttft_s", "e2e_s", "tpot_s", "per_request_tok_s", "decode_tok_s")
    }
    rec = make_record(**kw)
    assert list(d) == _FIELDS and record_line(d) == rec.to_json(), "records drifted from RequestRecord"


def per_level(n: int) -> list[int]:
    """Measured requests per level: every level lasts the same time, so each gets its share of
    throughput (C / E2E at that level's mean latency), C = 512 the most."""
    rates = [c / (0.05 + 0.002 * c + (OUTPUT - 1) * _itl_mean(c, 1.0)) for c in LEVELS]
    out = [max(1, int(n * r / sum(rates))) for r in rates]
    out[-1] += n - sum(out)
    return out


def make_run(run_dir: Path, n: int, label: str, speed: float, seed: int) -> None:
    """A closed-loop sweep of n measured records (plus one warmup per level) over LEVELS."""
    _check_schema()
    run_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    levels: list[LevelMeta] = []
    entries = []
    t = T0
    dumps = record_line
    with open(run_dir / "records.jsonl", "wb") as f:
        buf: list[bytes] = []
        for idx, (c, budget) in enumerate(zip(LEVELS, per_level(n), strict=True)):
            t_start = t
            warm = _record(idx, c, 0, PHASE_WARMUP, t, rng, speed)
            buf.append(dumps(warm))
            t_measure = warm["t_end"] + 0.001
            free = [(t_measure + 0.0002 * u, u) for u in range(c)]  # closed loop: each user's next send
            heapq.heapify(free)
            t_last_end = t_measure
            fails = 0
            for seq in range(budget):
                t_send, u = heapq.heappop(free)
                d = _record(idx, c, seq, PHASE_MEASURE, t_send, rng, speed)
                fails += d["status"] == FAILED
                t_end = d["t_end"]
                t_last_end = max(t_last_end, t_end)
                heapq.heappush(free, (t_end + 0.0015, u))
                buf.append(dumps(d))
                if len(buf) >= 20000:
                    f.write(b"\n".join(buf) + b"\n")
                    buf.clear()
            levels.append(
                LevelMeta(
                    index=idx,
                    concurrency=c,
                    budget=budget,
                    warmup=1,
                    t_start=t_start,
                    t_measure_start=t_measure,
                    t_end=t_last_end,
                    status="completed",
                    granted=budget,
                    received=budget,
                    granted_warmup=1,
                    received_warmup=1,
                )
            )
            label_c = level_label(c)
            entries.append(
                {"name": f"{label_c} warmup {PATH}", "method": "POST", "num_requests": 1, "num_failures": 0}
            )
            entries.append(
                {"name": f"{label_c} {PATH}", "method": "POST", "num_requests": budget, "num_failures": fails}
            )
            t = t_last_end + 1.0
        if buf:
            f.write(b"\n".join(buf) + b"\n")
    meta = RunMeta(
        specload_version="0.1.0",
        locust_version="2.47.0",
        label=label,
        host="http://127.0.0.1:30000",
        backend="openai",
        model="bench-model",
        model_source="/v1/models",
        scenario_file=None,
        scenario={"name": label, "input_tokens": PROMPT, "output_tokens": OUTPUT, "levels": LEVELS},
        started_at=T0,
        ended_at=t,
        status="completed",
        mode="local",
        levels=levels,
        server=ServerInfo.from_json({}),
        simulated=True,
        server_metrics="off",
        prompts={"kind": "ids", "origin": "bench/analysis_scale.py", "overhead_tokens": 0, "exact": True},
    )
    write_run_meta(run_dir, meta)
    (run_dir / "locust.json").write_bytes(orjson.dumps(entries))


RUNS = (("base", 1.0, 1), ("other", 1.1, 2))  # label, decode speed, seed


def _make(args: tuple[Path, int, str, float, int]) -> None:
    run_dir, n, label, speed, seed = args
    tmp = run_dir.with_name(run_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    make_run(tmp, n, label, speed, seed)
    (tmp / "complete").write_text(f"generator {GENERATOR}, {n} records\n")
    shutil.rmtree(run_dir, ignore_errors=True)
    tmp.rename(run_dir)


def prepare(n: int, where: Path, log=print) -> tuple[list[Path], float]:
    """The two runs of n records under ``where`` (written by two processes, unless there already):
    their directories and the seconds spent writing them."""
    dirs = [where / f"v{GENERATOR}-{label}-{n}" for label, _, _ in RUNS]
    todo = [
        (d, n, label, speed, seed)
        for d, (label, speed, seed) in zip(dirs, RUNS, strict=True)
        if not (d / "complete").exists()
    ]
    t0 = time.perf_counter()
    if todo:
        log(f"analysis scale: writing {len(todo)} run(s) of {n:,} records into {where} ...")
        where.mkdir(parents=True, exist_ok=True)
        with ProcessPoolExecutor(max_workers=len(todo), mp_context=get_context("fork")) as pool:
            list(pool.map(_make, todo))
        # The kernel writes the new runs back to disk for a minute or more after they were written:
        # done now, so that the timings below measure specload, not that writeback (the first
        # compare of new 5M runs took 143 s wall during it, 42 s after).
        os.sync()
    else:
        log(f"analysis scale: runs of {n:,} records found in {where}")
    for d in dirs:
        version = _version(d)
        if version != SCHEMA_VERSION:
            log(
                f"analysis scale: {d.name} holds records of schema version {version}, not {SCHEMA_VERSION}: it is "
                "read as an older run directory is (--no-cache, or remove it, for records of today's schema)"
            )
    return dirs, time.perf_counter() - t0


def _version(run_dir: Path) -> int:
    """The schema version of the run's first record (a cache may hold records of an older one)."""
    with open(run_dir / "records.jsonl", "rb") as f:
        first = orjson.loads(f.readline() or b"{}")
    return int(first.get("v", 1))


@dataclass
class Timed:
    what: str
    records: int  # per run
    wall_s: float
    peak_mb: float  # the peak RSS of the command, or of the largest process it waited for (rusage)
    code: int
    cpu_s: float = 0.0  # user + system of the command and the helper processes it forks
    tree_mb: float = 0.0  # peak of the memory of the command and its helpers together (sum of PSS, sampled)
    others: float = 0.0  # other processes' CPU meanwhile, in cores (0..number of CPUs)


# A small process between us and the measured one. A child made from this (big) process carries
# our memory's high-water mark into its own ru_maxrss (the kernel keeps the larger of the image
# before exec and after), so the measured command is forked from this tiny wrapper instead. It
# also samples every 0.1 s the proportional set size (PSS: a page two processes share counts half
# in each) of the command and of the helper it forks, and the machine's busy time.
_WRAPPER = r"""
import os, sys, time
res, cmd = sys.argv[1], sys.argv[2:]
tck = os.sysconf("SC_CLK_TCK")
def busy():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / tck
def tree(pid):
    out = [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            for c in f.read().split():
                out += tree(int(c))
    except OSError:
        pass
    return out
def pss(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
t0, b0 = time.perf_counter(), busy()
pid = os.fork()
if pid == 0:
    try:
        os.execv(cmd[0], cmd)
    finally:
        os._exit(127)
peak = 0
while True:
    done, status, ru = os.wait4(pid, os.WNOHANG)
    if done:
        break
    peak = max(peak, sum(pss(p) for p in tree(pid)))
    time.sleep(0.1)
wall = time.perf_counter() - t0
cpu = ru.ru_utime + ru.ru_stime
others = max(0.0, (busy() - b0 - cpu) / wall)
with open(res, "w") as f:
    f.write(f"{wall} {ru.ru_maxrss} {os.waitstatus_to_exitcode(status)} {cpu} {peak} {others}")
"""


def timed(cmd: list[str], what: str, records: int, log: Path) -> Timed:
    """Run cmd in a fresh process: its wall time, CPU time, peak RSS (its own, and its tree's)."""
    old = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": str(REPO) + (os.pathsep + old if old else "")}
    res = log.with_suffix(".rusage")
    with open(log, "wb") as out:
        subprocess.run(
            [sys.executable, "-c", _WRAPPER, str(res), *cmd],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
            check=False,
        )
    wall, maxrss_kib, code, cpu, tree_b, others = res.read_text().split()
    if int(code) != 0:
        raise RuntimeError(
            f"{what} failed (exit {code}); see {log}:\n{log.read_text(errors='replace')[-2000:]}"
        )
    return Timed(
        what,
        records,
        float(wall),
        int(maxrss_kib) / 1024.0,
        int(code),
        float(cpu),
        max(int(tree_b) / 2**20, int(maxrss_kib) / 1024.0),
        float(others),
    )


def evict(*runs: Path) -> None:
    """Let go of the runs' records in the page cache, so that the command reads them from the disk
    (the goal is a cold read): the kernel drops a file's clean cached pages on POSIX_FADV_DONTNEED
    (the runs were synced once written)."""
    for d in runs:
        fd = os.open(d / "records.jsonl", os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def report_cmd(a: Path) -> list[str]:
    return [sys.executable, "-m", "specload", "report", str(a), "--no-write", "--reread"]


def compare_cmd(a: Path, b: Path, out: Path, reread: bool = True) -> list[str]:
    """compare decoding both runs' records (``reread``), or reading the figures a former reading
    kept beside them (figures.msgpack: what a sweep leaves; specload.analysis.savedfigures)."""
    cmd = [sys.executable, "-m", "specload", "compare", str(a), str(b), "--no-plot", "--out", str(out)]
    return cmd + (["--reread"] if reread else [])


@dataclass
class Scale:
    what: str
    big: Timed
    small: Timed | None  # the same at records / 10: the fixed part (None: measured at the goal's size)

    @property
    def records(self) -> int:
        return self.big.records

    def _line(self, attr: str, n: int) -> float:
        y = getattr(self.big, attr)
        if self.small is None or n == self.big.records:
            return y * n / self.big.records
        k = (n - self.big.records) / (self.big.records - self.small.records)
        return y + k * (y - getattr(self.small, attr))

    def at(self, n: int) -> tuple[float, float, float]:
        """(wall s, CPU s, MB of the process tree) at n records per run: measured, or on the line
        through the two measured sizes (from zero when there is only one)."""
        return self._line("wall_s", n), self._line("cpu_s", n), self._line("tree_mb", n)

    def per_m(self, attr: str) -> float:
        """Seconds or MB per 1M records (the slope)."""
        if self.small is None:
            return 1e6 * getattr(self.big, attr) / self.big.records
        return (
            1e6
            * (getattr(self.big, attr) - getattr(self.small, attr))
            / (self.big.records - self.small.records)
        )


def measure(
    n: int, work: Path, log=print, fixed_part: bool = True, cache: Path | None = CACHE
) -> tuple[list[Scale], float]:
    """Report and compare at n records per run, and at n / 10 (the fixed part) unless n is the
    goal's 5M or ``fixed_part`` is False; compare with its figures kept at n only (scaled to 5M in
    proportion, which overstates it); also returns the seconds spent writing the runs. Runs of
    CACHE_FROM records or more are kept in ``cache`` (None: written into ``work`` and removed)."""
    out: dict[str, list[Timed]] = {"report": [], "compare": [], KEPT: []}
    work.mkdir(parents=True, exist_ok=True)
    gen_s = 0.0
    sizes = (max(n // 10, 1000), n) if fixed_part and n != GOAL_RECORDS else (n,)
    for size in sizes:
        where = cache if cache is not None and size >= CACHE_FROM else work
        (a, b), made_s = prepare(size, where, log)
        gen_s += made_s
        log(f"analysis scale: specload report / compare on {size:,} records, read cold ...")
        evict(a)
        out["report"].append(timed(report_cmd(a), "report", size, work / f"report-{size}.log"))
        evict(a, b)
        out["compare"].append(
            timed(compare_cmd(a, b, work / f"cmp-{size}"), "compare", size, work / f"compare-{size}.log")
        )
        if size == n and all((d / FIGURES_FILE).is_file() for d in (a, b)):
            # the reading above kept both runs' figures (runs of MIN_RECORDS_BYTES or more)
            log(f"analysis scale: specload compare on {size:,} records, figures kept ...")
            cmd = compare_cmd(a, b, work / f"cmp-kept-{size}", reread=False)
            out[KEPT].append(timed(cmd, KEPT, size, work / f"compare-kept-{size}.log"))
        if where == work:
            shutil.rmtree(a)
            shutil.rmtree(b)
    scales = [Scale(k, v[-1], v[0] if len(v) > 1 else None) for k, v in out.items() if v]
    return scales, gen_s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument(
        "--records", type=int, default=500_000, help="records per run (default 500000; the goal: 5000000)"
    )
    p.add_argument("--keep", default=None, help="write logs here and keep them (default: a temporary dir)")
    p.add_argument(
        "--cache", default=str(CACHE), help=f"where runs of {CACHE_FROM:,} records or more are kept"
    )
    p.add_argument("--no-cache", action="store_true", help="write every run anew and remove it after")
    args = p.parse_args(argv)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="specload-bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        scales, gen_s = measure(args.records, work, cache=None if args.no_cache else Path(args.cache))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    for s in scales:
        t5, c5, m5 = s.at(GOAL_RECORDS)
        big = s.big
        verdict = "meets" if t5 < GOAL_S and m5 < GOAL_MB else "MISSES"
        print(
            f"{s.what}: {big.records:,} records {big.wall_s:.1f} s (CPU {big.cpu_s:.1f} s, others {big.others:.2f} "
            f"cores) {big.peak_mb:.0f} MB peak RSS ({big.tree_mb:.0f} MB PSS); at 5M {t5:.0f} s "
            f"(CPU {c5:.0f} s) {m5:.0f} MB: {verdict} the goal (< {GOAL_S:.0f} s, < {GOAL_MB:.0f} MB)"
        )
    print(f"(writing the runs took {gen_s:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
