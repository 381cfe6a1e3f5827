"""prediction.md: a prediction as text (the fitted terms, the predicted ladder, the crossover, the
what-ifs and, when the speculative arm was measured, prediction against measurement).

Every predicted figure is labelled as predicted and printed with its interval; a what-if is printed as
a prediction under a named assumption, never beside the measured columns as if it were one.
"""

from __future__ import annotations

from tabulate import tabulate

from specload.analysis.predict import Prediction


def _n(v: float | None, digits: int = 1) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:+.1f} %"


def terms_table(pred: Prediction, fmt: str = "github") -> str:
    f = pred.fit
    rows = [
        [
            "prefill per prompt token (c_pf)",
            f"{1e3 * f.prefill_ms_per_token:.2f} us",
            "baseline lowest level",
        ],
        [
            "baseline step, line c0 + c_tok*B",
            f"{f.baseline_c0_ms:.2f} + {f.baseline_c_tok_ms:.3f}*B ms (rms {100 * f.baseline_line_rms_rel:.0f} %)",
            "baseline ladder (the prediction uses the table below)",
        ],
        [
            "speculative excess, d0 + d_tok*K*B",
            f"{f.excess_d0_ms:.2f} + {f.excess_d_tok_ms:.3f}*K*B ms (K={f.draft_tokens})",
            "probes",
        ],
        [
            "acceptance length L",
            f"{f.accept_length:.2f} (spread {f.accept_spread:.2f} over the probes)",
            "probes",
        ],
        [
            "running cap",
            f"baseline {f.baseline_cap or '-'}, speculative {f.spec_cap or '-'}",
            "read or inferred",
        ],
    ]
    steps = ", ".join(f"B={b:g}: {s:.2f}" for b, s in f.baseline_steps)
    excess = ", ".join(f"B={b:g}: {s:+.2f}" for b, s in f.excess_points)
    return (
        tabulate(rows, headers=["Term", "Fitted value", "From"], tablefmt=fmt)
        + f"\n\nBaseline step (ms) by batch: {steps}\n\nSpeculative excess (ms) at the probes: {excess}\n"
    )


def levels_table(pred: Prediction, fmt: str = "github") -> str:
    rows = [
        [
            p.concurrency,
            f"{p.batch:g}",
            f"{_n(p.step_ms, 2)} ({_n(p.step_lo_ms, 2)}..{_n(p.step_hi_ms, 2)})",
            f"{_n(p.agg_tok_s)} ({_n(p.agg_lo)}..{_n(p.agg_hi)})",
            f"{_n(p.per_req_tok_s)} ({_n(p.per_req_lo)}..{_n(p.per_req_hi)})",
            f"{_n(p.ttft_ms, 0)} ({_n(p.ttft_lo_ms, 0)}..{_n(p.ttft_hi_ms, 0)})",
            f"{_n(p.tpot_ms, 2)} ({_n(p.tpot_lo_ms, 2)}..{_n(p.tpot_hi_ms, 2)})",
            _n(p.baseline_agg_tok_s),
            _pct(None if p.ratio is None else p.ratio - 1),
            "probe" if p.probed else "",
        ]
        for p in pred.levels
    ]
    headers = [
        "C",
        "Batch",
        "Pred step ms",
        "Pred agg tok/s",
        "Pred per-req tok/s",
        "Pred TTFT ms",
        "Pred TPOT ms",
        "Baseline agg",
        "Pred change",
        "",
    ]
    return tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)


def checked_table(pred: Prediction, fmt: str = "github") -> str:
    rows = [
        [
            c.concurrency,
            _n(c.predicted),
            f"{_n(c.lo)}..{_n(c.hi)}",
            _n(c.measured),
            _pct(c.error),
            "yes" if c.inside else "no",
            _pct(c.change),
            "probe (fitted through)" if c.probed else "",
        ]
        for c in pred.checked
    ]
    headers = ["C", "Pred agg", "Interval", "Measured agg", "Error", "Inside", "Measured change", ""]
    return tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)


def render(pred: Prediction, fmt: str = "github") -> str:
    """The prediction section (markdown by default)."""
    parts = [
        "## Predicted speculative arm (a model, not a measurement)",
        "",
        f"From the baseline run and speculative probes at C = {', '.join(map(str, pred.probe_levels))}; "
        'the model, its inputs and its interval: docs/metrics.md, "Predicted speculative curve".',
        "",
        f"**{pred.crossover.sentence}.**",
        "",
        levels_table(pred, fmt),
        "",
        "### Fitted terms",
        "",
        terms_table(pred, fmt),
    ]
    if pred.checked:
        parts += ["### Predicted against measured (speculative aggregate)", "", checked_table(pred, fmt), ""]
    if pred.whatifs:
        parts += ["### What-ifs (predictions under an assumption)", ""]
        parts += [f"- {w.sentence}. Assumes: {w.assumption}." for w in pred.whatifs]
        parts.append("")
    if pred.notes:
        parts += ["### Limits hit", ""] + [f"- {n}" for n in pred.notes] + [""]
    return "\n".join(parts).rstrip() + "\n"
