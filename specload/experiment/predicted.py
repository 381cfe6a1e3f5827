"""``specload experiment --predict``: predict the speculative arm, then measure it only where it decides.

The order: the baseline's whole ladder; the speculative arm at two or three probe levels (chosen once
its server says its running cap); the prediction (specload.analysis.predict); then the speculative arm
at the levels that decide the answer (the ladder levels on either side of the predicted crossover C*,
and the first level at or past the cap). Each new measurement is set against the prediction made
before it, then joins the fit, until every deciding level is measured. With ``--repeat auto`` the
deciding levels whose sign is not yet outside the noise get interleaved repeats (baseline, then
speculative), only those levels, until settled or until the next round would overrun ``--budget``.
The cost saved is printed against the full two-arm ladder, as an estimate made from this run's own
measurements. docs/experiment.md, "Predict, then verify".
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from specload.analysis import stepcost as sc
from specload.analysis.comparison import change_of
from specload.analysis.predict import Prediction, build, check, encode, run_obs, to_builtins
from specload.analysis.run import Run, load_run
from specload.core.rundir import ServerInfo, new_run_dir
from specload.experiment.cap import command_cap
from specload.experiment.plan import Arm
from specload.experiment.predict import write_prediction
from specload.experiment.record import COMPLETED, INTERRUPTED, SWEEP_TOML, Experiment, RunEntry
from specload.experiment.run import (
    ExperimentError,
    ExperimentSettings,
    LaunchError,
    _check,
    _Guard,
    _report_failure,
    _run_entry,
    _sweep_settings,
    compare_arms,
)
from specload.launch import EXIT_OK, EXIT_USAGE
from specload.present.compare import print_result
from specload.present.predictview import checked_table, render

REFINED_JSON = "prediction-refined.json"
PREDICTED_MD = "predicted-experiment.md"
MAX_AUTO_RUNS = (
    10  # --repeat auto without --budget: a level still inside the noise after this many runs a side stays so
)
MIN_FULL_REPEATS = 2  # the full experiment a verdict outside the noise needs: two repeats per arm at least


@dataclass(frozen=True)
class LevelSign:
    """The measured change of the aggregate at one deciding level, and whether its sign is settled."""

    concurrency: int
    change: float | None  # spec / baseline - 1
    noise: float | None  # the half-width it must exceed (a fraction)
    repeats: tuple[int, int]  # (baseline, speculative) measurements
    test: str  # "repeats" (Welch, as the comparison) or "per-request" (single runs: the requests' spread)
    settled: bool
    why: str  # for an unsettled level: why


@dataclass(frozen=True)
class Saving:
    wall_s: float  # this experiment, start to verdict
    requests: int
    full_wall_s: float  # the full two-arm ladder at full_repeats, estimated from this run's measurements
    full_requests: int
    full_repeats: int
    sentence: str


def _agg(runs: Sequence[Run], c: int) -> list[float]:
    return [
        s.agg_tok_s for r in runs for s in r.levels if s.concurrency == c and s.rate is None and s.agg_tok_s
    ]


def level_sign(base: Sequence[Run], spec: Sequence[Run], c: int) -> LevelSign:
    """The sign at ``c``: with two or more repeats on both sides the comparison's own noise test (Welch);
    with one on either side, the change against 1.96 x the two levels' per-request standard errors
    (docs/experiment.md says why that is weaker)."""
    b, s = _agg(base, c), _agg(spec, c)
    if not b or not s:
        return LevelSign(c, None, None, (len(b), len(s)), "none", False, "not measured on both arms")
    mb, ms = sum(b) / len(b), sum(s) / len(s)
    change = ms / mb - 1.0
    if len(b) >= 2 and len(s) >= 2:
        ch = change_of(b, s, mb, ms)
        hw = (ch.test_hw if ch.test_hw is not None else ch.ci or 0.0) / 100.0
        settled = not ch.noise
        why = "" if settled else f"{100 * change:+.1f} % is inside the repeats' noise (±{100 * hw:.1f} %)"
        return LevelSign(c, change, hw, (len(b), len(s)), "repeats", settled, why)
    ob, os_ = run_obs(base, [c]), run_obs(spec, [c])
    se = math.sqrt((ob[0].rel_se if ob else 0.0) ** 2 + (os_[0].rel_se if os_ else 0.0) ** 2)
    hw = sc.Z95 * se
    settled = abs(change) > hw
    why = "" if settled else f"{100 * change:+.1f} % is inside the requests' noise (±{100 * hw:.1f} %)"
    return LevelSign(c, change, hw, (len(b), len(s)), "per-request", settled, why)


def deciding_levels(ladder: Sequence[int], x: sc.Crossover, cap: int | None) -> tuple[list[int], list[int]]:
    """(the levels either side of C*, those plus the first level at or past the cap). Without a
    predicted crossing: the ladder's top level (where a crossing would show first)."""
    cs = sorted(ladder)
    if x.c_star is not None:
        below = [c for c in cs if c <= x.c_star]
        above = [c for c in cs if c > x.c_star]
        bracket = ([below[-1]] if below else []) + ([above[0]] if above else [])
    else:
        bracket = [cs[-1]]
    at_cap = [c for c in cs if cap is not None and c >= cap][:1] or [cs[-1]]
    return bracket, sorted(set(bracket) | set(at_cap))


