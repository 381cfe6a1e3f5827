"""The step-cost model behind ``specload predict``: fit from a baseline ladder and a few speculative probes.

Why a model and not a second sweep: acceptance carries across load, step cost does not, and a step's
cost has few terms (a fixed cost, a cost per batched token, a cost per token of context). A baseline
ladder gives the target's step time at every batch; two or three short speculative runs at different
batches give what speculation adds to a step (the draft and the K extra tokens each request verifies),
which a baseline ladder alone cannot separate from the rest. docs/metrics.md, "Predicted speculative
curve", defines every term, the interval and the limits; this module is the one implementation.

Everything here is pure: observations in, fitted terms and predictions out (msgspec Structs, so that
prediction.json is the same objects).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec
import numpy as np

Z95 = 1.96  # the interval's noise part: a normal 95 % band on the measured inputs


class LevelObs(msgspec.Struct, frozen=True):
    """What the model reads from one measured level of one arm (means over its OK requests)."""

    concurrency: int
    agg_tok_s: float
    output_tokens: float  # N: server-counted output tokens per request
    prompt_tokens: float  # P
    ttft_ms: float  # mean
    tpot_ms: float  # mean
    accept_length: float = 1.0  # L: 1 + accepted / drafting steps (1: no speculation)
    rel_se: float = 0.0  # relative standard error of the level's step time (the noise the interval carries)
    running_max: float | None = None  # the server's running gauge, max over the level (None: not sampled)
    queued_max: float | None = None


class StepFit(msgspec.Struct, frozen=True):
    """The fitted terms of both arms (times in ms)."""

    prefill_ms_per_token: float  # c_pf: prompt work per prompt token, from the baseline's lowest level
    baseline_cap: int | None
    spec_cap: int | None
    draft_tokens: int  # K
    accept_length: float  # L over the probes (steps-weighted mean)
    accept_spread: float  # max - min of L over the probes: how well acceptance carried across load
    # the baseline's step time at each measured batch: (batch, ms), from its ladder
    baseline_steps: list[tuple[float, float]]
    baseline_rel_se: list[float]
    # the baseline step as c0 + c_tok * batch (least squares), shown beside the table: a real engine's
    # batch curve is rarely one line, so the prediction uses the table and not this line
    baseline_c0_ms: float
    baseline_c_tok_ms: float
    baseline_line_rms_rel: float
    # the speculative step's excess over the baseline step at the same batch, at each probe: (batch, ms)
    excess_points: list[tuple[float, float]]
    probe_rel_se: list[float]
    # the excess as d0 + d_tok * K * batch (least squares over the probes): the draft's fixed cost and
    # the cost of each extra verified token
    excess_d0_ms: float
    excess_d_tok_ms: float
    # L at each probe's batch: (batch, L); between probes L is interpolated, outside them held
    accept_points: list[tuple[float, float]] = []


class PredictedLevel(msgspec.Struct, frozen=True):
    """The speculative arm predicted at one level of the baseline ladder; (lo, hi): the interval."""

    concurrency: int
    batch: float  # min(C, spec cap)
    step_ms: float
    step_lo_ms: float
    step_hi_ms: float
    agg_tok_s: float
    agg_lo: float
    agg_hi: float
    per_req_tok_s: float
    per_req_lo: float
    per_req_hi: float
    ttft_ms: float
    ttft_lo_ms: float
    ttft_hi_ms: float
    tpot_ms: float
    tpot_lo_ms: float
    tpot_hi_ms: float
    baseline_agg_tok_s: float | None  # the baseline measured at this level
    ratio: float | None  # predicted spec agg / baseline agg
    ratio_lo: float | None
    ratio_hi: float | None
    probed: bool = False  # this level was a probe: its prediction reproduces a measurement


class Crossover(msgspec.Struct, frozen=True):
    """Where the predicted spec / baseline aggregate ratio falls through 1."""

    c_star: float | None  # None: no crossing inside the ladder
    lo: float | None  # from the interval's pessimistic side (crosses earlier)
    hi: float | None  # from its optimistic side
    sentence: str


def interp(points: Sequence[tuple[float, float]], x: float) -> float:
    """Piecewise linear through ``points`` (sorted by x), extended along the end segments."""
    xs = np.array([p[0] for p in points], dtype=float)
    ys = np.array([p[1] for p in points], dtype=float)
    if len(xs) == 1:
        return float(ys[0])
    if x <= xs[0]:
        i = 0
    elif x >= xs[-1]:
        i = len(xs) - 2
    else:
        return float(np.interp(x, xs, ys))
    slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i]) if xs[i + 1] != xs[i] else 0.0
    return float(ys[i] + slope * (x - xs[i]))


def steps_per_request(n: float, accept_length: float) -> float:
    """Steps a request's output takes: the step that ends its prefill gives the first token, each
    later step gives L tokens on average."""
    return 1.0 + max(n - 1.0, 0.0) / accept_length


def batch_of(c: int, cap: int | None) -> float:
    return float(c if cap is None else min(c, cap))


def step_from_level(o: LevelObs, cap: int | None, prefill_ms_per_token: float) -> float:
    """A level's step time (ms) from its aggregate: a closed loop of B running requests turns over
    once per B * P * c_pf (every request's prompt) + steps(N, L) * step, so step =
    (B * N / agg - B * P * c_pf) / steps(N, L)."""
    b = batch_of(o.concurrency, cap)
    cycle_ms = 1e3 * b * o.output_tokens / o.agg_tok_s
    return (cycle_ms - b * o.prompt_tokens * prefill_ms_per_token) / steps_per_request(
        o.output_tokens, o.accept_length
    )


def _merge(points: list[tuple[float, float, float]]) -> tuple[list[tuple[float, float]], list[float]]:
    """(batch, step, rel_se) points with equal batches averaged (levels above a cap share one)."""
    by: dict[float, list[tuple[float, float]]] = {}
    for b, s, e in points:
        by.setdefault(b, []).append((s, e))
    out, se = [], []
    for b in sorted(by):
        v = by[b]
        out.append((b, sum(x[0] for x in v) / len(v)))
        se.append(math.sqrt(sum(x[1] ** 2 for x in v)) / len(v))
    return out, se


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    if len(xs) == 1:
        return float(ys[0]), 0.0
    a = np.column_stack([np.ones(len(xs)), np.asarray(xs, dtype=float)])
    (c0, c1), *_ = np.linalg.lstsq(a, np.asarray(ys, dtype=float), rcond=None)
    return float(c0), float(c1)


def fit(
    baseline: Sequence[LevelObs],
    probes: Sequence[LevelObs],
    draft_tokens: int,
    baseline_cap: int | None = None,
    spec_cap: int | None = None,
) -> StepFit:
    """Fit both arms' step costs; see docs/metrics.md, "Predicted speculative curve"."""
    if not baseline or not probes:
        raise ValueError("a fit needs the baseline ladder and at least one speculative probe")
    base = sorted(baseline, key=lambda o: o.concurrency)
    low = base[0]
    # The lowest level: TTFT = the prompt's prefill + one step (exact alone, C = 1; above, others' prompts
    # inflate it, which the docs name as a limit).
    c_pf = max(low.ttft_ms - low.tpot_ms, 0.0) / max(low.prompt_tokens, 1.0)
    steps, se = _merge(
        [
            (batch_of(o.concurrency, baseline_cap), step_from_level(o, baseline_cap, c_pf), o.rel_se)
            for o in base
        ]
    )
    c0, c1 = _line([b for b, _ in steps], [s for _, s in steps])
    rms = math.sqrt(sum(((c0 + c1 * b) / s - 1) ** 2 for b, s in steps) / len(steps))
    pr = sorted(probes, key=lambda o: o.concurrency)
    excess, pse = _merge(
        [
            (
                batch_of(o.concurrency, spec_cap),
                step_from_level(o, spec_cap, c_pf) - interp(steps, batch_of(o.concurrency, spec_cap)),
                o.rel_se,
            )
            for o in pr
        ]
    )
    k = max(draft_tokens, 1)
    d0, d1 = _line([b * k for b, _ in excess], [d for _, d in excess])
    weights = [steps_per_request(o.output_tokens, o.accept_length) for o in pr]
    acc = sum(w * o.accept_length for w, o in zip(weights, pr, strict=True)) / sum(weights)
    accept_points, _ = _merge([(batch_of(o.concurrency, spec_cap), o.accept_length, 0.0) for o in pr])
    return StepFit(
        prefill_ms_per_token=c_pf,
        baseline_cap=baseline_cap,
        spec_cap=spec_cap,
        draft_tokens=draft_tokens,
        accept_length=acc,
        accept_spread=max(o.accept_length for o in pr) - min(o.accept_length for o in pr),
        baseline_steps=steps,
        baseline_rel_se=se,
        baseline_c0_ms=c0,
        baseline_c_tok_ms=c1,
        baseline_line_rms_rel=rms,
        excess_points=excess,
        probe_rel_se=pse,
        excess_d0_ms=d0,
        excess_d_tok_ms=d1,
        accept_points=accept_points,
    )


class Assumptions(msgspec.Struct, frozen=True):
    """What a prediction is made for: the measured setting, or a what-if's changes to it."""

    spec_cap: int | None = None  # None: the fit's
    draft_tokens: int | None = None  # None: the fit's K
    accept_length: float | None = None  # None: the fit's L
    output_tokens: float | None = None  # None: each baseline level's own N


MEASURED = Assumptions()  # no what-if: the setting the runs were made in


def excess_at(f: StepFit, batch: float, draft_tokens: int | None = None) -> tuple[float, float]:
    """The speculative step's excess at ``batch`` and its model spread: the piecewise-linear curve
    through the probes (the prediction) and its distance from the least-squares line (the part of the
    interval that comes from the model's shape). Another K scales the excess by K' / K."""
    pw = interp(f.excess_points, batch)
    line = f.excess_d0_ms + f.excess_d_tok_ms * max(f.draft_tokens, 1) * batch
    scale = 1.0 if draft_tokens is None else draft_tokens / max(f.draft_tokens, 1)
    return pw * scale, abs(pw - line) * scale


def accept_at(f: StepFit, batch: float) -> float:
    """L at ``batch``: each probe's own L at its batch (so that the step solved from a probe is used
    with the L it was solved with), linear between probes, held beyond them."""
    if not f.accept_points:
        return f.accept_length
    return float(np.interp(batch, [b for b, _ in f.accept_points], [v for _, v in f.accept_points]))


def _noise(f: StepFit, batch: float) -> float:
    """Relative standard error of the predicted step: the baseline's at this batch and the probes'."""
    b = interp([(x, e) for (x, _), e in zip(f.baseline_steps, f.baseline_rel_se, strict=True)], batch)
    p = sum(e**2 for e in f.probe_rel_se) ** 0.5 / len(f.probe_rel_se)
    return math.sqrt(max(b, 0.0) ** 2 + p**2)


def _baseline_ttft(base: Sequence[LevelObs], batch: float) -> float:
    return interp(
        [(float(o.concurrency), o.ttft_ms) for o in sorted(base, key=lambda o: o.concurrency)], batch
    )


def predict_level(
    f: StepFit, base: Sequence[LevelObs], o: LevelObs, a: Assumptions = MEASURED
) -> PredictedLevel:
    """The speculative arm at the baseline level ``o`` (under the what-if ``a``)."""
    cap = a.spec_cap if a.spec_cap is not None else f.spec_cap
    k = a.draft_tokens
    n = a.output_tokens if a.output_tokens is not None else o.output_tokens
    c = o.concurrency
    b = batch_of(c, cap)
    acc = a.accept_length if a.accept_length is not None else accept_at(f, b)
    tb = interp(f.baseline_steps, b)
    ex, spread = excess_at(f, b, k)
    step = tb + ex
    half = spread + Z95 * _noise(f, b) * step
    steps = steps_per_request(n, acc)
    prefill = b * o.prompt_tokens * f.prefill_ms_per_token

    def figures(s: float) -> tuple[float, float, float, float]:
        cycle = prefill + steps * s  # ms for B running requests to turn over once
        x = b / cycle  # requests per ms
        e2e = c / x  # closed loop: every user is somewhere in a request (Little's law)
        wait = max(e2e - cycle, 0.0)
        ttft = wait + _baseline_ttft(base, b) + (s - tb)
        tpot = max(e2e - ttft, 0.0) / max(n - 1.0, 1.0)
        return 1e3 * x * n, 1e3 * n / e2e, ttft, tpot

    agg, per, ttft, tpot = figures(step)
    agg_lo, per_lo, ttft_hi, tpot_hi = figures(step + half)
    agg_hi, per_hi, ttft_lo, tpot_lo = figures(max(step - half, 1e-6))
    ratio = agg / o.agg_tok_s if o.agg_tok_s > 0 and a.output_tokens is None else None
    return PredictedLevel(
        concurrency=c,
        batch=b,
        step_ms=step,
        step_lo_ms=max(step - half, 0.0),
        step_hi_ms=step + half,
        agg_tok_s=agg,
        agg_lo=agg_lo,
        agg_hi=agg_hi,
        per_req_tok_s=per,
        per_req_lo=per_lo,
        per_req_hi=per_hi,
        ttft_ms=ttft,
        ttft_lo_ms=ttft_lo,
        ttft_hi_ms=ttft_hi,
        tpot_ms=tpot,
        tpot_lo_ms=tpot_lo,
        tpot_hi_ms=tpot_hi,
        baseline_agg_tok_s=o.agg_tok_s if a.output_tokens is None else None,
        ratio=ratio,
        ratio_lo=None if ratio is None else agg_lo / o.agg_tok_s,
        ratio_hi=None if ratio is None else agg_hi / o.agg_tok_s,
    )


def predict(
    f: StepFit, baseline: Sequence[LevelObs], a: Assumptions = MEASURED, probed: Sequence[int] = ()
) -> list[PredictedLevel]:
    """Every level of the baseline ladder."""
    base = sorted(baseline, key=lambda o: o.concurrency)
    out = []
    for o in base:
        p = predict_level(f, base, o, a)
        out.append(msgspec.structs.replace(p, probed=o.concurrency in probed))
    return out


def _crossing(cs: Sequence[int], ratios: Sequence[float]) -> float | None:
    """The first C where the ratio falls from >= 1 to < 1, interpolated linearly in log C."""
    for i in range(1, len(cs)):
        r0, r1 = ratios[i - 1], ratios[i]
        if r0 >= 1.0 > r1:
            t = (r0 - 1.0) / (r0 - r1)
            return float(math.exp(math.log(cs[i - 1]) + t * (math.log(cs[i]) - math.log(cs[i - 1]))))
    return None


def crossover(levels: Sequence[PredictedLevel]) -> Crossover:
    """C*, where speculation is predicted to stop paying, with the interval's two ends."""
    lv = [p for p in levels if p.ratio is not None]
    cs = [p.concurrency for p in lv]
    mid = _crossing(cs, [p.ratio or 0.0 for p in lv])
    lo = _crossing(cs, [p.ratio_lo or 0.0 for p in lv])
    hi = _crossing(cs, [p.ratio_hi or 0.0 for p in lv])
    if not lv:
        sentence = "no baseline aggregate to compare against"
    elif mid is not None:
        sentence = f"speculation is predicted to stop paying near C* = {mid:.0f}"
        if lo is not None and hi is not None:
            sentence += f" (interval {lo:.0f}..{hi:.0f})"
        elif lo is not None:
            sentence += f" (interval {lo:.0f}..beyond the ladder)"
    elif all((p.ratio or 0.0) >= 1.0 for p in lv):
        sentence = f"speculation is predicted to pay at every level up to C = {cs[-1]}"
    elif all((p.ratio or 0.0) < 1.0 for p in lv):
        sentence = f"speculation is predicted never to pay from C = {cs[0]}"
    else:
        sentence = "the predicted ratio crosses 1 more than once: no single crossover"
    return Crossover(c_star=mid, lo=lo, hi=hi, sentence=sentence)


def choose_probes(ladder: Sequence[int], spec_cap: int | None, n: int = 3) -> list[int]:
    """The speculative probe levels: the ladder's lowest level, the one nearest half the cap (or the
    ladder's geometric middle), and the highest at or below the cap: the cap bounds the batch, so past
    it nothing new is learned about the step."""
    cs = sorted(set(ladder))
    if not cs:
        return []
    top_pool = [c for c in cs if spec_cap is None or c <= spec_cap] or cs[:1]
    top = top_pool[-1]
    target = top / 2 if spec_cap is not None else math.sqrt(cs[0] * top)
    mid = min((c for c in cs if cs[0] < c < top), key=lambda c: abs(math.log(c / target)), default=None)
    out = [cs[0]] + ([mid] if mid is not None else []) + ([top] if top != cs[0] else [])
    return out[:n] if n >= 2 else out[:1]


def accept_for_draft(per_position: Sequence[float], draft_tokens: int) -> float | None:
    """Acceptance length with another draft length K', from the measured share of steps accepting at
    least k (k = 1..K): 1 + the sum of the first K' shares. Past the measured K the share is extended
    geometrically with the last measured conditional rate (share(K) / share(K - 1)): an assumption."""
    if not per_position or draft_tokens < 0:
        return None
    shares = list(per_position[:draft_tokens])
    if draft_tokens > len(per_position):
        last = per_position[-1]
        prev = per_position[-2] if len(per_position) > 1 else 1.0
        r = last / prev if prev > 0 else 0.0
        while len(shares) < draft_tokens:
            shares.append(shares[-1] * r)
    return 1.0 + sum(shares)


def accept_for_output(along: Sequence[float | None], bucket: int, output_tokens: float) -> float | None:
    """Acceptance length over an output of another length, from the length measured per ``bucket``
    output positions: tokens / steps over the first N' positions, each bucket taking bucket / L_i steps.
    Past the measured output, L follows the least-squares line of L against position (an assumption),
    kept within [1, the largest L measured]."""
    pts = [(i, v) for i, v in enumerate(along) if v is not None and v > 0]
    if not pts or output_tokens <= 0:
        return None
    top = max(v for _, v in pts)
    c0, c1 = _line([i for i, _ in pts], [v for _, v in pts])
    known = dict(pts)
    steps, done, i = 0.0, 0.0, 0
    while done < output_tokens:
        n = min(bucket, output_tokens - done)
        v = known.get(i, min(max(c0 + c1 * i, 1.0), top))
        steps += n / v
        done += n
        i += 1
    return output_tokens / steps
