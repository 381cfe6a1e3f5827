"""The paired comparison of two trace replays (specload.analysis.paired, present.pairedview), checked
against hand computations: the order-statistic interval from the binomial distribution computed
directly, the pairing by trace row with failed and missing requests, the pooling of repeats, the
length buckets, the goodput over the same requests, and ``specload compare`` showing the section."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from specload.analysis.paired import (
    MISSING_BASE,
    MISSING_NEW,
    NOT_OK_BASE,
    NOT_OK_NEW,
    ArmRecords,
    bootstrap_median_difference,
    length_buckets,
    median_interval,
    median_rank,
    paired_comparison,
)
from specload.core.records import (
    FAILED,
    OK,
    PHASE_MEASURE,
    PHASE_WARMUP,
    SRC_USAGE,
    RequestRecord,
    make_record,
)
from specload.core.slo import parse_slo
from specload.experiment.plan import Arm, Plan
from specload.experiment.record import COMPLETED, Experiment, RunEntry
from specload.experiment.run import compare_arms
from specload.present.compare import run_compare
from specload.present.tableview import WHOLE
from specload.workload.config import Scenario

T0 = 1_764_475_200.0


def rec(
    index: int | None,
    e2e: float,
    *,
    ttft: float = 0.1,
    tokens: int = 101,
    prompt: int = 1000,
    status: str = OK,
    t_send: float = T0,
    phase: str = PHASE_MEASURE,
    repeat: int = 0,
) -> RequestRecord:
    """A record of trace row ``index``: first token after ``ttft``, the last at ``e2e``, ``tokens`` out."""
    return make_record(
        t_send=t_send,
        t_first=t_send + ttft,
        t_last=t_send + e2e,
        t_end=t_send + e2e,
        output_tokens=tokens,
        level=0,
        concurrency=1,
        phase=phase,
        seq=index or 0,
        backend="openai",
        status=status,
        reason=None if status == OK else "boom",
        http_status=200,
        output_tokens_source=SRC_USAGE,
        prompt_tokens=prompt,
        requested_output_tokens=tokens,
        requested_prompt_tokens=prompt,
        chunks=tokens,
        itl_max_s=None,
        spec_verify_ct=None,
        worker="local",
        trace_index=index,
        repeat=repeat,
    )


def binomial_cdf(j: int, n: int) -> float:
    return sum(math.comb(n, i) for i in range(j + 1)) / 2**n


@pytest.mark.parametrize("n", [1, 5, 6, 9, 10, 20, 50, 137])
def test_median_rank_is_the_binomial_order_statistic(n: int) -> None:
    # the largest k with P(B <= k - 1) <= 2.5 %, B ~ Binomial(n, 1/2), by exact integer arithmetic
    ks = [k for k in range(1, n + 1) if binomial_cdf(k - 1, n) <= 0.025]
    assert median_rank(n) == (max(ks) if ks else None)
    # the textbook values: n = 6 -> (x1, x6), 10 -> (x2, x9), 20 -> (x6, x15)
    assert {6: 1, 10: 2, 20: 6}.get(n, median_rank(n)) == median_rank(n)


def test_median_interval_is_those_order_statistics() -> None:
    xs = np.array([7.0, -3.0, 1.5, 9.0, 4.0, 0.0, 2.0, 12.0, -8.0, 5.5])
    # n = 10: the 2nd and the 9th smallest
    ci = median_interval(xs)
    assert ci is not None and (ci.lo, ci.hi) == (-3.0, 9.0)
    assert median_interval(xs[:5]) is None


def _arms() -> tuple[ArmRecords, ArmRecords]:
    """Rows 0-11 in the baseline (row 3 failed), rows 0-11 but 7, and 20, in the treatment (row 9 failed);
    a warmup record and a record without a trace row in each, which do not count."""
    base_e2e = {i: 1.0 + 0.25 * i for i in range(12)}
    gain = {0: 0.20, 1: 0.05, 2: 0.31, 4: -0.04, 5: 0.12, 6: 0.27, 8: 0.18, 10: 0.09, 11: 0.15, 9: 0.1, 20: 0}
    base = [rec(i, base_e2e[i], status=FAILED if i == 3 else OK) for i in range(12)]
    new = [
        rec(i, base_e2e.get(i, 5.0) - gain.get(i, 0.0), status=FAILED if i == 9 else OK)
        for i in [*range(12), 20]
        if i != 7
    ]
    extra = [rec(0, 99.0, phase=PHASE_WARMUP), rec(None, 99.0)]
    return ArmRecords.of("base", [base + extra]), ArmRecords.of("new", [new + extra])


def test_pairing_by_trace_row_with_failed_and_missing() -> None:
    base, new = _arms()
    pc = paired_comparison(base, new)
    assert pc.window == 13  # rows 0-11 and 20
    assert pc.paired == 9
    assert dict(pc.unpaired) == {NOT_OK_BASE: 1, NOT_OK_NEW: 1, MISSING_NEW: 1, MISSING_BASE: 1}
    assert orjson.loads(orjson.dumps(pc.to_json()))["paired"] == 9  # plain numbers only (experiment.json)
    e2e = pc.figure("e2e")
    rows = [0, 1, 2, 4, 5, 6, 8, 10, 11]
    gains = [0.20, 0.05, 0.31, -0.04, 0.12, 0.27, 0.18, 0.09, 0.15]
    diffs = sorted(-g for g in gains)  # new - base
    assert e2e.n == 9
    assert e2e.median_diff == pytest.approx(diffs[4])  # -0.15
    # n = 9: P(B <= 1) = 10/512 <= 2.5 % < P(B <= 2) = 46/512, so the 2nd and the 8th smallest
    assert e2e.diff_ci is not None
    assert (e2e.diff_ci.lo, e2e.diff_ci.hi) == pytest.approx((diffs[1], diffs[7]))
    assert e2e.faster_share == pytest.approx(8 / 9)
    pcts = sorted(-g / (1.0 + 0.25 * i) * 100 for i, g in zip(rows, gains, strict=True))
    assert e2e.median_pct == pytest.approx(pcts[4])
    assert e2e.pct_ci is not None and (e2e.pct_ci.lo, e2e.pct_ci.hi) == pytest.approx((pcts[1], pcts[7]))
    base_vals = sorted(1.0 + 0.25 * i for i in rows)
    new_vals = sorted(1.0 + 0.25 * i - g for i, g in zip(rows, gains, strict=True))
    assert e2e.base_median == pytest.approx(base_vals[4]) and e2e.new_median == pytest.approx(new_vals[4])
    assert e2e.unpaired_diff == pytest.approx(new_vals[4] - base_vals[4])
    # the same TTFT everywhere: a difference of 0 (up to float noise), so no request is faster by it
    ttft = pc.figure("ttft")
    assert ttft.median_diff == pytest.approx(0.0, abs=1e-9)
    # per-request tok/s: higher is faster, the same requests as E2E
    tok = pc.figure("per_req_tok_s")
    assert tok.faster_share == pytest.approx(8 / 9)


def test_repeats_pool_by_their_mean() -> None:
    base = ArmRecords.of("base", [[rec(i, 2.0) for i in range(8)], [rec(i, 4.0, repeat=0) for i in range(8)]])
    new = ArmRecords.of("new", [[rec(i, 1.0) for i in range(8)], [rec(i, 2.0) for i in range(8)]])
    new_failed_once = ArmRecords.of("new", [[rec(i, 1.0) for i in range(8)], [rec(0, 9.0, status=FAILED)]])
    pc = paired_comparison(base, new)
    assert pc.repeats == (2, 2)
    assert pc.figure("e2e").median_diff == pytest.approx(1.5 - 3.0)
    # a failed send of a request leaves its OK ones: row 0 stays paired on its one OK send
    pc = paired_comparison(base, new_failed_once)
    assert pc.paired == 8 and pc.figure("e2e").median_diff == pytest.approx(1.0 - 3.0)


def test_length_buckets() -> None:
    lengths = [10] * 4 + [100] * 4 + [1000] * 4 + [5000] * 4
    assert length_buckets(lengths) == [(10, 10), (100, 100), (1000, 1000), (5000, 5000)]
    assert length_buckets([10] * 10 + [20] * 2) == [(10, 20)]  # the quartiles all fall on 10
    assert length_buckets(list(range(1, 9))) == [(1, 2), (3, 4), (5, 6), (7, 8)]
    assert length_buckets([]) == []


def test_buckets_split_the_paired_requests() -> None:
    recs_b, recs_n = [], []
    for i in range(24):
        prompt = 512 if i < 12 else 8192
        e2e = 2.0 + 0.05 * i
        recs_b.append(rec(i, e2e, prompt=prompt))
        recs_n.append(rec(i, e2e * (0.5 if prompt == 512 else 1.1), prompt=prompt))
    pc = paired_comparison(ArmRecords.of("b", [recs_b]), ArmRecords.of("n", [recs_n]))
    assert [(b.lo, b.hi, b.n) for b in pc.by_input] == [(512, 512, 12), (8192, 8192, 12)]
    short, long_ = pc.by_input
    assert short.figure("e2e").median_pct == pytest.approx(-50.0)
    assert long_.figure("e2e").median_pct == pytest.approx(10.0)
    assert short.figure("e2e").faster_share == 1.0 and long_.figure("e2e").faster_share == 0.0
    assert [(b.lo, b.hi, b.n) for b in pc.by_output] == [(101, 101, 24)]


def test_pairing_narrows_the_interval() -> None:
    """Requests whose E2E spans 10x (their lengths), the treatment 10 % faster on each, give a paired
    interval much narrower than the difference of the medians'."""
    rng = np.random.default_rng(1)
    base_e2e = rng.uniform(1.0, 10.0, 60)
    new_e2e = base_e2e * 0.9 * rng.uniform(0.98, 1.02, 60)
    b = [rec(i, float(v)) for i, v in enumerate(base_e2e)]
    n = [rec(i, float(v)) for i, v in enumerate(new_e2e)]
    e2e = paired_comparison(ArmRecords.of("b", [b]), ArmRecords.of("n", [n])).figure("e2e")
    assert e2e.diff_ci is not None and e2e.unpaired_ci is not None
    assert e2e.diff_ci.hi < 0  # the paired interval excludes no change
    assert e2e.unpaired_ci.lo < 0 < e2e.unpaired_ci.hi  # the unpaired one does not
    assert e2e.narrowing is not None and e2e.narrowing > 3


