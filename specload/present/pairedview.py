"""Two replays of one trace, paired request by request, laid out: the section ``specload compare`` and
``specload experiment`` add after the verdict (markdown, and so the HTML page), and its JSON.

The figures come finished from specload.analysis.paired; docs/metrics.md, "Paired comparison (trace
replay)", defines them. The paired interval and the unpaired one stand side by side on each line, so
that a reader sees what pairing the requests bought.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specload.analysis.paired import FIGURES, Bucket, Interval, PairedComparison, PairedFigure
from specload.core.text import MISSING, fmt_num
from specload.present.output import render_table

_SCALE = {key: scale for key, _, scale, _ in FIGURES}
_NAME = {key: name for key, name, _, _ in FIGURES}
_DIGITS = {"ttft": 1, "tpot": 2, "e2e": 0, "per_req_tok_s": 1}


def _value(key: str, v: float | None) -> str:
    return MISSING if v is None else fmt_num(v * _SCALE[key], _DIGITS[key])


def _signed(key: str, v: float) -> str:
    return f"{v * _SCALE[key]:+.{_DIGITS[key]}f}"


def _ci(key: str, ci: Interval | None) -> str:
    return "" if ci is None else f" ({_signed(key, ci.lo)} to {_signed(key, ci.hi)})"


def diff_cell(key: str, v: float | None, ci: Interval | None) -> str:
    """A difference with its 95 % interval: ``-152 (-170 to -131)``; no interval below 6 requests."""
    return MISSING if v is None else _signed(key, v) + _ci(key, ci)


def pct_cell(v: float | None, ci: Interval | None) -> str:
    """A median change in percent with its interval: ``-12% (-14% to -10%)``."""
    if v is None:
        return MISSING
    return f"{v:+.0f}%" + ("" if ci is None else f" ({ci.lo:+.0f}% to {ci.hi:+.0f}%)")


def share_cell(v: float | None) -> str:
    return MISSING if v is None else f"{100 * v:.0f}%"


def _figure_row(f: PairedFigure) -> list[str]:
    return [
        _NAME[f.key],
        str(f.n),
        _value(f.key, f.base_median),
        _value(f.key, f.new_median),
        diff_cell(f.key, f.median_diff, f.diff_ci),
        pct_cell(f.median_pct, f.pct_ci),
        share_cell(f.faster_share),
        diff_cell(f.key, f.unpaired_diff, f.unpaired_ci),
        MISSING if f.narrowing is None else f"{f.narrowing:.1f}x",
    ]


def _bucket_rows(buckets: Sequence[Bucket]) -> list[list[str]]:
    rows = []
    for b in buckets:
        e2e = b.figure("e2e")
        rows.append(
            [
                f"{b.lo}" if b.lo == b.hi else f"{b.lo}–{b.hi}",
                str(b.n),
                *(pct_cell(b.figure(k).median_pct, b.figure(k).pct_ci) for k, *_ in FIGURES),
                share_cell(e2e.faster_share),
            ]
        )
    return rows


def _unpaired_text(pc: PairedComparison) -> str:
    if not pc.unpaired:
        return "every request was OK in both arms"
    return "not paired: " + ", ".join(f"{n} {why}" for why, n in pc.unpaired)


def _repeats_text(pc: PairedComparison) -> str:
    rb, rn = pc.repeats
    if rb <= 1 and rn <= 1:
        return ""
    return (
        f" Each request was sent up to {rb} times to {pc.base} and {rn} times to {pc.new}: "
        "its value per arm is the mean over its OK sends."
    )


def sentence(pc: PairedComparison) -> str:
    """The E2E finding in words, the paired and the unpaired interval side by side."""
    f = pc.figure("e2e")
    if f.median_diff is None:
        return f"{pc.new} vs {pc.base}: no request was OK in both replays, nothing to pair."
    faster = share_cell(f.faster_share)
    text = (
        f"{pc.new} vs {pc.base} over the same {f.n} trace requests: the median per-request E2E difference is "
        f"{diff_cell('e2e', f.median_diff, f.diff_ci)} ms, {pct_cell(f.median_pct, f.pct_ci)} per request; "
        f"{faster} of the requests got faster."
    )
    if f.unpaired_diff is not None:
        text += f" Unpaired, the difference of the medians is {diff_cell('e2e', f.unpaired_diff, f.unpaired_ci)} ms"
        text += f": pairing made the interval {f.narrowing:.1f}x narrower." if f.narrowing else "."
    if f.diff_ci is None:
        text += " (Fewer than 6 paired requests: no 95% interval.)"
    return text


def paired_lines(pcs: Sequence[PairedComparison], fmt: str = "github") -> list[str]:
    """The paired section of a comparison's text; [] when no two runs replayed the same trace."""
    lines: list[str] = []
    for pc in pcs:
        lines += ["", f"## Paired by trace request: {pc.new} vs {pc.base} (baseline)", ""]
        lines.append(
            f"- {pc.paired} of the {pc.window} trace requests sent are paired (OK in both arms); "
            f"{_unpaired_text(pc)}.{_repeats_text(pc)}"
        )
        if pc.output_differs:
            lines.append(
                f"- {pc.output_differs} paired requests got different output lengths in the two arms: "
                "their E2E differences include the length's"
            )
        lines.append(f"- {sentence(pc)}")
        lines += ["", _figure_table(pc, fmt)]
        for axis, buckets in (("Input tokens", pc.by_input), ("Output tokens", pc.by_output)):
            if not buckets:
                continue
            lines += ["", f"Paired median change per request (95% CI) by the trace's {axis.lower()}:", ""]
            headers = [axis, "Paired", *(f"Δ {_NAME[k].split(' (')[0]}" for k, *_ in FIGURES), "E2E faster"]
            lines.append(render_table(headers, _bucket_rows(buckets), fmt, align_right=False))
        if pc.goodput:
            lines += ["", f"Goodput under the SLO {pc.slo}, over the requests both arms sent:", ""]
            rows = [
                [
                    g.label,
                    str(g.sent),
                    str(g.good),
                    share_cell(g.good_share),
                    fmt_num(g.goodput_req_s, 2),
                    fmt_num(g.goodput_tok_s, 1),
                ]
                for g in pc.goodput
            ]
            headers = ["Arm", "Requests", "Good", "Good %", "Goodput req/s", "Goodput tok/s"]
            lines.append(render_table(headers, rows, fmt, align_right=False))
    if pcs:
        lines += [
            "",
            "Δ is treatment − baseline per request. Paired: the median of the per-request differences, its 95% "
            "interval the order-statistic interval of a median (distribution-free). Unpaired: median(treatment) − "
            "median(baseline) over the same requests taken as two independent samples, its 95% interval a seeded "
            "bootstrap of each arm on its own. Faster: lower latency, or higher tok/s.",
        ]
    return lines


def _figure_table(pc: PairedComparison, fmt: str) -> str:
    headers = [
        "Figure",
        "Paired",
        f"{pc.base} median",
        f"{pc.new} median",
        "Δ paired median (95% CI)",
        "Δ% paired median (95% CI)",
        "Faster",
        "Δ unpaired, of medians (95% CI)",
        "CI narrower",
    ]
    return render_table(headers, [_figure_row(f) for f in pc.figures], fmt, align_right=False)


def paired_json(pcs: Sequence[PairedComparison]) -> list[dict[str, Any]]:
    """The paired comparisons as plain data, unrounded (the compare JSON's ``paired``), with what the
    text shows beside them: each figure's ``narrowing`` (the table's "CI narrower") and the E2E
    finding in words (``sentence``)."""
    out = []
    for pc in pcs:
        d = pc.to_json()
        for f, fd in zip(pc.figures, d["figures"], strict=True):
            fd["narrowing"] = f.narrowing
        d["sentence"] = sentence(pc)
        out.append(d)
    return out
