"""``make demo``: the main job, end to end, against the built-in simulated server.

Starts the simulator (no GPU, no model), sweeps it with scenarios/demo.toml, prints the
per-level table and stops the simulator by PID, whatever happens in between.
"""

from __future__ import annotations

import argparse

from specload.simproc import start_sim

# A server that behaves like the reference deployment's baseline at low load: about 110 tok/s for
# one request, and a running-request cap of 48 above which requests queue.
DEMO_SIM_ARGS = ["--ttft-ms", "120", "--itl-ms", "9", "--prefill-us-per-token", "60", "--max-running", "48",
                 "--model", "demo-model"]  # fmt: skip


def run_demo(args: argparse.Namespace) -> int:
    from specload.cli import main as cli_main

    print("specload demo: starting the built-in simulated server (SIMULATED: no GPU, no model)", flush=True)
    sim = start_sim(DEMO_SIM_ARGS)
    try:
        print(f"specload demo: simulator at {sim.url}; sweeping with {args.scenario}", flush=True)
        return cli_main(["sweep", "--host", sim.url, "--scenario", args.scenario, "--label", "demo", "--out", args.out])
    finally:
        sim.stop()
