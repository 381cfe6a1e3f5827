"""Client cost: CPU of one Locust process per streamed token and per request, against the simulator.

The simulator (fixed engine: TTFT 50 ms, ITL given per level, tokens one per stream event, a cap
above C so nothing queues) runs pinned to core 0; ``specload sweep`` without ``--processes`` on
core 1 (its Locust child inherits the affinity). One sweep per level, one level per sweep:

- its **warmup** phase is the *short* configuration: ``--warmup-requests W --warmup-output-tokens 1``
  (W = C x short waves), i.e. requests of one token each: nearly all request cost;
- its **measured** phase is the *long* configuration (L output tokens each, budget C x waves):
  nearly all token cost, at C x 1000 / ITL tokens/s (~50k).

A sampler thread reads the Locust child's utime + stime (``/proc/PID/stat``, found through
``/proc/SWEEP_PID/task/*/children``) every 20 ms, with the simulator's and each core's busy time.
After the sweep, run.json gives each phase's boundaries (the short phase from its first send to
``t_measure_start``, the long phase from ``t_measure_start`` to ``t_end``), CPU is interpolated
at those instants, and the two equations

    cpu_short = a x tokens_short + b x requests_short
    cpu_long  = a x tokens_long  + b x requests_long

give ``a`` (CPU per streamed token) and ``b`` (CPU per request, everything but the tokens: the
prompt, the HTTP request and response head, the ticket, the record, Locust's events).

The long phase's TTFT p50 and aggregate tok/s (specload's own figures, ``load_run``) are compared
with the simulator's exact values: TTFT 50 ms, and agg = waves x C x L / (waves x E2E) with
E2E = TTFT + (L - 1) x ITL (all C users start together, closed loop, nothing queues).

    .venv/bin/python -m bench.client_cost [--quick] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from specload.sim import process as simproc
from specload.sim.process import SimProcess, stop_process

REPO = Path(__file__).resolve().parent.parent

TTFT_MS = 50.0
GOAL_US_PER_TOKEN = 10.0
GOAL_US_PER_REQUEST = 100.0
GOAL_TTFT_MS = 5.0
GOAL_AGG_FRAC = 0.01
SAMPLE_S = 0.02
SIM_BUSY = 80.0  # % of its core above which the simulator's own timing may slip
OTHERS_BUSY = 20.0  # % of one core used by other processes above which wall-clock verdicts are marked
CLK_TCK = os.sysconf("SC_CLK_TCK")


def child_env() -> dict[str, str]:
    """Our environment with this tree first on PYTHONPATH: children import this checkout's specload."""
    old = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(REPO) + (os.pathsep + old if old else "")}


@dataclass(frozen=True)
class Level:
    """One sweep of one level: C users, the simulator's ITL, L tokens per measured request."""

    concurrency: int
    itl_ms: float
    output_tokens: int  # L, the long phase
    waves: int  # measured requests = C x waves
    short_waves: int  # warmup (1-token) requests = C x short_waves
    input_tokens: int = 1000  # the reference sweep's prompts (scenarios/mtp-sweep.toml)

    @property
    def e2e_s(self) -> float:
        return (TTFT_MS + (self.output_tokens - 1) * self.itl_ms) / 1000.0

    @property
    def expected_agg(self) -> float:
        """The simulator's exact aggregate tok/s of the measured phase (closed loop, no queueing)."""
        return self.waves * self.concurrency * self.output_tokens / (self.waves * self.e2e_s)

    @property
    def stream_rate(self) -> float:
        """Tokens/s while all C streams decode: C x 1000 / ITL."""
        return self.concurrency * 1000.0 / self.itl_ms

    @property
    def name(self) -> str:
        return f"C={self.concurrency}"

    @property
    def where(self) -> str:
        return f"C={self.concurrency}, {self.stream_rate / 1000:.1f}k tok/s"


# ~50k tok/s on one core at C=64 and C=256 (the goal's rate), and one level well inside one core.
FULL = [Level(64, 1.25, 1000, 4, 30), Level(256, 5.0, 500, 2, 10), Level(64, 5.0, 500, 2, 20)]
QUICK = [Level(16, 5.0, 20, 1, 2, input_tokens=128)]


# ---------------------------------------------------------------------------------------------------
# /proc


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of a live process (all its threads, dead ones included)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            pass
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def cores_busy_s() -> dict[int, float]:
    """Busy seconds (everything but idle and iowait) of each CPU since boot, from /proc/stat."""
    out: dict[int, float] = {}
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("cpu") and line[3].isdigit():
                    name, *vals = line.split()
                    v = [int(x) for x in vals]
                    out[int(name[3:])] = (sum(v[:8]) - v[3] - v[4]) / CLK_TCK
    except (OSError, ValueError, IndexError):
        pass
    return out