def _runs(ex: Experiment, arm: str) -> list[Run]:
    return [load_run(e.run_dir) for e in ex.entries if e.arm == arm and e.status == COMPLETED and e.run_dir]


def _walls(runs: Sequence[Run]) -> dict[int, float]:
    by: dict[int, list[float]] = {}
    for r in runs:
        for s in r.levels:
            if s.rate is None and s.wall_s:
                by.setdefault(s.concurrency, []).append(s.wall_s)
    return {c: sum(v) / len(v) for c, v in by.items()}


def saving(
    ex: Experiment, base: Sequence[Run], spec: Sequence[Run], pred: Prediction, wall_s: float
) -> Saving:
    """This run's cost against the full two-arm ladder at MIN_FULL_REPEATS (or this run's most repeats),
    estimated from what was measured here: the baseline's first start (server, smoke, Locust, every
    level) stands for each full ladder; a speculative level not measured takes the baseline level's
    wall time scaled by baseline / predicted aggregate (the same requests and tokens)."""
    first = next(e for e in ex.entries if e.arm == ex.plan.arms[0].label and e.status == COMPLETED)
    entry_s = (first.ended_at or 0.0) - (first.started_at or 0.0)
    wb, ws = _walls(base[:1]), _walls(spec)
    ladder = sorted(wb)
    overhead = entry_s - sum(wb.values())
    pl = {p.concurrency: p for p in pred.levels}
    spec_ladder = 0.0
    for c in ladder:
        p = pl.get(c)
        spec_ladder += ws.get(c) or (wb[c] * (p.baseline_agg_tok_s or 0) / p.agg_tok_s if p else wb[c])
    reps = max(
        [MIN_FULL_REPEATS] + [len(_agg(base, c)) for c in ladder] + [len(_agg(spec, c)) for c in ladder]
    )
    full_wall = reps * (entry_s + overhead + spec_ladder)
    sent = sum(s.sent for r in [*base, *spec] for s in r.levels)
    ladder_sent = sum(s.sent for s in base[0].levels)
    full_req = reps * 2 * ladder_sent
    against = (
        f"against the full two-arm ladder at --repeat {reps} (estimated {full_wall:.0f} s and {full_req} "
        f"requests; this experiment: {wall_s:.0f} s and {sent} requests)"
    )
    if full_wall > wall_s:
        sentence = (
            f"saved {full_wall - wall_s:.0f} s of wall time ({100 * (1 - wall_s / full_wall):.0f} %) and "
            f"{max(full_req - sent, 0)} requests {against}"
        )
    else:  # a short ladder whose every level decides: nothing left to skip
        sentence = f"saved nothing {against}"
    return Saving(wall_s, sent, full_wall, full_req, reps, sentence)


@dataclass
class _Loop:
    ex: Experiment
    s: ExperimentSettings
    guard: _Guard
    base_arm: Arm
    spec_arm: Arm
    failed: RunEntry | None = None

    def entry(self, arm: Arm) -> RunEntry:
        e = RunEntry(
            order=len(self.ex.entries) + 1,
            arm=arm.label,
            repeat=1 + sum(x.arm == arm.label for x in self.ex.entries),
        )
        self.ex.entries.append(e)
        return e

    def run(self, arm: Arm, levels: Sequence[int] | None, chooser: Any = None, then: Any = None) -> bool:
        """One start of ``arm`` (and, through ``then``, more sweeps of the same server); False when
        any of its sweeps did not complete or a signal came."""
        first = len(self.ex.entries)
        e = self.entry(arm)
        s = (
            self.s
            if levels is None
            else replace(self.s, overrides={**self.s.overrides, "levels": list(levels)})
        )
        try:
            _run_entry(self.ex, s, arm, e, self.guard, chooser, then)
        except KeyboardInterrupt:
            last = self.ex.entries[-1]
            last.status, last.message = INTERRUPTED, "interrupted"
        bad = [x for x in self.ex.entries[first:] if x.status != COMPLETED]
        if bad or self.guard.received is not None:
            self.failed = bad[0] if bad else RunEntry(0, arm.label, e.repeat, INTERRUPTED, "interrupted")
            return False
        return True


