"""An experiment's pooled comparison: each arm's completed runs as the repeats of one run, compared and
written in the experiment directory (comparison.md, the plots, and comparison.html with ``--format html``).

``specload experiment`` makes it when its last run ends; ``specload compare EXPERIMENT_DIR`` makes it
again from the directory alone (experiment.json names each arm's runs), in another format or under
another SLO, without running anything. Given the run directories one by one, ``compare`` would
compare each start of an arm as a run of its own, each "(1 run)", instead of pooling them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specload.analysis.comparison import Comparison, build_comparison
from specload.analysis.paired import paired_of_runs
from specload.analysis.run import Run, load_run
from specload.core.rundir import read_json
from specload.core.slo import Slo, SloError, parse_slo
from specload.present.compare import (
    COMPARISON_MD,
    print_result,
    write_comparison,
)
from specload.present.output import format_help, is_known_format
from specload.present.tableview import columns_help, view_for

EXPERIMENT_JSON = "experiment.json"  # as specload.experiment.record writes it
COMPLETED = "completed"


@dataclass(frozen=True)
class ArmRuns:
    """One arm and its completed runs: (order of the run in the experiment, its run directory)."""

    label: str
    runs: tuple[tuple[int, str], ...]


def pooled(runs: Sequence[Run]) -> Run:
    """An arm's runs as one run whose levels carry every run's repeats (renumbered one after the other),
    so the comparison's means and confidence intervals are over all of them."""
    if len(runs) == 1:
        return runs[0]
    span = max((s.repeat for r in runs for s in r.levels), default=0) + 1
    levels = [replace(s, repeat=i * span + s.repeat) for i, r in enumerate(runs) for s in r.levels]
    return replace(
        runs[0],
        levels=levels,
        crosscheck=[c for r in runs for c in r.crosscheck],
        notices=[n for r in runs for n in r.notices],
        samples=[x for r in runs for x in r.samples],
    )


def pooled_comparison(arms: Sequence[ArmRuns], slo: Slo | None = None) -> Comparison:
    """The arms side by side, the baseline first, each arm's runs pooled; ``slo``: judge every run
    against it (default: each run's own). Raises ValueError when an arm has no run."""
    runs, notes, arm_runs = [], [], []
    for arm in arms:
        if not arm.runs:
            raise ValueError(f"the arm {arm.label} has no completed run")
        loaded = [load_run(d) if slo is None else load_run(d, slo) for _, d in arm.runs]
        arm_runs.append((arm.label, loaded))
        runs.append(pooled(loaded))
        if len(arm.runs) > 1:
            notes.append(
                f"{arm.label}: {len(arm.runs)} runs pooled as repeats of each level (runs "
                + ", ".join(f"{order}: {d}" for order, d in arm.runs)
                + ")"
            )
    comp = build_comparison(runs)
    comp.notes.extend(notes)
    if any(len(loaded) > 1 for _, loaded in arm_runs):  # a trace's requests paired over every run of each arm
        comp.paired = paired_of_runs(arm_runs, runs[0].slo)[0]
    return comp


# ---------------------------------------------------------------- from the directory alone


def is_experiment_dir(path: str | Path) -> bool:
    return (Path(path) / EXPERIMENT_JSON).is_file()


def _run_dir(directory: Path, recorded: str) -> str:
    """A run directory as experiment.json recorded it (relative to where the experiment was started),
    else the one of that name inside the experiment directory (moved, or read from elsewhere)."""
    if (Path(recorded) / "run.json").is_file():
        return recorded
    return str(directory / Path(recorded).name)


def arms_of(directory: str | Path) -> list[ArmRuns]:
    """Each arm's completed runs, from experiment.json; ValueError when it cannot be read."""
    d = Path(directory)
    try:
        doc: Any = read_json(str(d / EXPERIMENT_JSON))
    except (OSError, ValueError) as e:
        raise ValueError(f"{d / EXPERIMENT_JSON}: {e}") from None
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("arms"), list)
        or not isinstance(doc.get("runs"), list)
    ):
        raise ValueError(f"{d / EXPERIMENT_JSON}: not an experiment.json (no arms and runs)")
    arms = []
    for arm in doc["arms"]:
        label = arm.get("label") if isinstance(arm, dict) else None
        if not isinstance(label, str):
            raise ValueError(f"{d / EXPERIMENT_JSON}: an arm without a label")
        runs = tuple(
            (int(r.get("order") or 0), _run_dir(d, r["run_dir"]))
            for r in doc["runs"]
            if isinstance(r, dict)
            and r.get("arm") == label
            and r.get("status") == COMPLETED
            and isinstance(r.get("run_dir"), str)
        )
        arms.append(ArmRuns(label, runs))
    if len(arms) < 2:
        raise ValueError(f"{d / EXPERIMENT_JSON}: fewer than two arms")
    return arms


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specload compare",
        description="The pooled comparison of an experiment directory (specload experiment's output), made "
        "again: each arm's completed runs pooled as repeats of each level, the first arm the baseline.",
    )
    p.add_argument("experiment", metavar="EXPERIMENT_DIR", help="results/experiment-<name>-<UTC time>/")
    p.add_argument("--format", default="github", help=format_help())
    p.add_argument("--no-plot", action="store_true", help="do not draw the plots")
    p.add_argument(
        "--out", metavar="DIR", help=f"directory for {COMPARISON_MD} and the rest (default: EXPERIMENT_DIR)"
    )
    p.add_argument("--columns", default=None, metavar="SETS", help=columns_help())
    p.add_argument("--slo", default=None, help="judge every run against this SLO (default: each run's own)")
    return p


def compare_experiment(argv: Sequence[str]) -> int:
    """``specload compare EXPERIMENT_DIR [--format F] [--out DIR] [--no-plot] [--columns] [--slo]``."""
    args = _parser().parse_args(argv)
    try:
        view = view_for(args.columns)
        if not is_known_format(args.format):
            raise ValueError(f"unknown format {args.format!r}")
        slo = parse_slo(args.slo) if args.slo else None
        comp = pooled_comparison(arms_of(args.experiment), slo)
        out = Path(args.out) if args.out else Path(args.experiment)
        out.mkdir(parents=True, exist_ok=True)
        result = write_comparison(comp, out, args.format, view, not args.no_plot)
    except (ValueError, SloError, OSError) as e:
        print(f"specload compare: {e}", file=sys.stderr)
        return 2
    print_result(result)
    return 0


def compare_main(argv: Sequence[str]) -> int:
    """``specload compare``: an experiment directory alone is pooled here, anything else is
    specload.present.compare's."""
    if any(not a.startswith("-") and is_experiment_dir(a) for a in argv):
        return compare_experiment(argv)  # its parser refuses run directories beside it
    if "-h" in argv or "--help" in argv:
        print(
            "specload compare EXPERIMENT_DIR [--format F] [--out DIR] [--no-plot] [--columns SETS] [--slo SLO]: "
            "an experiment's pooled comparison, made again (specload compare EXPERIMENT_DIR --help)\n"
        )
    from specload.present.compare import main

    return main(argv)
