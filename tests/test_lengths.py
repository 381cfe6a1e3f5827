"""specload.workload.lengths: the length distribution syntax, its bounds and its draws' statistics."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from specload.workload.lengths import LengthDist, LengthError, expected_mean, parse_dist


def draws(d: LengthDist, n: int, fixed: int = 100, seed: int = 1) -> list[int]:
    rng = random.Random(seed)
    return [d.draw(rng.random(), rng.random(), fixed) for _ in range(n)]


@pytest.mark.parametrize(
    ("spec", "canonical"),
    [
        ("fixed", "fixed"),
        (" FIXED ", "fixed"),
        ("dataset", "dataset"),
        ("uniform:500:1500", "uniform:500:1500"),
        ("uniform: 7 : 7", "uniform:7:7"),
        ("normal:mean=300,sd=50", "normal:mean=300,sd=50"),
        ("normal:sd=50, mean=300, max=400, min=10", "normal:mean=300,sd=50,min=10,max=400"),
        ("lognormal:mean=300,sigma=0.5,min=16,max=2048", "lognormal:mean=300,sigma=0.5,min=16,max=2048"),
        ("lognormal:median=200,sigma=1", "lognormal:median=200,sigma=1"),
    ],
)
def test_specs_parse_to_a_canonical_spelling(spec: str, canonical: str) -> None:
    d = parse_dist(spec)
    assert d.text == canonical
    assert parse_dist(d.text) == d  # the canonical spelling means the same


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("", "expected one of"),
        ("poisson:3", "expected one of"),
        ("fixed:5", "takes no parameters"),
        ("uniform:5", "uniform:MIN:MAX"),
        ("uniform:0:5", "1 <= MIN <= MAX"),
        ("uniform:9:5", "1 <= MIN <= MAX"),
        ("uniform:a:5", "MIN must be an integer"),
        ("normal:mean=5", "needs mean= and sd="),
        ("normal:mean=5,sd=-1", "sd must be >= 0"),
        ("normal:mean=x,sd=1", "mean must be a number"),
        ("normal:mean=inf,sd=1", "mean must be finite"),
        ("normal:mean=5,sd=1,min=0", "min must be >= 1"),
        ("normal:mean=5,sd=1,min=10,max=5", "max must be >= min"),
        ("normal:mean=5,sd=1,foo=3", "unknown parameter 'foo'"),
        ("normal:mean=5,sd=1,sd=2", "given twice"),
        ("normal:mean=5,sd", "KEY=VALUE"),
        ("normal:mean=5;sd=1", "needs mean= and sd="),
        ("lognormal:mean=5,median=5,sigma=1", "one of mean= or median="),
        ("lognormal:mean=0,sigma=1", "mean must be > 0"),
        ("lognormal:mean=5", "needs sigma="),
    ],
)
def test_bad_specs_say_what_is_wrong(spec: str, says: str) -> None:
    with pytest.raises(LengthError, match=says):
        parse_dist(spec)


def test_fixed_and_dataset_draw_nothing() -> None:
    for spec in ("fixed", "dataset"):
        d = parse_dist(spec)
        assert d.fixed and d.draw(0.3, 0.7, 123) == 123 and d.minimum(123) == 123


def test_uniform_covers_every_value_evenly_and_nothing_else() -> None:
    d = parse_dist("uniform:10:20")
    xs = draws(d, 22_000)
    counts = {v: xs.count(v) for v in range(10, 21)}
    assert set(xs) == set(range(10, 21))
    # 2000 expected per value; sd ~43: 5 sd either way (the draw is seeded: the test is deterministic)
    assert all(abs(n - 2000) < 220 for n in counts.values()), counts
    assert d.draw(0.0, 0.0, 0) == 10 and d.draw(math.nextafter(1.0, 0.0), 0.0, 0) == 20


@pytest.mark.parametrize(
    "spec",
    [
        "normal:mean=300,sd=100,min=150,max=420",
        "lognormal:mean=300,sigma=0.5,min=16,max=2048",
        "lognormal:median=100,sigma=1.2,min=20,max=300",
        "normal:mean=5,sd=10",  # mostly clipped at min=1
    ],
)
def test_bounded_draws_stay_in_bounds_and_match_the_expected_mean(spec: str) -> None:
    d = parse_dist(spec)
    xs = draws(d, 40_000)
    assert min(xs) >= d.lo and (d.hi is None or max(xs) <= d.hi)
    mu = expected_mean(d, 0)
    se = statistics.pstdev(xs) / math.sqrt(len(xs))
    assert abs(statistics.fmean(xs) - mu) < 5 * se, (statistics.fmean(xs), mu, se)


def test_lognormal_mean_and_median_mean_what_they_say() -> None:
    by_mean = draws(parse_dist("lognormal:mean=300,sigma=0.5"), 40_000)
    assert statistics.fmean(by_mean) == pytest.approx(300, rel=0.01)
    by_median = draws(parse_dist("lognormal:median=300,sigma=0.5"), 40_000)
    assert statistics.median(by_median) == pytest.approx(300, rel=0.01)
    assert expected_mean(parse_dist("lognormal:mean=300,sigma=0.5"), 0) == pytest.approx(300, rel=1e-3)


def test_expected_mean_of_a_clipped_normal_counts_the_clipped_mass() -> None:
    # N(0, 1) clipped at 1..: P(X < 1.5) of the mass sits at 1, then n with P(n - 0.5 <= X < n + 0.5).
    d = parse_dist("normal:mean=0,sd=1")
    cdf = [0.5 * math.erfc(-(n + 0.5) / math.sqrt(2)) for n in range(1, 12)]
    by_hand = cdf[0] + sum((n + 1) * (cdf[n] - cdf[n - 1]) for n in range(1, 11))
    assert expected_mean(d, 0) == pytest.approx(by_hand, abs=1e-9)
    assert expected_mean(parse_dist("uniform:500:1500"), 0) == 1000
    assert expected_mean(parse_dist("fixed"), 77) == 77


def test_zero_spread_is_a_constant() -> None:
    assert set(draws(parse_dist("normal:mean=42,sd=0"), 100)) == {42}
    assert set(draws(parse_dist("lognormal:median=42,sigma=0"), 100)) == {42}
