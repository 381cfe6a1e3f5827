"""The acceptance figures (``specload.analysis.acceptance``) as the report and the comparison show them.

The table's columns (Accept rate %, Accept >=k %) and the report's "Acceptance" section: per level
its histogram of accepted tokens per step and its acceptance length along the output, with the
source of each figure and the notes where the responses and the counters disagree.
"""

from __future__ import annotations

from collections.abc import Sequence

from specload.analysis.acceptance import FROM_COUNTERS, FROM_OLD_RECORDS, Acceptance
from specload.analysis.metrics import LevelStats
from specload.core.records import SPEC_ALONG_BUCKET, SPEC_LLAMACPP, SPEC_SGLANG_META, SPEC_SGLEXT, SPEC_VLLM
from specload.core.text import MISSING, fmt_num
from specload.present.output import render_table

SOURCE_NAMES = {
    SPEC_VLLM: "vLLM's per-request metrics.speculative_decoding",
    SPEC_SGLANG_META: "SGLang's per-request meta_info",
    SPEC_SGLEXT: "SGLang's per-request sglext.spec_tokens_details",
    SPEC_LLAMACPP: "llama.cpp's per-request timings",
    FROM_OLD_RECORDS: "SGLang's per-request meta_info (output tokens / spec_verify_ct)",
    FROM_COUNTERS: "the server's counters (a delta over the level's window)",
}
_FIGURE_NAMES = {
    "length": "Accept len",
    "rate": "Accept rate",
    "per_position": "Accept >=k",
    "histogram": "the histogram of accepted tokens per step",
    "along": "the acceptance along the output",
    "tokens_per_pass": "Tok/pass",
}


def positions_cell(s: LevelStats) -> str:
    """k = 1..K: the share of steps that accepted at least k draft tokens, in %, joined by '/'."""
    a = s.acceptance
    if a is None or not a.per_position:
        return MISSING
    return "/".join(fmt_num(v * 100.0, 0) for v in a.per_position)


def _histogram_cell(a: Acceptance) -> str:
    total = sum(a.histogram)
    if not total:
        return MISSING
    return " ".join(f"{j}:{n / total * 100:.0f}%" for j, n in enumerate(a.histogram))


def _along_cell(a: Acceptance) -> str:
    return " ".join(fmt_num(v, 2) if v is not None else MISSING for v in a.along) if a.along else MISSING


def render_acceptance(levels: Sequence[LevelStats], fmt: str = "github") -> str | None:
    """Per level: the histogram of accepted tokens per step (share of steps) and the acceptance length
    per bucket of output positions; None when no level has either."""
    rows = [
        [s.label, fmt_num(s.acceptance.length, 2), _histogram_cell(s.acceptance), _along_cell(s.acceptance)]
        for s in levels
        if s.acceptance is not None and (s.acceptance.histogram or s.acceptance.along)
    ]
    if not rows:
        return None
    bucket = next(s.acceptance.along_bucket for s in levels if s.acceptance is not None)
    headers = ["Level", "Accept len", "Steps by accepted drafts", f"Accept len per {bucket} output tokens"]
    return render_table(headers, rows, fmt)


def acceptance_notes(levels: Sequence[LevelStats]) -> list[str]:
    """Where each acceptance figure came from, and every level whose sources disagree."""
    by_figure: dict[str, set[str]] = {}
    for s in levels:
        if s.acceptance is not None:
            for figure, source in s.acceptance.sources.items():
                by_figure.setdefault(figure, set()).update(source.split(" + "))
    by_sources: dict[tuple[str, ...], list[str]] = {}  # figures that came from the same sources, together
    for figure, sources in by_figure.items():
        by_sources.setdefault(tuple(sorted(sources)), []).append(_FIGURE_NAMES[figure])
    notes = [
        f"{', '.join(figures)} from {' and '.join(SOURCE_NAMES.get(x, x) for x in sources)}"
        for sources, figures in by_sources.items()
    ]
    notes += [
        f"{s.label}: {s.acceptance.note}" for s in levels if s.acceptance is not None and s.acceptance.note
    ]
    return notes


def histogram_cell(s: LevelStats) -> str:
    """j:share% of the steps that accepted exactly j draft tokens, as the report's Acceptance section."""
    return MISSING if s.acceptance is None else _histogram_cell(s.acceptance)


def along_cell(s: LevelStats) -> str:
    """The acceptance length per bucket of output positions, space-separated, as the Acceptance section."""
    return MISSING if s.acceptance is None else _along_cell(s.acceptance)


ALONG_HEADER = f"Accept len per {SPEC_ALONG_BUCKET} tok"  # the per-level table's along-the-output column


# The reasoning figures (analysis.reasoning.ReasoningStats) the report's table and the live view
# show: header, field, digits, scale of the cell (100: a share in %).
REASONING_COLUMNS = (
    ("Reasoning tokens mean", "reasoning_tokens_mean", 1, 1),
    ("Reasoning %", "reasoning_share", 1, 100),
    ("TTFT p50 (ms)", "ttft_p50_ms", 1, 1),
    ("TTFT p99 (ms)", "ttft_p99_ms", 1, 1),
    ("First answer p50 (ms)", "answer_ttft_p50_ms", 1, 1),
    ("First answer p99 (ms)", "answer_ttft_p99_ms", 1, 1),
    ("Answer tok/s", "answer_tok_s_mean", 1, 1),
    ("Agg answer tok/s", "agg_answer_tok_s", 1, 1),
)


def _round(v: float | None, digits: int) -> float | None:
    return None if v is None else round(v, digits)


def _rounded(vs: Sequence[float | None], digits: int) -> list[float | None]:
    return [_round(v, digits) for v in vs]


def live_figures(s: LevelStats | None) -> dict[str, object]:
    """A level's acceptance, reasoning and category figures for the web page's live view
    (specload/locust/webpage/accept.js), from the same LevelStats the report shows, rounded as the
    report prints them; shares as fractions, histogram as shares of the steps."""
    a = s.acceptance if s is not None else None
    accept = None
    if a is not None:
        total = sum(a.histogram)
        accept = {
            "length": _round(a.length, 2),
            "rate": _round(a.rate, 3),
            "per_position": _rounded(a.per_position, 3),
            "histogram": [round(n / total, 3) for n in a.histogram] if total else [],
            "along": _rounded(a.along, 2),
            "along_bucket": a.along_bucket,
            "sources": {_FIGURE_NAMES[k]: SOURCE_NAMES.get(v, v) for k, v in a.sources.items()},
            "note": a.note,
        }
    r = s.reasoning if s is not None else None
    reasoning: dict[str, float | None] | None = None
    if r is not None:  # each rounded as the report prints it (a share: as a fraction)
        reasoning = {"requests": r.requests}
        for _, name, digits, scale in REASONING_COLUMNS:
            reasoning[name] = _round(getattr(r, name), digits + (2 if scale == 100 else 0))
    cats = s.mix.categories if s is not None and s.mix is not None else []
    categories = [
        {
            "category": str(g.key),
            "sent": g.stats.sent,
            "tokens_pct": _round(
                None if (sh := g.stats.extra.get("output_token_share")) is None else 100 * sh, 0
            ),
            "per_req_tok_s": _round(g.stats.per_req_tok_s, 1),
            "accept_length": _round(g.stats.figure("accept"), 2),
        }
        for g in cats
    ]
    return {"acceptance": accept, "reasoning": reasoning, "categories": categories}