def test_bootstrap_is_seeded_and_brackets_the_difference() -> None:
    rng = np.random.default_rng(2)
    a, b = rng.normal(10.0, 1.0, 400), rng.normal(12.0, 1.0, 400)
    ci = bootstrap_median_difference(a, b)
    assert ci == bootstrap_median_difference(a, b)
    assert ci is not None and ci.lo < 2.0 < ci.hi and ci.width < 0.6
    # the standard error of a median of N(., 1) over 400 is about 1.2533 / 20; of the difference sqrt(2) of it
    assert ci.width == pytest.approx(2 * 1.96 * math.sqrt(2) * 1.2533 / 20, rel=0.3)
    assert bootstrap_median_difference(a[:1], b) is None


def test_goodput_over_the_requests_both_sent() -> None:
    slo = parse_slo("e2e_p99=2s")
    # baseline: rows 0-9, row i sent at T0 + i, e2e 1.5 s for even rows, 2.5 s for odd; row 9 failed
    base = [
        rec(i, 1.5 if i % 2 == 0 else 2.5, t_send=T0 + i, status=FAILED if i == 9 else OK) for i in range(10)
    ]
    # treatment: rows 0-10 (row 10 only here), all 1.8 s
    new = [rec(i, 1.8, t_send=T0 + i) for i in range(11)]
    pc = paired_comparison(ArmRecords.of("b", [base]), ArmRecords.of("n", [new]), slo)
    gb, gn = pc.goodput
    # over rows 0-9: baseline good = rows 0, 2, 4, 6, 8; its wall is T0 .. T0 + 9 + 2.5 (row 9 failed at 2.5 s)
    assert (gb.sent, gb.good, gb.good_tokens) == (10, 5, 5 * 101)
    assert gb.wall_s == pytest.approx(11.5) and gb.goodput_req_s == pytest.approx(5 / 11.5)
    assert (gn.sent, gn.good) == (10, 10) and gn.wall_s == pytest.approx(9 + 1.8)
    assert gn.good_share == 1.0 and gn.goodput_tok_s == pytest.approx(1010 / 10.8)


