"""A prediction of the speculative arm from runs: what ``specload predict`` writes as prediction.json.

The runs are read here (their levels' figures, as specload.analysis.metrics made them, pooled over
repeats), handed to the pure model (specload.analysis.stepcost) and the result is one typed document:
the fitted terms, every ladder level predicted with its interval, the crossover, the what-ifs (each
with the assumption it rests on) and, once the speculative arm has been measured somewhere, the
prediction against the measurement. docs/metrics.md, "Predicted speculative curve", defines it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from specload.analysis import stepcost as sc
from specload.analysis.metrics import LevelStats
from specload.analysis.run import Run
from specload.core.safeopen import read_bytes

PREDICTION_JSON = "prediction.json"
PREDICTION_MD = "prediction.md"
PREDICTION_VERSION = 1
ACCEPT_SPREAD_NOTE = 0.05  # relative spread of L over the probes above which a note says so
DRAFT_KEYS = ("speculative_num_steps", "num_speculative_tokens", "spec_num_steps")


class WhatIf(msgspec.Struct, frozen=True):
    """One prediction under a changed setting; never a measurement."""

    name: str  # "cap", "draft_tokens", "output_tokens"
    value: float
    assumption: str  # what the prediction rests on, in a sentence
    sentence: str  # the prediction in a sentence
    levels: list[sc.PredictedLevel]
    crossover: sc.Crossover | None


class Checked(msgspec.Struct, frozen=True):
    """The prediction at a level where the speculative arm was measured too."""

    concurrency: int
    predicted: float  # agg tok/s
    lo: float
    hi: float
    measured: float
    error: float  # predicted / measured - 1
    inside: bool  # measured within [lo, hi]
    probed: bool  # a probe: the fit passes through it, so this checks the arithmetic, not the model
    baseline: float | None = None  # the baseline's agg at this level
    change: float | None = None  # measured spec / baseline - 1


class Prediction(msgspec.Struct, kw_only=True):
    """prediction.json."""

    version: int = PREDICTION_VERSION
    baseline_run: str
    probe_runs: list[str]
    probe_levels: list[int]
    baseline: list[sc.LevelObs]
    probes: list[sc.LevelObs]
    fit: sc.StepFit
    levels: list[sc.PredictedLevel]
    crossover: sc.Crossover
    whatifs: list[WhatIf] = []
    checked: list[Checked] = []
    notes: list[str] = []


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def level_obs(levels: Sequence[LevelStats]) -> sc.LevelObs | None:
    """One concurrency's repeats as the model's input; None when no repeat has a usable aggregate."""
    ok = [s for s in levels if s.agg_tok_s and s.ok and s.output_tokens and "ttft" in s.dists]
    if not ok:
        return None

    def dmean(s: LevelStats, key: str) -> float:
        d = s.dists.get(key)
        return 1e3 * (d.mean or 0.0) if d is not None else 0.0

    aggs = [s.agg_tok_s or 0.0 for s in ok]
    # noise: the repeats' spread when there are repeats, else the per-request TPOT spread
    if len(ok) > 1:
        m = _mean(aggs)
        sd = math.sqrt(sum((a - m) ** 2 for a in aggs) / (len(aggs) - 1))
        rel = sd / m / math.sqrt(len(aggs)) if m > 0 else 0.0
    else:
        d = ok[0].dists.get("tpot")
        rel = (d.std or 0.0) / d.mean / math.sqrt(d.n) if d is not None and d.mean and d.n > 1 else 0.0
    accepts = [s.acceptance.length for s in ok if s.acceptance is not None and s.acceptance.length]
    prompts = [s.prompt_tokens_mean or s.requested_prompt_tokens or 0.0 for s in ok]
    running = [s.server_running_max for s in ok if s.server_running_max is not None]
    queued = [s.server_queued_max for s in ok if s.server_queued_max is not None]
    return sc.LevelObs(
        concurrency=ok[0].concurrency,
        agg_tok_s=_mean(aggs),
        output_tokens=_mean([s.output_tokens / max(s.sent, 1) for s in ok]),
        prompt_tokens=_mean([float(p) for p in prompts]),
        ttft_ms=_mean([dmean(s, "ttft") for s in ok]),
        tpot_ms=_mean([dmean(s, "tpot") for s in ok]),
        accept_length=_mean(accepts) if accepts else 1.0,
        rel_se=rel,
        running_max=max(running) if running else None,
        queued_max=max(queued) if queued else None,
    )


def run_obs(runs: Sequence[Run], only: Sequence[int] | None = None) -> list[sc.LevelObs]:
    """Every concurrency level of ``runs`` (their repeats pooled), lowest first; rate levels are left out."""
    by: dict[int, list[LevelStats]] = {}
    for r in runs:
        for s in r.levels:
            if s.rate is None and (only is None or s.concurrency in only):
                by.setdefault(s.concurrency, []).append(s)
    out = [level_obs(v) for _, v in sorted(by.items())]
    return [o for o in out if o is not None]


def draft_tokens(runs: Sequence[Run]) -> int | None:
    """K, the draft tokens per step: the server's word, else the positions acceptance was counted at."""
    for r in runs:
        for key in DRAFT_KEYS:
            v = r.info.server.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    for r in runs:
        for s in r.levels:
            if s.acceptance is not None and s.acceptance.per_position:
                return len(s.acceptance.per_position)
    return None