def run_predicted(s: ExperimentSettings) -> int:
    """The --predict experiment; its exit code."""
    try:
        plan, sweep_text = _check(s)
    except (ExperimentError, LaunchError) as err:
        print(f"specload experiment: {err}", file=sys.stderr)
        return EXIT_USAGE
    t0 = time.time()
    directory = Path(new_run_dir(s.out, f"experiment-{plan.name}"))
    (directory / SWEEP_TOML).write_text(sweep_text)
    ex = Experiment(plan, directory, s.repeat, dict(s.overrides))
    ladder = sorted(
        set(
            _sweep_settings(s, str(directory / SWEEP_TOML), "http://127.0.0.1:1", "x", s.out)
            .scenario()
            .levels
        )
    )
    print(
        f"specload: experiment {plan.name} --predict: baseline ladder C = {ladder}, in {directory}",
        flush=True,
    )
    ex.save()
    guard = _Guard()
    guard.install()
    loop = _Loop(ex, s, guard, plan.arms[0], plan.arms[1])
    caps: list[int | None] = []

    def probes(cfg: dict[str, Any], argv: Sequence[str]) -> list[int]:
        cap = ServerInfo(cfg).max_running or (command_cap(argv) or (None, ""))[0]
        caps.append(cap)
        levels = sc.choose_probes(ladder, cap)
        print(
            f"specload: {plan.arms[1].label}: running cap {cap or 'unknown'}; probes at C = {levels}",
            flush=True,
        )
        return levels

    preds: list[Prediction] = []  # every fit, the first from the probes alone
    signs: list[LevelSign] = []
    notes: list[str] = []

    def refit() -> tuple[Prediction, list[int], list[int]]:
        """Fit on everything measured so far; (the prediction, the deciding levels, those not measured)."""
        base, spec = _runs(ex, loop.base_arm.label), _runs(ex, loop.spec_arm.label)
        cap = caps[0] if caps else None
        pred = build(base, spec, spec_cap=cap)
        preds.append(pred)
        bracket, deciding = deciding_levels(ladder, pred.crossover, cap)
        measured = {o.concurrency for o in run_obs(spec)}
        return pred, bracket, [c for c in deciding if c not in measured]

    def then(_done: RunEntry) -> tuple[RunEntry, list[int]] | None:
        """After a speculative sweep: the deciding levels it has not measured yet, on the same server."""
        pred, _, new = refit()
        if not new:
            return None
        print(
            f"specload: predicted: {pred.crossover.sentence}; measuring {loop.spec_arm.label} at C = {new} "
            "(same server)",
            flush=True,
        )
        return loop.entry(loop.spec_arm), new

    try:
        ok = loop.run(loop.base_arm, None) and loop.run(loop.spec_arm, None, probes, then)
        while ok:
            pred, bracket, new = refit()
            if new:  # (a refit after repeats moved C*)
                ok = loop.run(loop.spec_arm, new, None, then)
                continue
            base, spec = _runs(ex, loop.base_arm.label), _runs(ex, loop.spec_arm.label)
            signs = [level_sign(base, spec, c) for c in bracket]
            if s.repeat_auto:
                again = [x.concurrency for x in signs if not x.settled and min(x.repeats) < MAX_AUTO_RUNS]
                stop = f"--repeat auto stops at {MAX_AUTO_RUNS} runs a side of a level"
                if len(again) < sum(not x.settled for x in signs) and stop not in notes:
                    notes.append(stop)
            else:  # --repeat N: the levels around C* N times a side, settled or not
                again = [c for c in bracket if min(len(_agg(base, c)), len(_agg(spec, c))) < s.repeat]
            if not again:
                break
            elapsed = time.time() - t0
            rounds = [e for e in ex.entries[2:] if e.ended_at and e.started_at]
            per_round = 2 * max(((e.ended_at or 0) - (e.started_at or 0) for e in rounds), default=0.0)
            if s.repeat_auto and s.budget_s is not None and elapsed + per_round > s.budget_s:
                notes.append(
                    f"budget {s.budget_s:.0f} s: {elapsed:.0f} s spent, the next round would take ~{per_round:.0f} s"
                )
                break
            why = "sign not settled" if s.repeat_auto else f"--repeat {s.repeat}"
            print(
                f"specload: {why} at C = {again}: one more interleaved run of those levels a side", flush=True
            )
            ok = loop.run(loop.base_arm, again) and loop.run(loop.spec_arm, again, None, then)
    finally:
        with guard.deferred():
            ex.ended_at = time.time()
            ex.status = (
                "completed"
                if loop.failed is None
                else ("interrupted" if loop.failed.status == INTERRUPTED else "failed")
            )
            ex.message = None if loop.failed is None else loop.failed.message
            ex.save()
        guard.restore()
    if loop.failed is not None or not preds:
        return _report_failure(ex, loop.failed or RunEntry(0, "", 0, "failed", "no prediction"))
    pred0, pred = preds[0], preds[-1]
    base, spec = _runs(ex, loop.base_arm.label), _runs(ex, loop.spec_arm.label)
    # the first prediction, made from the probes alone, against every speculative level measured since
    pred0.checked = check(pred0, run_obs(spec))
    write_prediction(pred0, directory)
    (directory / REFINED_JSON).write_bytes(encode(pred) + b"\n")
    if not signs:
        signs = [
            level_sign(base, spec, c)
            for c in deciding_levels(ladder, pred.crossover, caps[0] if caps else None)[0]
        ]
    verdict = verdict_sentence(signs, pred.crossover)
    cost = saving(ex, base, spec, pred, time.time() - t0)
    text = predicted_text(pred0, pred, signs, verdict, cost, notes)
    (directory / PREDICTED_MD).write_text(text)
    print("")
    print(text, flush=True)
    try:
        result = compare_arms(ex, s.report_format, s.view, s.plot)
        print_result(result)
    except ValueError as err:
        print(f"specload experiment: no side-by-side comparison: {err}", file=sys.stderr)
    ex.comparison = {
        "predict": {
            "verdict": verdict,
            "crossover": to_builtins(pred.crossover),
            "first_crossover": to_builtins(pred0.crossover),
            "signs": [asdict(g) for g in signs],
            "saving": asdict(cost),
            "checked": to_builtins(pred0.checked),
            "notes": notes,
        }
    }
    ex.save()
    print(f"specload: experiment {directory} ({ex.path.name})", flush=True)
    return EXIT_OK


