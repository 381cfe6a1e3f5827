"""``specload predict``: the speculative arm predicted from a baseline run and a few speculative probes.

The probes are either run directories already made (``--probe DIR``) or made here against a running
speculative server (``--host URL``): a sweep of the baseline's own scenario (the same prompts and
lengths, which acceptance depends on) at the two or three levels specload.analysis.stepcost chooses.
The prediction is written as prediction.json and prediction.md beside the probes (or into ``--out-dir``).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specload.analysis import stepcost as sc
from specload.analysis.predict import PREDICTION_JSON, PREDICTION_MD, Prediction, build, encode
from specload.analysis.run import NotARunDir, Run, load_run
from specload.client.introspect import server_config
from specload.core.rundir import ServerInfo
from specload.experiment.plan import scenario_toml
from specload.launch import EXIT_INCOMPLETE, EXIT_OK, EXIT_USAGE, LaunchError, SweepSettings, run_sweep
from specload.present.predictview import render
from specload.workload.config import ScenarioError, apply_overrides
from specload.workload.recorded import recorded_scenario


@dataclass
class PredictSettings:
    baseline: Sequence[str]
    probes: Sequence[str] = ()
    host: str | None = None  # a running speculative server to probe
    levels: Sequence[int] = ()  # the probe levels (default: chosen)
    spec_cap: int | None = None
    draft_tokens: int | None = None
    what_cap: int | None = None
    what_draft: int | None = None
    what_output: float | None = None
    out_dir: str | None = None
    label: str = "probe"
    out: str = "results"
    insecure: bool = False
    processes: int | None = None
    locust_args: Sequence[str] = field(default_factory=tuple)


def write_prediction(pred: Prediction, directory: str | Path) -> tuple[Path, Path]:
    d = Path(directory)
    js, md = d / PREDICTION_JSON, d / PREDICTION_MD
    js.write_bytes(encode(pred) + b"\n")
    md.write_text(render(pred))
    return js, md


def probe_sweep(
    baseline: Run,
    host: str,
    levels: Sequence[int],
    *,
    label: str,
    out: str,
    insecure: bool = False,
    processes: int | None = None,
    locust_args: Sequence[str] = (),
    report: str | None = None,
) -> str:
    """One sweep of the baseline's scenario at ``levels`` against ``host``; its run directory.
    LaunchError when it could not run or did not complete."""
    scn = recorded_scenario(baseline.info)
    if scn is None:
        raise LaunchError(EXIT_USAGE, f"{baseline.run_dir}: run.json holds no scenario to probe with")
    try:
        scn = apply_overrides(scn, {"levels": list(levels), "repeat": 1}, source="the probe levels")
    except ScenarioError as e:
        raise LaunchError(EXIT_USAGE, str(e)) from None
    with tempfile.TemporaryDirectory(prefix="specload-probe-") as tmp:
        path = os.path.join(tmp, "probe.toml")
        Path(path).write_text(scenario_toml(scn))
        outcome = run_sweep(
            SweepSettings(
                host=host,
                scenario_file=path,
                label=label,
                out=out,
                insecure=insecure,
                processes=processes,
                locust_args=locust_args,
            ),
            report,
        )
    if outcome.run_dir is None or outcome.exit_code != EXIT_OK:
        raise LaunchError(EXIT_INCOMPLETE, f"the probe sweep did not complete (status {outcome.status})")
    return outcome.run_dir


def ladder(runs: Sequence[Run]) -> list[int]:
    return sorted({s.concurrency for r in runs for s in r.levels if s.rate is None})


def run_predict(s: PredictSettings) -> int:
    """The command; its exit code."""
    try:
        base = [load_run(d) for d in s.baseline]
        probes = [load_run(d) for d in s.probes]
    except NotARunDir as e:
        print(f"specload predict: {e}", file=sys.stderr)
        return EXIT_USAGE
    if not probes and s.host is None:
        print(
            "specload predict: give the probes (--probe DIR) or a speculative server to probe (--host)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    spec_cap = s.spec_cap
    if s.host is not None:
        if spec_cap is None:
            spec_cap = ServerInfo(server_config(s.host, insecure=s.insecure)).max_running
        levels = list(s.levels) or sc.choose_probes(ladder(base), spec_cap)
        print(f"specload predict: probing {s.host} at C = {', '.join(map(str, levels))}", flush=True)
        try:
            run_dir = probe_sweep(
                base[0],
                s.host,
                levels,
                label=s.label,
                out=s.out,
                insecure=s.insecure,
                processes=s.processes,
                locust_args=s.locust_args,
            )
        except LaunchError as e:
            print(f"specload predict: {e}", file=sys.stderr)
            return e.code
        probes.append(load_run(run_dir))
    try:
        pred = build(
            base,
            probes,
            spec_cap=spec_cap,
            draft=s.draft_tokens,
            what_cap=s.what_cap,
            what_draft=s.what_draft,
            what_output=s.what_output,
        )
    except ValueError as e:
        print(f"specload predict: {e}", file=sys.stderr)
        return EXIT_INCOMPLETE
    target = s.out_dir or str(probes[-1].run_dir)
    js, md = write_prediction(pred, target)
    print(render(pred), flush=True)
    print(f"specload: prediction written to {js} and {md}", flush=True)
    return EXIT_OK