@dataclass
class Sample:
    t: float  # wall clock (epoch seconds, as run.json)
    locust: float
    sim: float
    cores: dict[int, float]


class Sampler(threading.Thread):
    """Every SAMPLE_S: the Locust child's CPU, the simulator's, and each core's busy time."""

    def __init__(self, sweep_pid: int, sim_pid: int) -> None:
        super().__init__(daemon=True)
        self.sweep_pid, self.sim_pid = sweep_pid, sim_pid
        self.locust_pid: int | None = None
        self.samples: list[Sample] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            if self.locust_pid is None:
                self.locust_pid = next((c for c in children(self.sweep_pid) if "locust" in cmdline(c)), None)
            if self.locust_pid is not None:
                lc = proc_cpu_s(self.locust_pid)
                sc = proc_cpu_s(self.sim_pid)
                if lc is not None and sc is not None:
                    self.samples.append(Sample(time.time(), lc, sc, cores_busy_s()))
            self.stop.wait(SAMPLE_S)

    def at(self, t: float) -> Sample:
        """The sample interpolated linearly at wall time t."""
        s = self.samples
        if not s:
            raise RuntimeError("no CPU samples of the Locust process")
        if t <= s[0].t:
            return s[0]
        if t >= s[-1].t:
            return s[-1]
        lo, hi = 0, len(s) - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if s[mid].t <= t:
                lo = mid
            else:
                hi = mid
        a, b = s[lo], s[hi]
        w = (t - a.t) / (b.t - a.t) if b.t > a.t else 0.0

        def lerp(x: float, y: float) -> float:
            return x + w * (y - x)

        return Sample(
            t,
            lerp(a.locust, b.locust),
            lerp(a.sim, b.sim),
            {k: lerp(a.cores[k], b.cores.get(k, a.cores[k])) for k in a.cores},
        )


# ---------------------------------------------------------------------------------------------------
# One level


@dataclass
class Phase:
    """CPU and work of one phase of one sweep."""

    wall_s: float
    cpu_s: float  # the Locust process
    sim_cpu_s: float
    other_cpu_s: float  # every other process on both cores (other engineers' tests, the sampler ...)
    tokens: int
    requests: int

    @property
    def us_per_request_all_in(self) -> float:
        return 1e6 * self.cpu_s / self.requests


@dataclass
class LevelResult:
    level: Level
    short: Phase
    long: Phase
    ttft_p50_ms: float | None
    agg_tok_s: float | None
    failed: int
    run_dir: str
    us_per_token: float = field(init=False)
    us_per_request: float = field(init=False)

    def __post_init__(self) -> None:
        s, lg = self.short, self.long
        # a x tok + b x req = cpu, per request: a x (tok/req) + b = cpu/req
        ts, tl = s.tokens / s.requests, lg.tokens / lg.requests
        cs, cl = s.cpu_s / s.requests, lg.cpu_s / lg.requests
        a = (cl - cs) / (tl - ts)
        self.us_per_token = 1e6 * a
        self.us_per_request = 1e6 * (cs - a * ts)

    @property
    def ttft_excess_ms(self) -> float | None:
        return None if self.ttft_p50_ms is None else self.ttft_p50_ms - TTFT_MS

    @property
    def agg_error(self) -> float | None:
        return None if self.agg_tok_s is None else self.agg_tok_s / self.level.expected_agg - 1


def pinning() -> tuple[list[str], list[str], str]:
    """taskset prefixes for the simulator and the sweep, and a sentence saying what was done."""
    cpus = sorted(os.sched_getaffinity(0))
    if shutil.which("taskset") is None or len(cpus) < 2:
        return (
            [],
            [],
            f"not pinned (taskset {'missing' if shutil.which('taskset') is None else 'ok'}, CPUs {cpus})",
        )
    a, b = cpus[0], cpus[1]
    return ["taskset", "-c", str(a)], ["taskset", "-c", str(b)], f"simulator on CPU {a}, Locust on CPU {b}"


def start_sim(prefix: list[str], itl_ms: float, max_running: int) -> SimProcess:
    args = [
        "--model",
        "m",
        "--ttft-ms",
        str(TTFT_MS),
        "--itl-ms",
        str(itl_ms),
        "--max-running",
        str(max_running),
    ]
    return simproc.start_sim(args, timeout=30, prefix=prefix, env=child_env())