def verdict_sentence(signs: Sequence[LevelSign], x: sc.Crossover) -> str:
    """What the deciding levels measured, as a sentence: settled or not, and why not."""
    parts = []
    for g in signs:
        if g.change is None:
            parts.append(f"C={g.concurrency}: {g.why}")
            continue
        way = "pays" if g.change > 0 else "loses"
        state = "settled" if g.settled else f"unsettled: {g.why}"
        parts.append(
            f"C={g.concurrency}: speculation {way} {100 * g.change:+.1f} % "
            f"({g.repeats[0]}+{g.repeats[1]} runs, {g.test} noise ±{100 * (g.noise or 0):.1f} %; {state})"
        )
    head = (
        f"crossover measured between C={signs[0].concurrency} and C={signs[-1].concurrency}"
        if len(signs) == 2
        and all(g.settled for g in signs)
        and (signs[0].change or 0) > 0 > (signs[-1].change or 0)
        else ("crossover not settled" if x.c_star is not None else "no crossover predicted inside the ladder")
    )
    return head + ": " + "; ".join(parts)


def predicted_text(
    pred0: Prediction,
    pred: Prediction,
    signs: Sequence[LevelSign],
    verdict: str,
    cost: Saving,
    notes: Sequence[str],
) -> str:
    lines = [
        "# Predict, then verify",
        "",
        f"- First prediction (probes at C = {', '.join(map(str, pred0.probe_levels))}): {pred0.crossover.sentence}",
        f"- Refined with every measured speculative level ({', '.join(map(str, pred.probe_levels))}): "
        f"{pred.crossover.sentence}",
        f"- Verdict: {verdict}",
        f"- Cost: {cost.sentence}",
    ]
    lines += [f"- {n}" for n in notes]
    lines += [
        "",
        "## First prediction against measurement (speculative aggregate)",
        "",
        checked_table(pred0),
        "",
        render(pred0),
    ]
    return "\n".join(lines)
