"""The web page's acceptance card gets its data from ``acceptview.live_figures``: the report's own
figures of a level (acceptance, reasoning, categories), rounded as the report prints them."""

from __future__ import annotations

import json

from specload.analysis.acceptance import FROM_COUNTERS, Acceptance
from specload.analysis.metrics import GroupStats, LevelStats, MixStats
from specload.analysis.reasoning import ReasoningStats
from specload.core.records import SPEC_VLLM
from specload.present.acceptview import SOURCE_NAMES, live_figures


def _level(**kw: object) -> LevelStats:
    return LevelStats(concurrency=4, repeat=0, label="c004", **kw)  # type: ignore[arg-type]


def test_a_level_without_any_has_none() -> None:
    assert live_figures(None) == {"acceptance": None, "reasoning": None, "categories": []}
    assert live_figures(_level()) == {"acceptance": None, "reasoning": None, "categories": []}


def test_every_figure_rounded_as_the_report_prints_it() -> None:
    a = Acceptance(
        length=1 + 47 / 16,
        rate=47 / 48,
        per_position=[1.0, 1.0, 15 / 16],
        histogram=[0, 0, 1, 15],
        along=[3.9375, None],
        along_steps=[16, 0],
        sources={"length": SPEC_VLLM, "per_position": FROM_COUNTERS},
    )
    r = ReasoningStats(
        requests=3, reasoning_tokens_mean=8.333, reasoning_share=0.13021, answer_ttft_p50_ms=12.345
    )
    part = LevelStats(1, 0, "c001", sent=2, agg_tok_s=10.04, acceptance=Acceptance(length=2.499))
    part.extra["output_token_share"] = 0.4449  # its tokens / the level's: 44%
    mix = MixStats(categories=[GroupStats("coding", 1.0, part)])
    d = live_figures(_level(acceptance=a, reasoning=r, mix=mix))
    assert d["acceptance"] == {
        "length": 3.94,
        "rate": 0.979,
        "per_position": [1.0, 1.0, 0.938],
        "histogram": [0.0, 0.0, 0.062, 0.938],
        "along": [3.94, None],
        "along_bucket": 100,
        "sources": {"Accept len": SOURCE_NAMES[SPEC_VLLM], "Accept >=k": SOURCE_NAMES[FROM_COUNTERS]},
        "note": None,
    }
    rs = d["reasoning"]
    assert isinstance(rs, dict)
    assert (rs["requests"], rs["reasoning_tokens_mean"], rs["reasoning_share"]) == (3, 8.3, 0.13)
    assert rs["answer_ttft_p50_ms"] == 12.3 and rs["answer_tok_s_mean"] is None
    assert d["categories"] == [
        {"category": "coding", "sent": 2, "tokens_pct": 44.0, "per_req_tok_s": None, "accept_length": 2.5}
    ]
    json.dumps(d)  # the page's JSON
