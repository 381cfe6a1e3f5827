"""Calibration of the batch engine's presets against the reference deployment's tables.

For each preset (baseline, mtp) this starts ``specload sim --engine batch --preset X`` on a free port,
runs the reference sweep against it with real Locust (``specload sweep --scenario
scenarios/mtp-sweep.toml --backend sglang``), stops the simulator by PID, and prints per level:

- the reference Agg tok/s (docs/reference-deployment.md) and the simulated one, their ratio and
  OK / FAIL against +-15% (checked only at full length and time scale 1: a shortened or sped-up run
  has other numbers by design);
- the same sweep played through the engine's scheduler in virtual time ("model"): what the engine
  means to deliver. Measured / model far from 1 means the simulator or the client could not keep
  up (CPU-bound), not a calibration error; so do TTFT / TPOT p50 that drift from the model's;
- the CPU the simulator and the load generator used, as a fraction of one core.

Then ``specload compare`` on the two runs, and its verdict sentence (where MTP stops paying).

    .venv/bin/python bench/calibrate.py                                   # the full check, ~12 min
    .venv/bin/python bench/calibrate.py --output-tokens 250 --time-scale 0.5   # the demo variant
    .venv/bin/python bench/calibrate.py --model-only                      # virtual time only, seconds

A full run takes several minutes per preset: start it with nohup and poll its output.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from specload.sim.batch import BatchParams, load_preset  # noqa: E402
from specload.sim.virtual import closed_loop_level  # noqa: E402

SCENARIO = REPO / "scenarios" / "mtp-sweep.toml"
LEVELS = [1, 4, 16, 32, 64, 128]
# Agg tok/s of the reference tables (docs/reference-deployment.md); C=128 is "about" in both.
REFERENCE = {
    "baseline": {1: 108.0, 4: 286.0, 16: 873.0, 32: 1359.0, 64: 2327.0, 128: 2800.0},
    "mtp": {1: 121.5, 4: 400.5, 16: 1209.4, 32: 1502.4, 64: 1571.1, 128: 1635.0},
}
TOLERANCE = 0.15
INPUT_TOKENS = 1000
WARMUP_TOKENS = 100
CLIENT_GAP_S = 0.0015  # a closed-loop user's hand-off from one request to its next, in the model


def budget(c: int) -> int:
    return 4 if c == 1 else 2 * c  # the reference rule (scenario: min_requests 4, 2 per user)


# ---------------------------------------------------------------------------------------------------
# The sweep in virtual time


@dataclass
class ModelLevel:
    concurrency: int
    agg_tok_s: float
    ttft_p50_ms: float
    tpot_p50_ms: float
    wall_s: float


def model_level(
    params: BatchParams, c: int, output_tokens: int, time_scale: float = 1.0, gap_s: float = CLIENT_GAP_S
) -> ModelLevel:
    """One level of the closed-loop sweep through :class:`BatchScheduler`, as BatchEngine runs it
    (specload.sim.virtual: one warmup request alone, then C users start together; each sends its next
    request ``gap_s`` after its last one ended, until the level's budget is spent)."""
    v = closed_loop_level(params, c, INPUT_TOKENS, output_tokens, budget(c), WARMUP_TOKENS, gap_s, time_scale)
    return ModelLevel(c, v.agg_tok_s, v.ttft_p50_ms, v.tpot_p50_ms, v.wall_s)


# ---------------------------------------------------------------------------------------------------
# Real runs


def _cpu_s(pid: int) -> float | None:
    """utime + stime of a live process, from /proc (Linux only)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def start_sim(preset: str, time_scale: float, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    cmd = [
        sys.executable,
        "-m",
        "specload",
        "sim",
        "--port",
        "0",
        "--engine",
        "batch",
        "--preset",
        preset,
        "--time-scale",
        str(time_scale),
        "--model",
        f"sim-{preset}",
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, cwd=REPO)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 20)
    line = proc.stdout.readline().decode() if ready else ""
    if "listening on " not in line:
        stop_sim(proc)
        raise RuntimeError(f"simulator did not start: {line!r}; see {log_path}")
    return proc, line.strip().rsplit("listening on ", 1)[1]


def stop_sim(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()  # by PID
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


@dataclass
class RealRun:
    run_dir: str
    wall_s: float
    sim_cpu: float | None  # fraction of one core over the sweep
    client_cpu: float | None


def run_preset(preset: str, args: argparse.Namespace, out: Path) -> RealRun:
    proc, url = start_sim(preset, args.time_scale, out / f"sim-{preset}.log")
    try:
        cmd = [
            sys.executable,
            "-m",
            "specload",
            "sweep",
            "--host",
            url,
            "--scenario",
            str(SCENARIO),
            "--backend",
            "sglang",
            "--out",
            str(out),
            "--label",
            preset,
            "--output-tokens",
            str(args.output_tokens),
            "--levels",
            ",".join(map(str, args.levels)),
        ]
        print(f"[{preset}] simulator {url} (pid {proc.pid}); sweeping ...", flush=True)
        sim_cpu0, client_cpu0, t0 = _cpu_s(proc.pid), _children_cpu_s(), time.monotonic()
        log_path = out / f"sweep-{preset}.log"
        with open(log_path, "w") as log:
            code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        wall = time.monotonic() - t0
        sim_cpu1, client_cpu1 = _cpu_s(proc.pid), _children_cpu_s()
    finally:
        stop_sim(proc)
    text = log_path.read_text()
    run_dir = next(
        (ln.split("run directory ", 1)[1].strip() for ln in text.splitlines() if "run directory " in ln), None
    )
    if code != 0 or run_dir is None:
        raise RuntimeError(f"sweep of {preset} failed (exit {code}); see {log_path}:\n{text[-3000:]}")
    sim_cpu = None if sim_cpu0 is None or sim_cpu1 is None else (sim_cpu1 - sim_cpu0) / wall
    print(f"[{preset}] done in {wall:.0f} s: {run_dir}", flush=True)
    return RealRun(run_dir, wall, sim_cpu, (client_cpu1 - client_cpu0) / wall)


def verdict(base_dir: str, mtp_dir: str, out: Path) -> tuple[list[str], list[dict[str, object]]]:
    cmd = [
        sys.executable,
        "-m",
        "specload",
        "compare",
        base_dir,
        mtp_dir,
        "--format",
        "json",
        "--no-plot",
        "--out",
        str(out / "compare"),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if res.returncode != 0:
        raise RuntimeError(f"specload compare failed: {res.stderr[-2000:]}")
    data = json.loads(res.stdout)
    xs = [x for per in data["crossovers"].values() for x in per["agg"]]
    return data["sentences"], xs


# ---------------------------------------------------------------------------------------------------


def _fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--time-scale", type=float, default=1.0, help="the simulator's --time-scale (default 1)")
    p.add_argument("--output-tokens", type=int, default=1000, help="output tokens per request (default 1000)")
    p.add_argument(
        "--levels", default=",".join(map(str, LEVELS)), help="concurrency levels (default 1,...,128)"
    )
    p.add_argument("--presets", default="baseline,mtp", help="presets to run (default baseline,mtp)")
    p.add_argument("--out", default=None, help="parent of the run directories (default: a temporary one)")
    p.add_argument("--model-only", action="store_true", help="virtual time only: no simulator, no Locust")
    args = p.parse_args(argv)
    args.levels = [int(x) for x in args.levels.split(",") if x.strip()]
    presets = [x.strip() for x in args.presets.split(",") if x.strip()]
    full = args.output_tokens == 1000 and args.time_scale == 1.0
    print(
        f"calibration: {INPUT_TOKENS} in / {args.output_tokens} out, levels {args.levels}, "
        f"time scale {args.time_scale:g}; +-{TOLERANCE:.0%} vs the reference "
        f"{'checked' if full else 'NOT checked (shortened run: reference not comparable)'}",
        flush=True,
    )

    models = {
        x: {c: model_level(load_preset(x), c, args.output_tokens, args.time_scale) for c in args.levels}
        for x in presets
    }
    reals: dict[str, RealRun] = {}
    if not args.model_only:
        out = Path(args.out or tempfile.mkdtemp(prefix="specload-calibrate-"))
        out.mkdir(parents=True, exist_ok=True)
        for x in presets:
            reals[x] = run_preset(x, args, out)

    from specload.present.report import load_run

    measured: dict[str, dict[int, object]] = {}
    for x in presets:
        if x in reals:
            measured[x] = {lv.concurrency: lv for lv in load_run(reals[x].run_dir).levels}
    failures = 0
    for x in presets:
        ref = REFERENCE.get(x, {})
        print(f"\n### {x}\n")
        print(
            "|   C | ref agg | sim agg | sim/ref | ±15% | model agg | sim/model | TTFT p50 ms sim (model) "
            "| TPOT p50 ms sim (model) | accept len | srv run max |"
        )
        print("|---:|---:|---:|---:|:---:|---:|---:|---:|---:|---:|---:|")
        for c in args.levels:
            m = models[x][c]
            lv = measured.get(x, {}).get(c)
            agg = getattr(lv, "agg_tok_s", None) if lv is not None else None
            shown = agg if agg is not None else (m.agg_tok_s if args.model_only else None)
            r = ref.get(c)
            ratio = None if shown is None or r is None else shown / r
            if not full or ratio is None:
                ok = "n/a"
            else:
                ok = "OK" if abs(ratio - 1) <= TOLERANCE else "FAIL"
                failures += ok == "FAIL"
            vs_model = None if agg is None else agg / m.agg_tok_s
            ttft = getattr(lv, "ttft_p50_ms", None)
            tpot = getattr(lv, "tpot_p50_ms", None)
            acc = getattr(lv, "accept_length", None)
            run_max = getattr(lv, "server_running_max", None)
            print(
                f"| {c:3d} | {_fmt(r)} | {_fmt(shown)} | {_fmt(ratio, 3)} | {ok} | {m.agg_tok_s:.1f} | "
                f"{_fmt(vs_model, 3)} | {_fmt(ttft, 0)} ({m.ttft_p50_ms:.0f}) | {_fmt(tpot, 2)} ({m.tpot_p50_ms:.2f}) "
                f"| {_fmt(acc, 2)} | {_fmt(run_max, 0)} |"
            )
        if x in reals:
            rr = reals[x]
            print(
                f"\n{x}: sweep {rr.wall_s:.0f} s, simulator CPU {_fmt(rr.sim_cpu and 100 * rr.sim_cpu, 0)}% "
                f"of a core, load generator CPU {_fmt(rr.client_cpu and 100 * rr.client_cpu, 0)}%"
            )

    if len(presets) >= 2:
        base, treat = presets[0], presets[1]
        changes = []
        for c in args.levels:
            b = measured.get(base, {}).get(c)
            t = measured.get(treat, {}).get(c)
            if b is not None and t is not None:
                changes.append((c, 100 * (t.agg_tok_s / b.agg_tok_s - 1)))  # type: ignore[attr-defined]
            else:
                changes.append((c, 100 * (models[treat][c].agg_tok_s / models[base][c].agg_tok_s - 1)))
        src = "simulated" if reals else "model"
        print(
            f"\n{treat} vs {base} aggregate change ({src}): "
            + ", ".join(f"C={c} {y:+.1f}%" for c, y in changes)
        )
        down = [(a, b) for (a, ya), (b, yb) in zip(changes, changes[1:], strict=False) if ya > 0 > yb]
        if down:
            print(f"aggregate crossover ({src}): between C={down[0][0]} and C={down[0][1]}")
        else:
            print(f"aggregate crossover ({src}): none")
        if base in reals and treat in reals:
            sentences, xs = verdict(
                reals[base].run_dir, reals[treat].run_dir, Path(reals[base].run_dir).parent
            )
            print("specload compare verdict:")
            for s in sentences:
                print(f"  {s}")
            in_range = any(x.get("low") == 32 and x.get("high") == 64 for x in xs)
            if 32 in args.levels and 64 in args.levels:
                print(f"crossover between C=32 and C=64: {'OK' if in_range else 'FAIL'}")
                failures += not in_range
    print(f"\n{'PASS' if not failures else f'FAIL ({failures})'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
