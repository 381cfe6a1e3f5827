"""specload.analysis.comparison, specload.present.compare and specload.present.chartpng against generated run directories shaped
like the reference."""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from pathlib import Path

import pytest

from specload.analysis.comparison import (
    Change,
    Crossover,
    _tpot_part,
    build_comparison,
    change_pct,
    ci_change,
    crossover,
    crossover_sentence,
    repeats_to_settle,
    t_quantile_975,
    unique_labels,
)
from specload.analysis.run import load_run
from specload.core.text import fmt_pct
from specload.present.chartpng import MISSING_NOTICE, plot_comparison
from specload.present.compare import (
    CompareError,
    _columns,
    change_cell,
    main,
    print_result,
    render_table,
    run_compare,
    table_columns,
    table_rows,
)
from specload.present.tableview import SETTLE, view_for
from tests.fixtures.make_compare_runs import (
    BASE_AGG,
    BASE_PER,
    CAP,
    LEVELS,
    MTP_ACCEPT,
    MTP_AGG,
    MTP_PER,
    write_reference_pair,
    write_run,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# the reference's aggregate changes at C = 1, 4, 16, 32, 64, 128
REF_AGG = [change_pct(BASE_AGG[c], MTP_AGG[c]) for c in LEVELS]
REF_PER = [change_pct(BASE_PER[c], MTP_PER[c]) for c in LEVELS]
Y32, Y64 = REF_AGG[3], REF_AGG[4]
REF_CROSS = 2 ** (5 + Y32 / (Y32 - Y64))  # log2-linear between C=32 (x=5) and C=64 (x=6): ≈ 37.9

# The reference's changes told as findings, as they would be if each level had repeats that bear them out.
FIRM_REF_SENTENCE = (
    "mtp raises aggregate tok/s up to C=32 (+11%) and lowers it from C=64 (-32%), crossover near "
    "C≈38 (between C=32 and C=64); per-request speed stays higher at every level (+57% at C=128). "
    "Running requests decode faster at every level (TPOT -37% at C=128). "
    "At C>=64 the server queued requests: its max_running_requests is 48."
)
# The reference pair is one run of each (as the reference deployment's was): its changes are told as
# measurements, not as a rise, a fall or a crossover (docs/metrics.md, "Single runs").
SINGLE_RUNS = (
    "One run per level cannot tell a change from the spread between runs, which only repeats measure; "
    "repeats would settle it: sweep both again with `--repeat 3` (each level three times, pooled by specload "
    "compare), or make them arms of `specload experiment --repeat 3`, which interleaves them (A, B, A, B, ...) "
    "so that drift of the machine lands in the interval instead of in the difference."
)
REF_SENTENCE = (
    "mtp vs baseline: aggregate tok/s changes sign between C=32 and C=64 (near C≈38), in single runs. "
    "At C=1, 4, 16, 32, 64, 128 each side is a single run, so these changes are no finding "
    "yet: aggregate tok/s +12% (C=1), +40% (C=4), +39% (C=16), +11% (C=32), -32% (C=64), -42% (C=128); "
    "per-request tok/s +12% (C=1), +48% (C=4), +41% (C=16), +38% (C=32), "
    "+64% (C=64), +57% (C=128); TPOT p50 -11% (C=1), -33% (C=4), -29% (C=16), -28% (C=32), -39% (C=64), "
    f"-37% (C=128). {SINGLE_RUNS} At C>=64 the server queued requests: its max_running_requests is 48."
)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_reference_pair(tmp_path_factory.mktemp("runs"))


def cells(text: str, line: int) -> list[str]:
    return [c.strip() for c in text.splitlines()[line].strip("|").split("|")]


# ---------------------------------------------------------------- pure functions


def test_change_pct() -> None:
    assert change_pct(100.0, 112.0) == pytest.approx(12.0)
    assert change_pct(2327.0, 1571.1) == pytest.approx(-32.4839, abs=1e-4)
    assert change_pct(None, 1.0) is None and change_pct(1.0, None) is None
    assert change_pct(0.0, 5.0) is None  # no baseline rate to compare with


def test_fmt_pct() -> None:
    assert [fmt_pct(x) for x in (12.4, -32.48, 0.3, -0.4, None)] == ["+12%", "-32%", "0%", "0%", "-"]


# the table this module used for df = 1..30 (3 decimals); the exact quantile must agree with it
T_TABLE = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def test_t_quantile_table() -> None:
    assert [t_quantile_975(df) for df in range(1, 31)] == pytest.approx(T_TABLE, abs=6e-4)
    assert t_quantile_975(4) > t_quantile_975(4.9) > t_quantile_975(5)  # real df, not floored here
    assert t_quantile_975(0.5) == t_quantile_975(1)  # df < 1 is taken as 1
    assert 1.96 < t_quantile_975(1000) < t_quantile_975(31) < t_quantile_975(30)


def test_ci_change_welch_hand_computed() -> None:
    """The ~ test: Welch's t at floor(df), relative to the baseline mean."""
    # means 105 and 125 (+19.05%); variances 50 and 50, n = 2 each: se² = 25 + 25 = 50;
    # df = 50² / (25²/1 + 25²/1) = 2 -> t = 4.3027; threshold = 4.3027 * sqrt(50) / 105 = 28.98%
    ci = ci_change([100.0, 110.0], [120.0, 130.0])
    assert ci is not None and ci.pct == pytest.approx(20 / 105 * 100)
    assert ci.test_half_width == pytest.approx(4.302653 * math.sqrt(50) / 105 * 100, rel=1e-6)
    # n = 3, variances 1 and 1: se² = 2/3, df = (4/9) / ((1/9)/2 + (1/9)/2) = 4 -> t = 2.7764
    ci = ci_change([100.0, 101.0, 99.0], [120.0, 121.0, 119.0])
    assert ci is not None and ci.pct == pytest.approx(20.0)
    assert ci.test_half_width == pytest.approx(2.776445 * math.sqrt(2 / 3), rel=1e-6)
    # unequal variances: base var 0 -> df = n_new - 1 = 2 (the ratio's interval equals the test's here)
    ci = ci_change([100.0, 100.0], [110.0, 120.0, 130.0])
    assert ci is not None and ci.pct == pytest.approx(20.0)
    assert ci.test_half_width == pytest.approx(4.302653 * math.sqrt(100 / 3), rel=1e-6)
    assert ci.half_width == pytest.approx(ci.test_half_width)
    same = ci_change([100.0, 100.0], [110.0, 110.0])
    assert same is not None and (same.pct, same.half_width, same.test_half_width) == (
        pytest.approx(10.0),
        0.0,
        0.0,
    )
    assert ci_change([100.0], [110.0, 120.0]) is None
    assert ci_change([0.0, 0.0], [1.0, 2.0]) is None


def test_change_cell_and_noise() -> None:
    assert change_cell(Change(12.2)) == "+12%" and not Change(12.2).noise
    assert change_cell(Change(12.2, 3.4)) == "+12% (±3%)"
    assert change_cell(Change(2.0, 5.0)) == "+2% (±5%) ~" and Change(2.0, 5.0).noise
    assert change_cell(Change(-1.0, 0.4)) == "-1% (±0.4%)"
    assert change_cell(Change(None, None)) == "-"


def test_crossover_reference() -> None:
    (x,) = crossover(list(LEVELS), REF_AGG)
    assert (x.low, x.high, x.direction) == (32, 64, "down")
    assert x.at == pytest.approx(REF_CROSS) and x.at == pytest.approx(37.93, abs=0.01)
    assert crossover(list(LEVELS), REF_PER) == []


@pytest.mark.parametrize(("d", "n"), [(2.3, 3), (1.8, 4), (1.6, 5), (1.4, 6)])
def test_repeats_to_settle_by_the_t_table(d: float, n: int) -> None:
    """Two repeats a side of variance 1 each (values √2 apart), means d apart: by the t table
    (t_{0.975}: 2.776 at df 4, 2.447 at 6, 2.306 at 8, 2.228 at 10), t × sqrt(2/n) is 2.267 at n = 3,
    1.730 at 4, 1.458 at 5, 1.286 at 6: the first n where it falls under d."""
    r = math.sqrt(2)
    assert repeats_to_settle([10.0, 10.0 + r], [10.0 + d, 10.0 + d + r]) == n
    assert repeats_to_settle([10.0, 10.0], [11.0, 11.0]) is None  # no spread to go on
    assert repeats_to_settle([10.0], [11.0, 12.0]) is None  # one repeat: no spread of its own


def test_crossover_interpolates_in_log2() -> None:
    # C=1 (x=0) +10%, C=4 (x=2) -10%: zero halfway in log2 -> x=1 -> C=2
    assert crossover([1, 4], [10.0, -10.0]) == [Crossover(1, 4, pytest.approx(2.0), "down")]  # type: ignore[arg-type]
    # a missing level is skipped: between C=1 and C=4, x = 2 * 10/40 = 0.5
    (x,) = crossover([1, 2, 4], [10.0, None, -30.0])
    assert (x.low, x.high) == (1, 4) and x.at == pytest.approx(math.sqrt(2))
    # an exact zero is no direction: the crossover is that level, inside the noise
    (x,) = crossover([1, 2, 4], [10.0, 0.0, -10.0])
    assert (x.low, x.high, x.at, x.inside_noise) == (1, 4, 2.0, True)


def test_crossover_several_and_up() -> None:
    xs = crossover([1, 2, 4, 8], [5.0, -5.0, 5.0, -5.0])
    assert [(x.low, x.high, x.direction) for x in xs] == [(1, 2, "down"), (2, 4, "up"), (4, 8, "down")]
    assert [x.at for x in xs] == pytest.approx([math.sqrt(2), 2 * math.sqrt(2), 4 * math.sqrt(2)])
    assert crossover([1, 2], [None, None]) == []
    with pytest.raises(ValueError):
        crossover([1, 2], [1.0])


def test_sentence_reference() -> None:
    tpot = [-37.0] * len(LEVELS)
    s = crossover_sentence(
        "mtp", list(LEVELS), REF_AGG, REF_PER, queue_from=64, max_running=48, tpot_changes=tpot
    )
    assert s == FIRM_REF_SENTENCE


def test_sentence_never_crosses() -> None:
    up = crossover_sentence("mtp", [1, 4, 16], [12.0, 40.0, 38.0], [20.0, 10.0, 5.0])
    assert up == (
        "mtp raises aggregate tok/s at every level measured (+12% to +40%); "
        "per-request speed stays higher at every level (+5% at C=16)."
    )
    down = crossover_sentence("eagle", [1, 4], [-3.0, -20.0], [-1.0, -2.0])
    assert down == (
        "eagle lowers aggregate tok/s at every level measured (-20% to -3%); "
        "per-request speed stays lower at every level (-2% at C=4)."
    )
    one = crossover_sentence("x", [1, 4], [12.0, None], [None, None])
    assert one == "x raises aggregate tok/s at every level measured (+12%)."


def test_sentence_per_request_flips_and_queue_variants() -> None:
    # per-request crossover: log2 C = 2 + 2 * 2 / (2 + 4) = 2.667 -> C = 6.35
    s = crossover_sentence("mtp", [1, 4, 16], [-5.0, -6.0, -7.0], [10.0, 2.0, -4.0], queue_from=16)
    assert s == (
        "mtp lowers aggregate tok/s at every level measured (-7% to -5%); per-request speed is higher up "
        "to C=4 (+2%) and lower from C=16 (-4%), crossover near C≈6.3 (between C=4 and C=16). "
        "At C>=16 the server queued requests."
    )
    # queueing below the cap (e.g. KV cache full): the cap is named but not blamed
    s = crossover_sentence("mtp", [1, 4], [5.0, 6.0], [1.0, 1.0], queue_from=4, max_running=48)
    assert s.endswith("At C>=4 the server queued requests (its max_running_requests is 48).")
    assert crossover_sentence("x", [1], [None], [None]) == (
        "x: no level was measured in both runs, so there is nothing to compare."
    )


def test_unique_labels() -> None:
    assert unique_labels(["mtp", "mtp", "base", "mtp"]) == ["mtp", "mtp-2", "base", "mtp-3"]


# ---------------------------------------------------------------- the reference pair


def test_reference_table(pair: tuple[Path, Path]) -> None:
    comp = build_comparison([load_run(p) for p in pair])
    assert comp.levels == list(LEVELS)
    cols = table_columns(comp)
    assert cols == [
        "C",
        "Agg tok/s baseline",
        "Agg tok/s mtp",
        "Δ agg mtp",
        "Per-req tok/s baseline",
        "Per-req tok/s mtp",
        "Δ per-req mtp",
        "TTFT p50 (ms) baseline",
        "TTFT p50 (ms) mtp",
        "TTFT p99 (ms) baseline",
        "TTFT p99 (ms) mtp",
        "TPOT p50 (ms) baseline",
        "TPOT p50 (ms) mtp",
        "Δ TPOT mtp",
        "Accept len baseline",
        "Accept len mtp",
        "Srv run/queue baseline",
        "Srv run/queue mtp",
    ]
    rows = {r[0]: dict(zip(cols, r, strict=True)) for r in table_rows(comp)}
    expected_agg = {"1": "+12%", "4": "+40%", "16": "+39%", "32": "+11%", "64": "-32%", "128": "-42%"}
    for c, change in expected_agg.items():
        assert rows[c]["Δ agg mtp"] == change + " (1 run)", c
        assert rows[c]["Δ per-req mtp"].startswith("+"), c  # mtp faster per request everywhere
    assert (rows["64"]["Agg tok/s baseline"], rows["64"]["Agg tok/s mtp"]) == ("2327.0", "1571.1")
    assert (rows["128"]["Per-req tok/s baseline"], rows["128"]["Per-req tok/s mtp"]) == ("41.0", "64.5")
    assert rows["128"]["Δ per-req mtp"] == "+57% (1 run)"
    assert rows["1"]["Accept len mtp"] == "2.00" and rows["64"]["Accept len mtp"] == "1.60"
    assert rows["1"]["Accept len baseline"] == "-"
    assert rows["32"]["Srv run/queue mtp"] == "32 / 0"
    assert rows["128"]["Srv run/queue mtp"] == f"{CAP} / 80"
    assert rows["128"]["Srv run/queue baseline"] == "-"
    assert rows["1"]["TTFT p50 (ms) mtp"] == "100.0" and rows["1"]["TTFT p99 (ms) mtp"] == "100.0"
    assert comp.sentences == [REF_SENTENCE]
    assert any("C=64 exceeds the server's max_running_requests (48)" in n for n in comp.notes)
    # spec_verify_ct = round(1000 / accept): 1000 / 526 = 1.901 at C=16
    accept = [comp.runs[1].figures[c].of("accept_length") for c in LEVELS]
    assert accept == pytest.approx([MTP_ACCEPT[c] for c in LEVELS], abs=0.002)


def test_queue_from_samples_alone(tmp_path: Path) -> None:
    """No max_running_requests in run.json: the sampled queue alone names the level."""
    base = write_run(tmp_path / "b", "baseline", BASE_AGG, BASE_PER)
    mtp = write_run(tmp_path / "m", "mtp", MTP_AGG, MTP_PER, cap=CAP)
    comp = build_comparison([load_run(base), load_run(mtp)])
    # ... and the running gauge's plateau behind that queue shows the cap the server did not say
    assert comp.sentences[0].endswith(
        "-37% (C=128). "
        + SINGLE_RUNS
        + " At C>=64 the server queued requests: its max_running_requests is 48, inferred from its gauges."
    )
    # and no queue part at all without samples or a cap
    plain = write_run(tmp_path / "p", "mtp", MTP_AGG, MTP_PER)
    comp = build_comparison([load_run(base), load_run(plain)])
    assert comp.sentences[0].endswith("-37% (C=128). " + SINGLE_RUNS)
    assert not any(c.startswith("Srv") for c in table_columns(comp))
    assert not any(c.startswith("Accept") for c in table_columns(comp))


def test_missing_level_shown_not_dropped(tmp_path: Path) -> None:
    base = write_run(tmp_path / "b", "baseline", BASE_AGG, BASE_PER)
    agg = {c: v for c, v in MTP_AGG.items() if c != 128} | {256: 1700.0}
    per = {c: v for c, v in MTP_PER.items() if c != 128} | {256: 60.0}
    mtp = write_run(tmp_path / "m", "mtp", agg, per)
    comp = build_comparison([load_run(base), load_run(mtp)])
    assert comp.levels == [1, 4, 16, 32, 64, 128, 256]
    cols = table_columns(comp)
    rows = {r[0]: dict(zip(cols, r, strict=True)) for r in table_rows(comp)}
    assert rows["128"]["Agg tok/s baseline"] == "2800.0"
    assert rows["128"]["Agg tok/s mtp"] == "-" and rows["128"]["Δ agg mtp"] == "-"
    assert rows["256"]["Agg tok/s baseline"] == "-" and rows["256"]["Agg tok/s mtp"] == "1700.0"
    assert "C=128: no measured requests in mtp; shown as -" in comp.notes
    assert "C=256: no measured requests in baseline; shown as -" in comp.notes
    assert "+64% (C=64); TPOT" in comp.sentences[0]  # the last level both runs have


def test_repeats_confidence_interval_and_noise_mark(tmp_path: Path) -> None:
    # C=1: agg 100/110 vs 120/130 -> +19% ± 29% (contains 0: ~); C=4: 3 tight repeats -> +20% (±2%)
    base = write_run(
        tmp_path / "b",
        "baseline",
        {1: [100.0, 110.0], 4: [300.0, 303.0, 297.0], 16: 800.0},
        {1: [110.0, 110.0], 4: [80.0, 80.0, 80.0], 16: 60.0},
    )
    mtp = write_run(
        tmp_path / "m",
        "mtp",
        {1: [120.0, 130.0], 4: [360.0, 363.0, 357.0], 16: 900.0},
        {1: [120.0, 121.0], 4: [88.0, 88.0, 88.0], 16: 70.0},
    )
    comp = build_comparison([load_run(base), load_run(mtp)])
    cols = table_columns(comp)
    rows = {r[0]: dict(zip(cols, r, strict=True)) for r in table_rows(comp)}
    assert rows["1"]["Agg tok/s baseline"] == "105.0" and rows["1"]["Agg tok/s mtp"] == "125.0"
    assert rows["1"]["Δ agg mtp"] == "+19% (±33%) ~"
    assert rows["4"]["Δ agg mtp"] == "+20% (±3%)"
    assert rows["4"]["Δ per-req mtp"] == "+10% (±0.0%)"
    assert rows["16"]["Δ agg mtp"] == "+12% (1 run)"  # single repeat: no interval, no finding
    # repeats to settle the sign (below): C=1's agg is inside the noise, C=4's are settled, C=16 has no spread
    assert [rows[c]["Repeats to settle mtp"] for c in ("1", "4", "16")] == ["~3", "—", "-"]
    # its own column after both changes, named for what it settles in the notes
    at = cols.index("Repeats to settle mtp")
    assert cols[at - 4 : at] == ["Δ agg mtp", "Per-req tok/s baseline", "Per-req tok/s mtp", "Δ per-req mtp"]
    assert _columns(comp)[at][1] == SETTLE
    assert any("Repeats to settle (after Δ agg and Δ per-req)" in n for n in comp.notes)
    agg = comp.agg["mtp"]
    # printed: delta method, R = 125/105, (25 + R² 25) / 105², df Welch–Satterthwaite of the two terms
    r = 125 / 105
    df = (25 + r * r * 25) ** 2 / (25**2 + (r * r * 25) ** 2)
    assert agg[0].ci == pytest.approx(t_quantile_975(df) * math.sqrt(25 + r * r * 25) / 105 * 100, rel=1e-6)
    # the ~ test: Welch at floor(df) = 2 -> t = 4.3027, threshold 4.3027 * sqrt(50) / 105
    assert agg[0].test_hw == pytest.approx(4.302653 * math.sqrt(50) / 105 * 100, rel=1e-6)
    # variances 9 and 9, n = 3: se² = 3 + 3, df = 36 / (9/2 + 9/2) = 4 -> t = 2.7764
    assert agg[1].test_hw == pytest.approx(2.776445 * math.sqrt(6) / 300 * 100, rel=1e-6)
    assert agg[0].noise and not agg[1].noise
    assert comp.sentences[0].startswith(
        "mtp raises aggregate tok/s at every level outside the noise (+20%; C=1: +19.0%, inside the noise)"
    ), comp.sentences[0]
    assert (
        "Besides, at C=16 each side is a single run, so these changes are no finding yet" in comp.sentences[0]
    )
    # C=1's agg inside the noise: s² = (50 + 50) / 2, |d| = 20; n = 3: t(4) = 2.7764, 2.7764 √50 √(2/3)
    # = 16.03 < 20 (n = 2, the repeats run, does not: 4.3027 √50 = 30.4); C=4's is settled: no n
    assert 2.776445 * math.sqrt(50) * math.sqrt(2 / 3) < 20 < 4.302653 * math.sqrt(50)
    assert (agg[0].settle_n, agg[1].settle_n, comp.per_req["mtp"][0].settle_n) == (3, None, None)
    assert comp.sentences[0].endswith(
        "The changes marked ~ (C=1) are inside the noise of the repeats; at their measured spread, "
        "settling the sign at C=1 would take ~3 repeats per arm."
    ), comp.sentences[0]
    assert any(
        "~ means Welch's t test of the means finds no difference at 5%: the change is inside the noise" in n
        for n in comp.notes
    )
    assert any("repeats per run (baseline/mtp): C=1 2/2, C=4 3/3" in n for n in comp.notes)


def test_labels_made_unique_and_dir_fallback(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", "mtp", {1: 100.0}, {1: 100.0})
    b = write_run(tmp_path / "b", "mtp", {1: 110.0}, {1: 110.0})
    comp = build_comparison([load_run(a), load_run(b)])
    assert [r.label for r in comp.runs] == ["mtp", "mtp-2"]
    assert "Δ agg mtp-2" in table_columns(comp)
    meta = json.loads((a / "run.json").read_text())
    del meta["label"]
    (a / "run.json").write_text(json.dumps(meta))
    assert build_comparison([load_run(a), load_run(b)]).runs[0].label == "a"


def test_three_runs(tmp_path: Path) -> None:
    base = write_run(tmp_path / "b", "baseline", {1: 100.0, 4: 300.0}, {1: 100.0, 4: 80.0})
    mtp = write_run(tmp_path / "m", "mtp", {1: 120.0, 4: 270.0}, {1: 120.0, 4: 90.0})
    eagle = write_run(tmp_path / "e", "eagle", {1: 110.0, 4: 330.0}, {1: 110.0, 4: 85.0})
    comp = build_comparison([load_run(p) for p in (base, mtp, eagle)])
    cols = table_columns(comp)
    assert cols[:6] == [
        "C",
        "Agg tok/s baseline",
        "Agg tok/s mtp",
        "Agg tok/s eagle",
        "Δ agg mtp",
        "Δ agg eagle",
    ]
    assert len(comp.sentences) == 2
    assert comp.sentences[0].startswith(
        "mtp vs baseline: aggregate tok/s changes sign between C=1 and C=4 (near C≈2.5), in single runs. "
        "At C=1, 4 each side is a single run, so these changes are no finding yet: "
        "aggregate tok/s +20% (C=1), -10% (C=4);"
    )
    assert comp.sentences[1].startswith(
        "eagle vs baseline: at C=1, 4 each side is a single run, so these changes are no finding yet: "
        "aggregate tok/s +10% (C=1), +10% (C=4);"
    )


def test_config_differences_noted(tmp_path: Path) -> None:
    base = write_run(tmp_path / "b", "baseline", {1: 100.0}, {1: 100.0})
    mtp = write_run(tmp_path / "m", "mtp", {1: 120.0}, {1: 120.0}, simulated=False, status="interrupted")
    meta = json.loads((mtp / "run.json").read_text())
    meta["model"] = "other-model"
    (mtp / "run.json").write_text(json.dumps(meta))
    comp = build_comparison([load_run(base), load_run(mtp)])
    assert any(
        n.startswith("the runs differ in model (baseline qwen-122b, mtp other-model)") for n in comp.notes
    )
    assert "mtp: run status is interrupted: the last levels may be partial" in comp.notes


# ---------------------------------------------------------------- formats and CLI


@pytest.mark.parametrize("fmt", ["github", "plain", "grid", "simple", "csv", "json"])
def test_every_format(
    pair: tuple[Path, Path], fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main([str(pair[0]), str(pair[1]), "--format", fmt, "--out", str(out), "--no-plot"]) == 0
    captured = capsys.readouterr()
    text = captured.out
    if fmt == "json":
        data = json.loads(text)
        assert [r["label"] for r in data["runs"]] == ["baseline", "mtp"] and data["runs"][0]["baseline"]
        assert [lv["concurrency"] for lv in data["levels"]] == list(LEVELS)
        c64 = data["levels"][4]
        assert c64["changes"]["mtp"]["agg"]["pct"] == pytest.approx(Y64)
        assert c64["runs"]["mtp"]["server_queued_max"] == 16
        (x,) = data["crossovers"]["mtp"]["agg"]
        assert x["low"] == 32 and x["high"] == 64 and x["at"] == pytest.approx(REF_CROSS)
        assert data["sentences"] == [REF_SENTENCE]
        assert REF_SENTENCE in captured.err
    elif fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(text)))
        assert [r["C"] for r in rows] == [str(c) for c in LEVELS]
        assert rows[4]["Δ agg mtp"] == "-32% (1 run)" and rows[0]["Accept len baseline"] == ""
    else:
        assert "Agg tok/s mtp" in text and REF_SENTENCE in text and "SIMULATED" in text
        assert "server: engine sglang, speculative_algorithm NEXTN, max_running_requests 48" in text
    md = (out / "comparison.md").read_text()
    assert md.startswith("# specload comparison: baseline vs mtp") and REF_SENTENCE in md
    assert "Δ agg mtp" in md
    assert "![" not in md  # --no-plot
    assert f"wrote {out / 'comparison.md'}" in captured.err


def test_render_table_rejects_unknown_format(
    pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    comp = build_comparison([load_run(p) for p in pair])
    with pytest.raises(ValueError):
        render_table(comp, "nope")
    assert main([str(pair[0]), str(pair[1]), "--format", "nope"]) == 2
    assert "unknown format" in capsys.readouterr().err


def test_bad_paths_exit_2(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(pair[0]), str(tmp_path / "nowhere")]) == 2
    assert "nowhere: not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([str(pair[0]), str(tmp_path / "empty")]) == 2
    assert "not a specload run directory" in capsys.readouterr().err
    assert main([str(pair[0])]) == 2
    assert "at least two run directories" in capsys.readouterr().err
    f = tmp_path / "file.txt"
    f.write_text("x")
    assert main([str(f), str(pair[1])]) == 2


def test_rate_runs_and_concurrency_runs_exit_2_with_one_line(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rate run beside a concurrency run has no common x axis: a one-line error, not a traceback."""
    import shutil

    rate = tmp_path / "rate"
    shutil.copytree(pair[1], rate)
    meta = json.loads((rate / "run.json").read_text())
    for i, lv in enumerate(meta["levels"]):
        lv["rate"] = 2.0**i
    (rate / "run.json").write_text(json.dumps(meta))
    assert main([str(pair[0]), str(rate), "--no-plot", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "specload compare: cannot compare runs of request-rate levels with runs of concurrency"
    )
    assert "Traceback" not in err and err.count("\n") == 1


def test_default_out_dir_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    base, mtp = write_reference_pair(tmp_path / "results")
    assert main([str(base), str(mtp)]) == 0
    (out,) = (tmp_path / "results").glob("compare-baseline-vs-mtp-*Z")
    assert len(out.name) == len("compare-baseline-vs-mtp-") + len("20250101T000000Z")
    png = out / "comparison.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    md = (out / "comparison.md").read_text()
    assert "(comparison.png)" in md
    err = capsys.readouterr().err
    assert f"wrote {out / 'comparison.md'}" in err and f"wrote {png}" in err


def test_plot_path_option(pair: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "pics" / "cmp.png"
    assert main([str(pair[0]), str(pair[1]), "--out", str(tmp_path / "o"), "--plot", str(target)]) == 0
    assert target.read_bytes()[:8] == PNG_MAGIC
    assert not (tmp_path / "o" / "comparison.png").exists()
    assert str(target.resolve()) in (tmp_path / "o" / "comparison.md").read_text()


# ---------------------------------------------------------------- plot


def test_plot_comparison_writes_png_with_simulated_title(
    pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    titles: list[str] = []
    vlines: list[float] = []
    orig_suptitle, orig_axvline = Figure.suptitle, Axes.axvline
    monkeypatch.setattr(
        Figure, "suptitle", lambda self, t, **kw: titles.append(t) or orig_suptitle(self, t, **kw)
    )
    monkeypatch.setattr(
        Axes, "axvline", lambda self, x=0, *a, **kw: vlines.append(x) or orig_axvline(self, x, *a, **kw)
    )
    path = plot_comparison(build_comparison([load_run(p) for p in pair]), tmp_path / "sub" / "p.png")
    assert path == tmp_path / "sub" / "p.png"
    assert path.read_bytes()[:8] == PNG_MAGIC
    assert titles == ["specload: baseline vs mtp (SIMULATED)"]
    # the aggregate crossover only (per-request never crosses), and on both charts mtp's cap, as the HTML draws them
    assert vlines == [pytest.approx(REF_CROSS), CAP, CAP]


def test_plot_without_matplotlib(
    pair: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert plot_comparison(build_comparison([load_run(p) for p in pair]), tmp_path / "p.png") is None
    assert not (tmp_path / "p.png").exists()
    captured = capsys.readouterr()
    assert captured.err == MISSING_NOTICE + "\n" and captured.out == ""
    assert MISSING_NOTICE == "plot skipped: matplotlib is not installed (pip install 'specload[plot]')"
    # the command carries on: table, markdown, exit 0, no image link
    out = tmp_path / "out"
    assert main([str(pair[0]), str(pair[1]), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err.count(MISSING_NOTICE) == 1 and REF_SENTENCE in captured.out
    assert not (out / "comparison.png").exists() and "![" not in (out / "comparison.md").read_text()


def test_changes_inside_the_noise_or_negligible_make_no_crossover() -> None:
    assert Change(0.4).negligible  # under 1%: no direction
    assert Change(-3.0, ci=5.0).negligible and Change(-3.0, ci=5.0).noise  # interval contains 0
    assert not Change(-3.0, ci=1.0).negligible
    assert not Change(None).negligible
    assert Change(-3.0, ci=2.0, test_hw=4.0).noise  # the test decides ~, not the printed interval
    levels = [1, 2, 4]
    changes = [Change(0.4), Change(-0.3), Change(-3.0, ci=5.0)]
    assert crossover(levels, changes) == []
    text = crossover_sentence("b", levels, changes, changes)
    assert "unchanged at every level" in text and "crossover" not in text


def test_tpot_clause() -> None:
    assert (
        _tpot_part([1, 2], [-20.0, -10.0])
        == "Running requests decode faster at every level (TPOT -10% at C=2)"
    )
    assert _tpot_part([1, 2], [5.0, 3.0]) == "Running requests decode slower at every level (TPOT +3% at C=2)"
    mixed = _tpot_part([1, 2, 4], [-20.0, 0.2, 6.0])
    assert mixed == "Running requests decode faster at C=1 and slower at C=4 (TPOT +6% at C=4)"
    assert _tpot_part([1], [None]) is None and _tpot_part([1], [0.3]) is None


# ---------------------------------------------------------------- callable without argv


@pytest.mark.parametrize("fmt", ["github", "json"])
def test_run_compare_is_main_without_argv(
    pair: tuple[Path, Path], tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(pair[0]), str(pair[1]), "--format", fmt, "--out", str(tmp_path / "a"), "--no-plot"]) == 0
    by_main = capsys.readouterr()
    result = run_compare(pair, out=tmp_path / "b", fmt=fmt, plot=False, view=view_for(None))  # what fits here
    assert result.sentences == [REF_SENTENCE] and result.comparison.levels == list(LEVELS)
    assert result.markdown == tmp_path / "b" / "comparison.md" and result.plot is None
    assert result.written == [result.markdown]
    assert (tmp_path / "a" / "comparison.md").read_text() == result.markdown.read_text()
    out, err = io.StringIO(), io.StringIO()
    print_result(result, out, err)
    assert out.getvalue() == by_main.out
    assert err.getvalue() == by_main.err.replace(str(tmp_path / "a"), str(tmp_path / "b"))
    assert (result.side is None) == (fmt == "github")


def test_run_compare_errors(pair: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(CompareError, match="at least two run directories"):
        run_compare([pair[0]])
    with pytest.raises(CompareError, match="unknown format 'nope'"):
        run_compare(pair, fmt="nope")
    with pytest.raises(CompareError, match="nowhere: not a directory"):
        run_compare([pair[0], tmp_path / "nowhere"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(CompareError, match="not a specload run directory"):
        run_compare([pair[0], tmp_path / "empty"])


def test_plot_draws_the_verdicts_crossovers_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Changes under 1% make no crossover in the verdict, so none in the plot either."""
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    vlines: list[float] = []
    orig = Axes.axvline
    monkeypatch.setattr(
        Axes, "axvline", lambda self, x=0, *a, **kw: vlines.append(x) or orig(self, x, *a, **kw)
    )
    base = write_run(
        tmp_path / "b", "baseline", {1: 100.0, 2: 200.0, 4: 300.0}, {1: 100.0, 2: 100.0, 4: 75.0}
    )
    mtp = write_run(tmp_path / "m", "mtp", {1: 100.5, 2: 199.5, 4: 330.0}, {1: 100.4, 2: 99.8, 4: 80.0})
    comp = build_comparison([load_run(base), load_run(mtp)])
    assert comp.crossovers["mtp"].agg == [] and comp.crossovers["mtp"].per_req == []
    assert "crossover" not in comp.sentences[0]
    assert plot_comparison(comp, tmp_path / "p.png") is not None
    assert vlines == []


def test_plot_draws_a_finished_comparison() -> None:
    """The PNGs depend on specload.analysis.comparison only, never on the CLI module that calls them (no circle)."""
    import ast

    import specload.present.chartpng
    import specload.present.compare

    def imported(module: object) -> set[str]:
        tree = ast.parse(Path(module.__file__).read_text())  # type: ignore[attr-defined]
        return {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}

    assert "specload.analysis.comparison" in imported(
        specload.present.chartpng
    ) and "specload.present.compare" not in imported(specload.present.chartpng)
    assert "specload.present.report" not in imported(
        specload.present.compare
    )  # both read runs through specload.analysis.run


def test_json_carries_every_figure_with_the_distributions(pair: tuple[Path, Path]) -> None:
    from specload.present.compare import to_dict

    data = to_dict(build_comparison([load_run(p) for p in pair]))
    text = json.dumps(data)
    assert '"ttft_p99_ms"' in text and '"itl_p99_ms"' in text and '"req_s"' in text
    assert '"dists"' in text and '"p99.9"' in text and '"tok_s_series"' in text


def test_a_level_the_client_distorted_is_named_in_the_comparison(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """A run.json level whose client figures cross a threshold (specload.analysis.clientcheck) gets a note."""
    import shutil

    base, mtp = (Path(shutil.copytree(p, tmp_path / p.name)) for p in pair)  # the fixture is shared
    meta = json.loads((mtp / "run.json").read_text())
    lv = next(x for x in meta["levels"] if x["concurrency"] == 64)
    lv["client"] = {
        "per_process": {
            "local": {
                "cpu": 0.99,
                "wall_s": 10.0,
                "lag_p99_ms": 40.0,
                "lag_p50_ms": 12.0,
                "lag_max_ms": 90.0,
                "samples": 100,
            }
        },
        "mean_in_flight": 61.0,
    }
    (mtp / "run.json").write_text(json.dumps(meta))
    comp = build_comparison([load_run(base), load_run(mtp)])
    flagged = [n for n in comp.notes if "the client was the bottleneck at C=64" in n]
    assert len(flagged) == 1 and flagged[0].startswith("mtp: ") and "--processes N" in flagged[0], comp.notes