def run_level(lv: Level, out: Path, sim_prefix: list[str], client_prefix: list[str]) -> LevelResult:
    from specload.analysis.run import load_run
    from specload.core.records import PHASE_WARMUP, read_records
    from specload.core.rundir import read_run_meta

    tag = f"c{lv.concurrency}-itl{lv.itl_ms:g}-L{lv.output_tokens}"
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=out))  # one per run: --repeat runs a level again
    sim = start_sim(sim_prefix, lv.itl_ms, max(4 * lv.concurrency, 64))
    try:
        cmd = [
            *client_prefix,
            sys.executable,
            "-m",
            "specload",
            "sweep",
            "--host",
            sim.url,
            "--out",
            str(work),
            "--label",
            tag,
            "--levels",
            str(lv.concurrency),
            "--input-tokens",
            str(lv.input_tokens),
            "--output-tokens",
            str(lv.output_tokens),
            "--requests-per-level",
            str(lv.concurrency * lv.waves),
            "--warmup-requests",
            str(lv.concurrency * lv.short_waves),
            "--warmup-output-tokens",
            "1",
            "--read-timeout",
            "120",
            "--format",
            "plain",
        ]
        with open(work / "sweep.log", "wb") as log:
            sweep = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=child_env())
            sampler = Sampler(sweep.pid, sim.proc.pid)
            sampler.start()
            try:
                code = sweep.wait(timeout=600)
            finally:
                sampler.stop.set()
                sampler.join()
                stop_process(sweep)
    finally:
        sim.stop()
    dirs = [d for d in work.iterdir() if d.is_dir()]
    if code != 0 or len(dirs) != 1:
        text = (work / "sweep.log").read_text(errors="replace")
        raise RuntimeError(f"sweep {tag} failed (exit {code}); see {work / 'sweep.log'}:\n{text[-3000:]}")
    run_dir = dirs[0]
    meta = read_run_meta(run_dir).levels[0]
    recs = read_records(str(run_dir / "records.jsonl"))
    warm = [r for r in recs if r.phase == PHASE_WARMUP]
    meas = [r for r in recs if r.phase != PHASE_WARMUP]
    assert meta.t_measure_start is not None and meta.t_end is not None and warm and meas
    bounds = [
        (min(r.t_send for r in warm), meta.t_measure_start, warm),
        (meta.t_measure_start, meta.t_end, meas),
    ]
    phases = []
    for t0, t1, rs in bounds:
        a, b = sampler.at(t0), sampler.at(t1)
        cores = sum(b.cores.get(k, 0.0) - v for k, v in a.cores.items())
        ours = (b.locust - a.locust) + (b.sim - a.sim)
        phases.append(
            Phase(
                t1 - t0,
                b.locust - a.locust,
                b.sim - a.sim,
                max(0.0, cores - ours),
                sum(r.output_tokens for r in rs),
                len(rs),
            )
        )
    stats = load_run(run_dir).levels[0]
    failed = sum(r.status != "ok" for r in recs)
    return LevelResult(
        lv, phases[0], phases[1], stats.figure("ttft_p50"), stats.agg_tok_s, failed, str(run_dir)
    )


# ---------------------------------------------------------------------------------------------------
# Figures and table


@dataclass
class Row:
    figure: str
    level: str
    measured: str
    goal: str
    verdict: str


def verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("PASS" if ok else "MISS")


def median_spread(xs: list[float], fmt: str) -> str:
    m = statistics.median(xs)
    if len(xs) < 2:
        return format(m, fmt)
    return f"{format(m, fmt)} ({format(min(xs), fmt)}..{format(max(xs), fmt)})"


def rows(results: dict[Level, list[LevelResult]]) -> list[Row]:
    out: list[Row] = []
    for lv, rs in results.items():
        where = lv.where
        tok = [r.us_per_token for r in rs]
        req = [r.us_per_request for r in rs]
        out.append(
            Row(
                "client CPU per streamed token",
                where,
                median_spread(tok, ".1f") + " µs",
                f"<= {GOAL_US_PER_TOKEN:g} µs",
                verdict(statistics.median(tok) <= GOAL_US_PER_TOKEN),
            )
        )
        out.append(
            Row(
                "client CPU per request",
                where,
                median_spread(req, ".0f") + " µs",
                f"<= {GOAL_US_PER_REQUEST:g} µs",
                verdict(statistics.median(req) <= GOAL_US_PER_REQUEST),
            )
        )
        # Wall-clock figures: when other processes took a share of the cores, a MISS may be theirs.
        others = statistics.median(100 * r.long.other_cpu_s / r.long.wall_s for r in rs)
        busy_note = f" (others {others:.0f}%)" if others > OTHERS_BUSY else ""
        ttft = [r.ttft_excess_ms for r in rs if r.ttft_excess_ms is not None]
        if ttft:
            out.append(
                Row(
                    "TTFT p50 - 50 ms (simulator exact)",
                    where,
                    median_spread(ttft, "+.2f") + " ms",
                    f"<= {GOAL_TTFT_MS:g} ms",
                    verdict(statistics.median(ttft) <= GOAL_TTFT_MS) + busy_note,
                )
            )
        agg = [100 * r.agg_error for r in rs if r.agg_error is not None]
        if agg:
            out.append(
                Row(
                    f"agg tok/s vs exact {lv.expected_agg:,.0f}",
                    where,
                    median_spread(agg, "+.2f") + " %",
                    f"within {100 * GOAL_AGG_FRAC:g} %",
                    verdict(abs(statistics.median(agg)) <= 100 * GOAL_AGG_FRAC) + busy_note,
                )
            )
        busy = [100 * r.long.cpu_s / r.long.wall_s for r in rs]
        out.append(
            Row("Locust process CPU (one core = 100 %)", where, median_spread(busy, ".0f") + " %", "-", "-")
        )
        sim = [100 * r.long.sim_cpu_s / r.long.wall_s for r in rs]
        note = (
            "simulator-bound: TTFT/agg not the client's alone" if statistics.median(sim) > SIM_BUSY else "-"
        )
        out.append(
            Row("simulator CPU (one core = 100 %)", where, median_spread(sim, ".0f") + " %", "-", note)
        )
    return out


