"""Numbers you can trust in ``specload compare`` (audit F1, F3, F8, F9, F10): one crossover for the
text, the JSON and the plot; Δ suppressed where the runs are not comparable; the exact t quantile;
the ratio's interval by the delta method; verdict sentences that do not contradict themselves."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from specload.analysis.comparison import (
    Change,
    build_comparison,
    ci_change,
    crossover,
    crossover_sentence,
    t_quantile_975,
)
from specload.analysis.run import load_run
from specload.present.chartpng import plot_comparison
from specload.present.compare import table_columns, table_rows, to_dict
from tests.fixtures.make_compare_runs import write_run

# ---------------------------------------------------------------- F8: the exact t quantile

T_KNOWN = {
    1: 12.7062,
    2: 4.3027,
    5: 2.5706,
    10: 2.2281,
    30: 2.0423,
    31: 2.0395,
    40: 2.0211,
    60: 2.0003,
    120: 1.9799,
    1e6: 1.95997,
}


@pytest.mark.parametrize(("df", "t"), sorted(T_KNOWN.items()))
def test_t_quantile_exact(df: float, t: float) -> None:
    assert t_quantile_975(df) == pytest.approx(t, abs=1e-3)


def test_t_quantile_real_df_by_integrating_the_density() -> None:
    """Welch's df is real: check t at df = 1.5 and 3.7 against a midpoint integral of the t density."""
    assert t_quantile_975(2) > t_quantile_975(2.5) > t_quantile_975(3)
    for df in (1.5, 3.7):
        t = t_quantile_975(df)
        c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
        n = 20_000
        h = t / n
        inside = 2 * h * sum(c * (1 + ((i + 0.5) * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(n))
        assert inside == pytest.approx(0.95, abs=1e-7)


def test_noise_test_is_welch_at_floor_df_with_the_exact_quantile() -> None:
    # n = 3 each, variances 1 and 4: se² = 1/3 + 4/3 = 5/3; df = (25/9) / ((1/9)/2 + (16/9)/2) = 2.94 -> 2
    ci = ci_change([99.0, 100.0, 101.0], [108.0, 110.0, 112.0])
    assert ci is not None
    assert ci.test_half_width == pytest.approx(4.3027 * math.sqrt(5 / 3) / 100 * 100, abs=1e-3)


# ---------------------------------------------------------------- F9: delta method


def test_ratio_interval_by_the_delta_method_hand_computed() -> None:
    # base 100/110 (mean 105, s² 50, n 2), new 120/132 (mean 126, s² 72): R = 1.2.
    # Var(R) ≈ (s²_n/n_n + R² s²_b/n_b) / mean_b² = (36 + 1.44 × 25) / 105² = 72 / 105²;
    # df = 72² / (36²/1 + 36²/1) = 2 -> t = 4.3027; half-width = 4.3027 × √72 / 105 × 100 = 34.77%
    ci = ci_change([100.0, 110.0], [120.0, 132.0])
    assert ci is not None
    assert ci.pct == pytest.approx(20.0)
    assert ci.half_width == pytest.approx(4.302653 * math.sqrt(72) / 105 * 100, rel=1e-5)
    assert ci.half_width == pytest.approx(34.77, abs=0.01)
    # n = 3 each: base 99/100/101 (s² 1), new 108.9/110/111.1 (s² 1.21), R = 1.1:
    # (1.21/3 + 1.21 × 1/3) / 100², df = 4 -> t = 2.7764; half-width = 2.7764 × √(2.42/3) %
    ci = ci_change([99.0, 100.0, 101.0], [108.9, 110.0, 111.1])
    assert ci is not None and ci.pct == pytest.approx(10.0)
    assert ci.half_width == pytest.approx(2.776445 * math.sqrt(2.42 / 3), rel=1e-5)


def test_delta_method_is_wider_than_treating_the_baseline_mean_as_exact() -> None:
    """The old half-width t × √(s²_b/n_b + s²_n/n_n) / mean_b leaves out R² on the baseline's term."""
    base, new = [100.0, 104.0, 96.0, 100.0], [120.0, 126.0, 114.0, 120.0]
    ci = ci_change(base, new)
    assert ci is not None
    qb, qn = 32 / 3 / 4, 72 / 3 / 4  # sample variances 32/3 and 72/3, n = 4
    r = 1.2
    df = (qn + r * r * qb) ** 2 / (qn**2 / 3 + (r * r * qb) ** 2 / 3)
    assert ci.half_width == pytest.approx(
        t_quantile_975(df) * math.sqrt(qn + r * r * qb) / 100 * 100, rel=1e-9
    )
    old = t_quantile_975(6) * math.sqrt(qn + qb) / 100 * 100
    assert ci.half_width > old


# ---------------------------------------------------------------- F1: one crossover


def test_crossover_at_a_level_inside_the_noise() -> None:
    """+10% at C=16, +0.5% at C=32, −30% at C=64: the crossing is at C=32 itself, not C≈23."""
    (x,) = crossover([16, 32, 64], [10.0, 0.5, -30.0])
    assert (x.low, x.high, x.at, x.inside_noise, x.direction) == (16, 64, 32.0, True, "down")
    (x,) = crossover([16, 32, 64], [Change(10.0, 2.0), Change(-3.0, 5.0), Change(-30.0, 2.0)])
    assert x.inside_noise and x.at == 32.0
    (x,) = crossover([16, 32, 64], [10.0, 5.0, -30.0])  # no noise: raw log2 interpolation
    assert not x.inside_noise and x.at == pytest.approx(2 ** (5 + 5 / 35))


def test_crossover_inside_the_noise_in_the_sentence() -> None:
    s = crossover_sentence("mtp", [16, 32, 64], [10.0, 0.5, -30.0], [20.0, 10.0, 5.0])
    assert s.startswith(
        "mtp raises aggregate tok/s up to C=16 (+10%) and lowers it from C=64 (-30%), crossover at about "
        "C=32 (inside the noise: +0.5%);"
    )
    assert "C≈23" not in s


def _edit(run_dir: Path, fn: Callable[[dict[str, Any]], None]) -> None:
    path = run_dir / "records.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    for r in recs:
        fn(r)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def _rows(comp: Any) -> dict[str, dict[str, str]]:
    cols = table_columns(comp)
    return {r[0]: dict(zip(cols, r, strict=True)) for r in table_rows(comp)}


def test_text_json_and_plot_share_one_crossover(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # two repeats of each level (alike, so the intervals are 0): a crossover only repeats can state
    base = write_run(
        tmp_path / "b",
        "baseline",
        {16: [1000.0] * 2, 32: [1000.0] * 2, 64: [1000.0] * 2},
        {16: [50.0] * 2, 32: [50.0] * 2, 64: [50.0] * 2},
    )
    mtp = write_run(
        tmp_path / "m",
        "mtp",
        {16: [1100.0] * 2, 32: [1005.0] * 2, 64: [700.0] * 2},
        {16: [60.0] * 2, 32: [55.0] * 2, 64: [40.0] * 2},
    )
    comp = build_comparison([load_run(base), load_run(mtp)])
    (x,) = comp.crossovers["mtp"].agg
    assert (x.at, x.inside_noise) == (32.0, True)
    assert "crossover at about C=32 (inside the noise: +0.5%)" in comp.sentences[0]
    (jx,) = to_dict(comp)["crossovers"]["mtp"]["agg"]
    assert jx["at"] == 32.0 and jx["inside_noise"] is True
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    vlines: list[float] = []
    notes: list[str] = []
    orig_v, orig_a = Axes.axvline, Axes.annotate
    monkeypatch.setattr(
        Axes, "axvline", lambda self, x=0, *a, **kw: vlines.append(x) or orig_v(self, x, *a, **kw)
    )
    monkeypatch.setattr(
        Axes, "annotate", lambda self, t, *a, **kw: notes.append(t) or orig_a(self, t, *a, **kw)
    )
    assert plot_comparison(comp, tmp_path / "p.png") is not None
    assert 32.0 in vlines and any("inside the noise" in n for n in notes)


# ---------------------------------------------------------------- F10: sentences that hold


def test_steady_sentences_say_outside_the_noise_and_quote_raw_changes() -> None:
    s = crossover_sentence("mtp", [1, 4, 16], [0.4, 5.0, 12.0], [5.0, 8.0, 0.3])
    assert s == (
        "mtp raises aggregate tok/s at every level outside the noise (+5% to +12%; C=1: +0.4%, inside the "
        "noise); per-request speed stays higher at every level outside the noise (+8% at C=4; C=16: +0.3%, "
        "inside the noise)."
    )
    assert "(0% " not in s and "0% at" not in s
    s = crossover_sentence("x", [1, 4], [Change(-3.0, 5.0), Change(-0.2)], [None, None])
    assert (
        s
        == "x leaves aggregate tok/s unchanged at every level measured (all inside the noise: -3.0% to -0.2%)."
    )


# ---------------------------------------------------------------- F3: comparability


def _pair(tmp_path: Path) -> tuple[Path, Path]:
    base = write_run(
        tmp_path / "b",
        "baseline",
        {16: 1000.0, 32: 1500.0, 64: 2000.0, 128: 2200.0},
        {16: 50.0, 32: 45.0, 64: 40.0, 128: 30.0},
    )
    mtp = write_run(
        tmp_path / "m",
        "mtp",
        {16: 1300.0, 32: 1650.0, 64: 1900.0, 128: 1600.0},
        {16: 65.0, 32: 55.0, 64: 42.0, 128: 28.0},
    )
    return base, mtp


def test_chunk_counted_tokens_make_a_level_not_comparable(tmp_path: Path) -> None:
    base, mtp = _pair(tmp_path)
    _edit(mtp, lambda r: r.update(output_tokens_source="chunks") if r["concurrency"] == 64 else None)
    comp = build_comparison([load_run(base), load_run(mtp)])
    rows = _rows(comp)
    assert rows["64"]["Δ agg mtp"] == "n/c" and rows["64"]["Δ per-req mtp"] == "n/c"
    assert rows["64"]["Δ TPOT mtp"] == "n/c"
    assert rows["32"]["Δ agg mtp"] == "+10% (1 run)"
    assert any(
        n.startswith("C=64: not comparable (n/c)")
        and "mtp counted output tokens from stream chunks for 128 of 128 requests" in n
        for n in comp.notes
    ), comp.notes
    # the crossover skips C=64 and says so
    (x,) = comp.crossovers["mtp"].agg
    assert (x.low, x.high, x.skipped, x.single_runs) == (32, 128, (64,), True)
    # single runs: the sign change is told as measured, never as a crossover
    assert (
        "aggregate tok/s changes sign between C=32 and C=128" in comp.sentences[0]
        and "crossover" not in comp.sentences[0]
    )
    assert "Not comparable, so left out of this verdict: C=64 (see the notes)." in comp.sentences[0]
    ch = to_dict(comp)["levels"][2]["changes"]["mtp"]
    assert (
        ch["comparable"] is False and ch["agg"]["pct"] is None and ch["agg"]["raw_pct"] == pytest.approx(-5.0)
    )
    assert any("stream chunks" in r for r in ch["not_comparable"])
    q = to_dict(comp)["levels"][2]["runs"]["mtp"]["quality"]
    assert q["chunk_counted"] == 128 and q["sent"] == 128


def test_failed_or_short_above_the_threshold_make_a_level_not_comparable(tmp_path: Path) -> None:
    base, mtp = _pair(tmp_path)

    def fail(r: dict[str, Any]) -> None:
        if r["concurrency"] == 32 and r["seq"] < 5:  # 5 of 64: 7.8% > 5%
            r.update(status="failed", reason="HTTP 500")
        if r["concurrency"] == 16 and r["seq"] < 1:  # 1 of 32: 3.1%: noted only
            r.update(status="short", reason="no [DONE]")

    _edit(mtp, fail)
    comp = build_comparison([load_run(base), load_run(mtp)])
    rows = _rows(comp)
    assert rows["32"]["Δ agg mtp"] == "n/c"
    assert rows["16"]["Δ agg mtp"] == "+30% (1 run)"
    assert any(
        n.startswith("C=32: not comparable (n/c)") and "mtp: 5 of 64 requests failed or short (7.8%)" in n
        for n in comp.notes
    ), comp.notes
    assert any(n.startswith("C=16: mtp: 1 of 32 requests failed or short (3.1%)") for n in comp.notes), (
        comp.notes
    )


def test_different_requested_lengths_and_prompt_material(tmp_path: Path) -> None:
    base, mtp = _pair(tmp_path)
    _edit(
        mtp,
        lambda r: (
            r.update(requested_output_tokens=500, output_tokens=500) if r["concurrency"] == 128 else None
        ),
    )
    comp = build_comparison([load_run(base), load_run(mtp)])
    assert _rows(comp)["128"]["Δ agg mtp"] == "n/c"
    assert any("requested output tokens differ (baseline 1000, mtp 500)" in n for n in comp.notes), comp.notes
    # prompts from a dataset vs synthetic ids: acceptance depends on the text, nothing is comparable
    for d, origin in (
        (base, "server /tokenize"),
        (mtp, "dataset sharegpt (808 prompts by vLLM's sampling rules)"),
    ):
        meta = json.loads((d / "run.json").read_text())
        meta["prompts"] = {"kind": "ids", "origin": origin, "overhead_tokens": 0, "exact": True}
        (d / "run.json").write_text(json.dumps(meta))
    comp = build_comparison([load_run(base), load_run(mtp)])
    assert all(row["Δ agg mtp"] == "n/c" for row in _rows(comp).values())
    assert any(
        n.startswith("the runs' prompts differ (baseline ids from server /tokenize; mtp ids from dataset")
        for n in comp.notes
    ), comp.notes
    # a different synthetic origin is said, not suppressed
    meta = json.loads((mtp / "run.json").read_text())
    meta["prompts"]["origin"] = "tokenizer Qwen/Qwen3"
    (mtp / "run.json").write_text(json.dumps(meta))
    comp = build_comparison([load_run(base), load_run(mtp)])
    assert _rows(comp)["16"]["Δ agg mtp"] == "+30% (1 run)"
    assert any(n.startswith("the runs' prompts differ") for n in comp.notes)