def acceptance_shape(runs: Sequence[Run]) -> tuple[list[float], list[float | None], int]:
    """The probes' acceptance per position and along the output (the level with most verify steps)."""
    best = None
    for r in runs:
        for s in r.levels:
            a = s.acceptance
            if a is not None and (best is None or (a.steps or 0) > (best.steps or 0)):
                best = a
    if best is None:
        return [], [], 100
    return list(best.per_position), list(best.along), best.along_bucket


def cap_of(runs: Sequence[Run]) -> int | None:
    for r in runs:
        cap = r.cap
        if cap is not None:
            return cap.value
    return None


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}"


def whatifs(
    fit: sc.StepFit,
    base: Sequence[sc.LevelObs],
    per_position: Sequence[float],
    along: Sequence[float | None],
    bucket: int,
    cap: int | None = None,
    draft: int | None = None,
    output: float | None = None,
) -> list[WhatIf]:
    """The asked-for what-ifs (defaults: twice the cap, K + 1, twice the output)."""
    out: list[WhatIf] = []
    top = max(base, key=lambda o: o.concurrency)
    new_cap = cap if cap is not None else (2 * fit.spec_cap if fit.spec_cap is not None else None)
    if new_cap is not None:
        a = sc.Assumptions(spec_cap=new_cap)
        lv = sc.predict(fit, base, a)
        p = next(x for x in lv if x.concurrency == top.concurrency)
        out.append(
            WhatIf(
                name="cap",
                value=new_cap,
                assumption=(
                    f"KV memory admits {new_cap} running requests; the speculative step keeps growing past the "
                    f"largest probed batch ({fit.excess_points[-1][0]:.0f}) as it did between the last two "
                    "probes; acceptance stays as measured"
                ),
                sentence=(
                    f"with --max-running-requests {new_cap}, the aggregate at C={top.concurrency} would be "
                    f"{_fmt(p.agg_tok_s)} tok/s ({_fmt(p.agg_lo)}..{_fmt(p.agg_hi)}; baseline {_fmt(top.agg_tok_s)}, "
                    f"cap {fit.spec_cap}: "
                    f"{_fmt(sc.predict_level(fit, base, top).agg_tok_s)})"
                ),
                levels=lv,
                crossover=sc.crossover(lv),
            )
        )
    k = draft if draft is not None else fit.draft_tokens + 1
    acc = sc.accept_for_draft(per_position, k)
    if acc is not None and k >= 1:
        lv = sc.predict(fit, base, sc.Assumptions(draft_tokens=k, accept_length=acc))
        x = sc.crossover(lv)
        out.append(
            WhatIf(
                name="draft_tokens",
                value=k,
                assumption=(
                    f"each draft token costs what the measured K={fit.draft_tokens} drafts cost per token (the "
                    f"speculative step's excess scales by {k}/{fit.draft_tokens}); acceptance length "
                    f"{acc:.2f} from the measured share of steps accepting >= k"
                    + (" extended geometrically past the measured K" if k > len(per_position) else "")
                ),
                sentence=f"with K={k}: {x.sentence}",
                levels=lv,
                crossover=x,
            )
        )
    n = output if output is not None else 2 * top.output_tokens
    acc_n = sc.accept_for_output(along, bucket, n)
    lv = sc.predict(fit, base, sc.Assumptions(output_tokens=n, accept_length=acc_n))
    out.append(
        WhatIf(
            name="output_tokens",
            value=n,
            assumption=(
                "step costs as fitted (context grows with the output, which the fit folds into the per-request "
                "term); "
                + (
                    f"acceptance length {acc_n:.2f} over {n:.0f} output tokens, from the acceptance measured "
                    "along the output"
                    if acc_n is not None
                    else "acceptance as measured at each batch (none was measured along the output)"
                )
            ),
            sentence=(
                f"with {n:.0f} output tokens, the speculative aggregate at C={top.concurrency} would be "
                f"{_fmt(next(x for x in lv if x.concurrency == top.concurrency).agg_tok_s)} tok/s"
            ),
            levels=lv,
            crossover=None,  # the baseline was not measured at this length: no ratio
        )
    )
    return out


