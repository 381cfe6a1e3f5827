"""``make demo``: the whole story, end to end, against the built-in simulated server.

Two simulated servers calibrated on the reference deployment (docs/simulator.md): a baseline and
the same model with MTP speculative decoding (one draft token, capped at 48 running requests,
KV cache shrunk by the draft). Each is swept with scenarios/demo.toml (the reference sweep's
shape, shorter outputs, time sped up), then the two runs are compared: per-level tables, the
side-by-side comparison, the crossover sentence and the plot. No GPU, no model download; every
simulator is stopped by PID whatever happens.
"""

from __future__ import annotations

import sys

from specload.launch import LaunchError, SweepSettings, run_sweep
from specload.simproc import start_sim
from specload.tableview import WHOLE, TableView

# Time runs DEMO_TIME_SCALE times faster than in the reference deployment, so both sweeps fit in
# about three minutes on two cores; tok/s figures are reported in simulated time (see below).
DEMO_TIME_SCALE = 0.5


def sim_args(preset: str) -> list[str]:
    return ["--engine", "batch", "--preset", preset, "--time-scale", str(DEMO_TIME_SCALE), "--model", "demo-model"]


def _sweep(preset: str, scenario: str, out: str, view: TableView) -> tuple[int, str | None]:
    print(f"\n=== specload demo: {preset.upper()} (SIMULATED server, preset '{preset}') ===", flush=True)
    sim = start_sim(sim_args(preset))
    try:
        outcome = run_sweep(SweepSettings(host=sim.url, scenario_file=scenario, label=preset, out=out), view=view)
    except LaunchError as e:
        print(f"specload demo: {e}", file=sys.stderr)
        return e.code, None
    finally:
        sim.stop()
    return outcome.exit_code, outcome.run_dir


def run_demo(scenario: str, out: str, view: TableView = WHOLE) -> int:
    """Both sweeps and their comparison; ``view``: the printed tables' columns (``--columns``)."""
    from specload.compare import CompareError, print_result, run_compare

    print(
        "specload demo: two SIMULATED servers (no GPU, no model): the reference deployment's baseline and\n"
        f"its MTP speculative-decoding twin. Simulated time runs {1 / DEMO_TIME_SCALE:g}x faster than real time.",
        flush=True,
    )
    runs: list[str] = []
    for preset in ("baseline", "mtp"):
        code, run_dir = _sweep(preset, scenario, out, view)
        if code != 0 or run_dir is None:
            print(f"specload demo: the {preset} sweep did not complete (exit {code})", file=sys.stderr)
            return code or 1
        runs.append(run_dir)
    print("\n=== specload demo: baseline vs MTP ===", flush=True)
    try:
        print_result(run_compare(runs, view=view))
        code = 0
    except CompareError as e:
        print(f"specload demo: {e}", file=sys.stderr)
        code = 2
    print(
        f"\nspecload demo: SIMULATED at {1 / DEMO_TIME_SCALE:g}x real time, so absolute tok/s are "
        f"{1 / DEMO_TIME_SCALE:g}x the simulated deployment's;\nthe changes and the crossover do not depend on "
        "the time scale. Against a real server: make sweep HOST=http://server:port LABEL=... (README).",
        flush=True,
    )
    return code
