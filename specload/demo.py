"""``make demo``: the whole story, end to end, against the built-in simulated server.

Two simulated servers calibrated on the reference deployment (docs/simulator.md): a baseline and
the same model with MTP speculative decoding (one draft token, capped at 48 running requests,
KV cache shrunk by the draft). Each is swept with scenarios/demo.toml (the reference sweep's
shape, shorter outputs, time sped up, judged against the scenario's SLO), then the two runs are
compared: per-level tables, the side-by-side comparison, the crossover sentence and the plots.
Last, a capacity search on each server, between the levels its sweep found the SLO met and
missed, ends the demo with one sentence: how far each deployment meets the SLO, and why. No
GPU, no model download; every simulator is stopped by PID whatever happens.
"""

from __future__ import annotations

import os
import sys
import textwrap

from specload.analysis.capacity import SearchSpace
from specload.launch import LaunchError, SweepSettings, run_capacity, run_sweep
from specload.present.colour import for_stream, is_terminal
from specload.present.tableview import WHOLE, TableView, terminal_width
from specload.sim.process import start_sim

# Time runs 1 / DEMO_TIME_SCALE times faster than in the reference deployment, so that the whole
# demo (two sweeps, the comparison, two capacity searches) fits in two minutes on two cores, with
# its first table within the first minute; tok/s figures are in the demo's time (see below).
# scenarios/demo.toml's SLO is written in the same time.
DEMO_TIME_SCALE = 0.25
# The capacity searches stop when the bracket is within an eighth of its lower end (C=20..22, not
# 20..21): one probe less per server, so the whole demo stays under about four minutes.
DEMO_CAPACITY_TOLERANCE = 0.125


def sim_args(preset: str) -> list[str]:
    return [
        "--engine",
        "batch",
        "--preset",
        preset,
        "--time-scale",
        str(DEMO_TIME_SCALE),
        "--model",
        "demo-model",
    ]


def _sweep(preset: str, scenario: str, out: str, view: TableView) -> tuple[int, str | None]:
    print(f"\n=== specload demo: {preset.upper()} (SIMULATED server, preset '{preset}') ===", flush=True)
    sim = start_sim(sim_args(preset))
    try:
        outcome = run_sweep(
            SweepSettings(host=sim.url, scenario_file=scenario, label=preset, out=out), view=view
        )
    except LaunchError as e:
        print(f"specload demo: {e}", file=sys.stderr)
        return e.code, None
    finally:
        sim.stop()
    return outcome.exit_code, outcome.run_dir


def _capacity(preset: str, scenario: str, out: str, sweep_dir: str) -> str | None:
    """A capacity search on a fresh simulator of ``preset``, from the level where its sweep missed
    the SLO, between half the level where it met it and twice the first (a level near the boundary
    can go the other way on a second look). The search measures its own levels, so its answer
    stands on its own run. Returns the run directory (None when it did not complete)."""
    from specload.analysis.run import load_run

    run = load_run(sweep_dir)
    cap = run.capacity()
    levels = sorted({s.concurrency for s in run.levels})
    if cap is None or not levels:
        return None
    lo = int(cap.lo) if cap.lo is not None else 1
    hi = int(cap.hi) if cap.hi is not None else max(levels)
    space = SearchSpace("concurrency", hi, max(1, lo // 2), 2 * hi, DEMO_CAPACITY_TOLERANCE)
    found = (
        f"met the SLO at C={lo} and missed it at C={hi}"
        if cap.hi is not None
        else f"met the SLO up to C={hi}"
    )
    print(f"\n--- {preset}: its sweep {found}; searching from C={hi} ---", flush=True)
    sim = start_sim(sim_args(preset))
    try:
        settings = SweepSettings(
            host=sim.url, scenario_file=scenario, label=preset, out=os.path.join(out, "capacity")
        )
        outcome = run_capacity(settings, space, report_format=None)
    except LaunchError as e:
        print(f"specload demo: {e}", file=sys.stderr)
        return None
    finally:
        sim.stop()
    return outcome.run_dir if outcome.exit_code == 0 else None


def _capacity_sentence(runs: list[str], scenario: str, out: str) -> int:
    from specload.present.compare import CompareError, run_compare
    from specload.workload.config import load_scenario

    if not load_scenario(scenario).slo:
        return 0  # a scenario without an SLO: nothing to search for
    print(f"\n=== specload demo: capacity under the SLO ({_slo_words(scenario)}) ===", flush=True)
    found = []
    for preset, sweep_dir in zip(("baseline", "mtp"), runs, strict=True):
        run_dir = _capacity(preset, scenario, out, sweep_dir)
        if run_dir is None:
            print(f"specload demo: the {preset} capacity search did not complete", file=sys.stderr)
            return 1
        found.append(run_dir)
    try:
        result = run_compare(found, plot=False)
    except CompareError as e:
        print(f"specload demo: {e}", file=sys.stderr)
        return 2
    print("")
    for sentence in result.comparison.slo.sentences:
        _say(sentence)
    _say(f"(runs: {found[0]} and {found[1]}; {result.markdown})")
    return 0


def _say(text: str) -> None:
    """Print ``text`` wrapped at word boundaries to the terminal's width, verdict words coloured there."""
    if not is_terminal(sys.stdout):
        print(text, flush=True)
        return
    width = terminal_width()
    lines = [
        "\n".join(textwrap.wrap(p, width, break_long_words=False, break_on_hyphens=False)) or p
        for p in text.split("\n")
    ]
    print(for_stream("\n".join(lines), sys.stdout), flush=True)


def _slo_words(scenario: str) -> str:
    from specload.workload.config import load_scenario

    slo = load_scenario(scenario).slo
    return f"{slo}, in the demo's {1 / DEMO_TIME_SCALE:g}x time" if slo else "none"


def run_demo(scenario: str, out: str, view: TableView = WHOLE) -> int:
    """Both sweeps, their comparison and the capacity searches; ``view``: the printed tables' columns (``--columns``)."""
    from specload.present.compare import CompareError, print_result, run_compare

    _say(
        "specload demo: two SIMULATED servers (no GPU, no model): the reference deployment's baseline and "
        f"its MTP speculative-decoding twin. Simulated time runs {1 / DEMO_TIME_SCALE:g}x faster than real time."
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
    if code == 0:
        code = _capacity_sentence(runs, scenario, out)
    _say(
        f"\nspecload demo: SIMULATED at {1 / DEMO_TIME_SCALE:g}x real time, so absolute tok/s are "
        f"{1 / DEMO_TIME_SCALE:g}x the simulated deployment's and the SLO's thresholds are {DEMO_TIME_SCALE:g}x its; "
        "the changes, the crossover and the capacities do not depend on the time scale.\n"
        "Against a real server: specload sweep --host http://server:port --label NAME "
        "(in a clone: make sweep HOST=http://server:port LABEL=NAME; README)."
    )
    return code