def conditions(results: dict[Level, list[LevelResult]], pin: str) -> list[str]:
    lines = [
        f"pinning: {pin}; sampling every {1000 * SAMPLE_S:.0f} ms, CPU clock tick {1000 / CLK_TCK:.0f} ms"
    ]
    for lv, rs in results.items():
        for i, r in enumerate(rs):
            s, lg = r.short, r.long
            lines.append(
                f"{lv.name} run {i + 1}: ITL {lv.itl_ms:g} ms, {lv.input_tokens}-token prompts, L={lv.output_tokens}, "
                f"long {lg.requests} req / {lg.tokens} tok in {lg.wall_s:.2f} s (Locust {lg.cpu_s:.2f} s CPU, "
                f"simulator {100 * lg.sim_cpu_s / lg.wall_s:.0f}% of a core, other processes "
                f"{100 * lg.other_cpu_s / lg.wall_s:.0f}% of the machine's cores); short {s.requests} x 1-token req in "
                f"{s.wall_s:.2f} s (Locust {s.cpu_s:.2f} s CPU = {s.us_per_request_all_in:.0f} µs/req all-in, "
                f"simulator {100 * s.sim_cpu_s / s.wall_s:.0f}%, others {100 * s.other_cpu_s / s.wall_s:.0f}%)"
                + (f"; {r.failed} requests not ok" if r.failed else "")
            )
    return lines


SPEED_LOOP = 10**7
_SPEED_CODE = f"import time\nt = time.process_time()\nfor _ in range({SPEED_LOOP}): pass\nprint(time.process_time() - t)"


def python_speed(prefix: list[str]) -> float | None:
    """CPU seconds of an empty ``for`` loop of 10**7 turns on the client's CPU: the machine's Python
    speed, so that figures from machines (or moments) of different speed can be compared (a cost
    per request of B µs here is about B x your loop's time / this one on your machine)."""
    try:
        out = subprocess.run(
            [*prefix, sys.executable, "-c", _SPEED_CODE],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return float(out.stdout.strip())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def measure(
    levels: list[Level], repeat: int, out: Path, log=print
) -> tuple[dict[Level, list[LevelResult]], str]:
    sim_prefix, client_prefix, pin = pinning()
    speed = [python_speed(client_prefix)]
    results: dict[Level, list[LevelResult]] = {lv: [] for lv in levels}
    for i in range(repeat):
        for lv in levels:
            log(
                f"client cost: {lv.name}, ITL {lv.itl_ms:g} ms, L={lv.output_tokens} (run {i + 1}/{repeat}) ..."
            )
            results[lv].append(run_level(lv, out, sim_prefix, client_prefix))
    speed.append(python_speed(client_prefix))
    if None not in speed:
        pin += (
            f"; Python speed on the client's CPU (an empty loop of 10**7 turns): {speed[0]:.2f} s CPU "
            f"before the levels, {speed[1]:.2f} s after"
        )
    return results, pin


def print_table(table: list[Row]) -> None:
    head = ("figure", "level", "measured", "goal", "verdict")
    body = [(r.figure, r.level, r.measured, r.goal, r.verdict) for r in table]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(5)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for b in body:
        print("| " + " | ".join(x.ljust(w) for x, w in zip(b, widths, strict=True)) + " |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one tiny level (a smoke check, not a measurement)")
    p.add_argument(
        "--repeat", type=int, default=1, help="runs of each level; the median is shown (default 1)"
    )
    p.add_argument(
        "--out", default=None, help="keep the run directories here (default: a temporary one, removed)"
    )
    args = p.parse_args(argv)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="specload-bench-"))
    try:
        results, pin = measure(QUICK if args.quick else FULL, args.repeat, out)
        print_table(rows(results))
        print()
        for line in conditions(results, pin):
            print(f"- {line}")
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