# ---------------------------------------------------------------- specload compare


def write_trace_run(d: Path, label: str, records: list[RequestRecord], scenario: dict[str, Any]) -> Path:
    d.mkdir(parents=True)
    meta = {
        "label": label,
        "backend": "openai",
        "model": "m",
        "scenario": {"name": "trace", "rates": [1.0], **scenario},
        "status": "completed",
        "levels": [],
        "simulated": True,
    }
    (d / "run.json").write_text(json.dumps(meta))
    (d / "records.jsonl").write_bytes(b"".join(r.to_json() + b"\n" for r in records))
    return d


def _trace_pair(tmp_path: Path, new_scenario: dict[str, Any] | None = None) -> tuple[Path, Path]:
    b = [rec(i, 1.0 + 0.3 * i, t_send=T0 + i, prompt=100 * (1 + i)) for i in range(16)]
    n = [rec(i, (1.0 + 0.3 * i) * 0.8, t_send=T0 + i, prompt=100 * (1 + i)) for i in range(16)]
    sc = {"seed": 7, "trace": "data/mooncake.jsonl"}
    return (
        write_trace_run(tmp_path / "base", "base", b, sc),
        write_trace_run(
            tmp_path / "mtp", "mtp", n, new_scenario or {**sc, "trace": "/elsewhere/mooncake.jsonl"}
        ),
    )