def check(pred: Prediction, measured: Sequence[sc.LevelObs]) -> list[Checked]:
    """The prediction against speculative levels measured on the same ladder."""
    by = {p.concurrency: p for p in pred.levels}
    out = []
    for m in sorted(measured, key=lambda o: o.concurrency):
        p = by.get(m.concurrency)
        if p is None or m.agg_tok_s <= 0:
            continue
        out.append(
            Checked(
                concurrency=m.concurrency,
                predicted=p.agg_tok_s,
                lo=p.agg_lo,
                hi=p.agg_hi,
                measured=m.agg_tok_s,
                error=p.agg_tok_s / m.agg_tok_s - 1.0,
                inside=p.agg_lo <= m.agg_tok_s <= p.agg_hi,
                probed=m.concurrency in pred.probe_levels,
                baseline=p.baseline_agg_tok_s,
                change=None if not p.baseline_agg_tok_s else m.agg_tok_s / p.baseline_agg_tok_s - 1.0,
            )
        )
    return out


def build(
    baseline: Sequence[Run],
    probes: Sequence[Run],
    *,
    spec_cap: int | None = None,
    draft: int | None = None,
    what_cap: int | None = None,
    what_draft: int | None = None,
    what_output: float | None = None,
    measured: Sequence[Run] = (),
) -> Prediction:
    """The whole prediction from the baseline run(s) and the probe run(s); ValueError when they cannot
    make one (no baseline level, no probe level)."""
    notes: list[str] = []
    base = run_obs(baseline)
    pr = run_obs(probes)
    if not base:
        raise ValueError("the baseline run has no concurrency level with an aggregate")
    if not pr:
        raise ValueError("the probe run(s) have no concurrency level with an aggregate")
    k = draft or draft_tokens(probes)
    if k is None:
        k = 1
        notes.append(
            "K (draft tokens per step) unknown: neither the server nor the acceptance said it; 1 assumed"
        )
    cap_b = cap_of(baseline)
    cap_s = spec_cap if spec_cap is not None else cap_of(probes)
    if cap_s is None:
        notes.append(
            "the speculative server's running cap is unknown (not declared, not inferable): the batch is "
            "assumed to grow with C"
        )
    if min(o.concurrency for o in base) != 1:
        notes.append(
            f"the baseline has no C=1 level: the prefill cost comes from C={min(o.concurrency for o in base)}, "
            "where other requests' prompts inflate the TTFT"
        )
    fit = sc.fit(base, pr, k, cap_b, cap_s)
    if fit.accept_length > 0 and fit.accept_spread / fit.accept_length > ACCEPT_SPREAD_NOTE:
        notes.append(
            f"acceptance varied by {fit.accept_spread:.2f} tokens/step across the probes: the model takes "
            "each probe's own between them and holds the nearest beyond them"
        )
    if len(pr) < 2:
        notes.append(
            "one probe level: the speculative step's excess is taken as the same at every batch "
            "(two or three probes at different C separate its per-token part)"
        )
    probe_levels = [o.concurrency for o in pr]
    levels = sc.predict(fit, base, probed=probe_levels)
    per_position, along, bucket = acceptance_shape(probes)
    pred = Prediction(
        baseline_run=str(baseline[0].run_dir),
        probe_runs=[str(r.run_dir) for r in probes],
        probe_levels=probe_levels,
        baseline=base,
        probes=pr,
        fit=fit,
        levels=levels,
        crossover=sc.crossover(levels),
        whatifs=whatifs(fit, base, per_position, along, bucket, what_cap, what_draft, what_output),
        notes=notes,
    )
    pred.checked = check(pred, [*pr, *run_obs(measured)])
    return pred


def encode(pred: Prediction) -> bytes:
    return msgspec.json.format(msgspec.json.encode(pred), indent=2)


def to_builtins(obj: object) -> Any:
    """Any part of a prediction as plain JSON values (for experiment.json)."""
    return msgspec.to_builtins(obj)


def decode(data: bytes) -> Prediction:
    return msgspec.json.decode(data, type=Prediction)


def read_prediction(path: str | Path) -> Prediction | None:
    """A run directory's prediction.json; None when it has none, or one this specload cannot read."""
    try:
        return decode(read_bytes(path))
    except (OSError, msgspec.DecodeError):
        return None