def test_compare_shows_the_paired_section(tmp_path: Path) -> None:
    base, mtp = _trace_pair(tmp_path)
    result = run_compare([base, mtp], out=tmp_path / "cmp", plot=False, slo="e2e_p99=4s")
    text = result.text
    assert "## Paired by trace request: mtp vs base (baseline)" in text
    assert "16 of the 16 trace requests sent are paired" in text
    assert "Δ unpaired, of medians (95% CI)" in text
    assert "by the trace's input tokens" in text and "Goodput under the SLO e2e_p99=4s" in text
    (pc,) = result.comparison.paired
    e2e = pc.figure("e2e")
    assert e2e.median_pct == pytest.approx(-20.0) and e2e.faster_share == 1.0
    assert pc.goodput[0].good == 11 and pc.goodput[1].good == 14  # e2e <= 4 s: i <= 10; 0.8x: i <= 13
    assert (tmp_path / "cmp" / "comparison.md").read_text().count("## Paired by trace request") == 1
    data = json.loads(run_compare([base, mtp], out=tmp_path / "cmp2", plot=False, fmt="json").text)
    (p,) = data["paired"]
    assert p["paired"] == 16 and p["figures"][2]["key"] == "e2e" and p["figures"][2]["diff_ci"]["hi"] < 0
    # What the text shows is in the JSON too: the "CI narrower" cell and the finding in words.
    j = p["figures"][2]
    narrowing = (j["unpaired_ci"]["hi"] - j["unpaired_ci"]["lo"]) / (j["diff_ci"]["hi"] - j["diff_ci"]["lo"])
    assert j["narrowing"] == pytest.approx(narrowing) and f"| {narrowing:.1f}x" in text
    assert p["sentence"].startswith("mtp vs base over the same 16 trace requests") and p["sentence"] in text
    page = run_compare([base, mtp], out=tmp_path / "cmp3", plot=False, fmt="html").page
    assert page is not None and "<h2>Paired by trace request: mtp vs base (baseline)</h2>" in page.read_text()


def test_compare_does_not_pair_other_requests(tmp_path: Path) -> None:
    base, mtp = _trace_pair(tmp_path, {"seed": 8, "trace": "data/mooncake.jsonl"})
    result = run_compare([base, mtp], out=tmp_path / "cmp", plot=False)
    assert result.comparison.paired == []
    assert any(
        "mtp is not paired with the baseline" in n and "seed 7 vs 8" in n for n in result.comparison.notes
    )
    assert "## Paired by trace request" not in result.text


def test_experiment_pairs_every_run_of_each_arm(tmp_path: Path) -> None:
    """An experiment's --repeat 2 makes two full replays per arm: each request's value per arm is the
    mean of its two (not the first run's alone, as the pooled Run's records would give)."""
    sc = {"seed": 7, "trace": "t.jsonl"}
    shapes = {
        ("base", 1): lambda i: 1.0 + 0.3 * i,
        ("mtp", 1): lambda i: 0.8 * (1.0 + 0.3 * i),
        ("base", 2): lambda i: 1.2 + 0.3 * i,
        ("mtp", 2): lambda i: 0.8 * (1.0 + 0.3 * i) + 0.1,
    }
    entries = []
    for order, (arm, rep) in enumerate(shapes, start=1):
        recs = [rec(i, shapes[arm, rep](i), t_send=T0 + 100 * order + i) for i in range(16)]
        d = write_trace_run(tmp_path / f"{arm}{rep}", arm, recs, sc)
        entries.append(RunEntry(order, arm, rep, COMPLETED, run_dir=str(d)))
    plan = Plan("exp.toml", "exp", "", (Arm("base"), Arm("mtp")), Scenario())
    ex = Experiment(plan, tmp_path, 2, {}, entries)
    result = compare_arms(ex, "github", WHOLE, plot=False)
    (pc,) = result.comparison.paired
    assert pc.repeats == (2, 2) and pc.paired == 16
    # per request: mtp (0.85 + 0.24 i) − base (1.1 + 0.3 i) = −0.25 − 0.06 i; the median of i = 0..15 at i = 7.5
    assert pc.figure("e2e").median_diff == pytest.approx(-0.25 - 0.06 * 7.5)
    assert "sent up to 2 times to base and 2 times to mtp" in result.text


def test_goodput_wall_is_each_replays_own() -> None:
    """A run's two repeats replay the trace one after the other: its wall is the two replays' walls, not
    the span from the first send of one to the last end of the other."""
    slo = parse_slo("e2e_p99=2s")
    recs = [rec(i, 1.0, t_send=T0 + i) for i in range(4)] + [
        rec(i, 1.0, t_send=T0 + 1000 + i, repeat=1) for i in range(4)
    ]
    pc = paired_comparison(ArmRecords.of("b", [recs]), ArmRecords.of("n", [recs]), slo)
    assert pc.goodput[0].wall_s == pytest.approx(2 * 4.0) and pc.goodput[0].good == 8
