"""specload.core.slo: parsing --slo, the per-request rule, the per-level verdict, goodput and the noise tests."""

from __future__ import annotations

import math
import subprocess
from typing import Any

import pytest

from specload.analysis.metrics import PERCENTILES
from specload.core import histogram
from specload.core.records import FAILED, OK, SHORT
from specload.core.slo import (
    PERCENTILES as SLO_PERCENTILES,
)
from specload.core.slo import (
    Slo,
    SloError,
    SloTally,
    binomial_tails,
    count_inside_noise,
    parse_slo,
    requests_to_settle,
)
from specload.core.stats import percentile
from specload.workload.config import Scenario, ScenarioError, apply_overrides
from tests.conftest import specload_cmd
from tests.fixtures.slorows import request, tally

# ---------------------------------------------------------------- parsing


def test_parse_every_metric_stat_and_unit() -> None:
    slo = parse_slo("ttft_p99=2s, TPOT_P50=50ms,itl_p99.9=0.2s,e2e_mean=60s")
    assert [(t.metric, t.q, t.threshold_s) for t in slo.targets] == [
        ("ttft", 99.0, 2.0),
        ("tpot", 50.0, 0.05),
        ("itl", 99.9, 0.2),
        ("e2e", None, 60.0),
    ]
    # canonical: what run.json keeps
    assert slo.text == "ttft_p99=2s,tpot_p50=50ms,itl_p99.9=0.2s,e2e_mean=60s"
    assert [t.key for t in slo.targets] == ["ttft_p99", "tpot_p50", "itl_p99.9", "e2e_mean"]
    assert [t.label for t in slo.targets] == ["TTFT p99", "TPOT p50", "ITL p99.9", "E2E mean"]
    assert parse_slo(slo.text) == slo
    assert parse_slo("ttft_p90=.5s").targets[0].threshold_s == 0.5


def test_the_slo_percentiles_are_the_reports() -> None:
    # slo.py cannot import metrics (metrics imports it): the two lists must stay the same.
    assert SLO_PERCENTILES == PERCENTILES


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("ttft_p98=2s", "p98 is not a percentile the report gives"),
        ("ttft_p99=2", "a number with its unit"),
        ("ttft_p99=2min", "a number with its unit"),
        ("ttft_p99=0ms", "above 0"),
        ("goodput_p99=2s", "is not METRIC_STAT=DURATION"),
        ("ttft=2s", "is not METRIC_STAT=DURATION"),
        ("ttft_p99", "is not METRIC_STAT=DURATION"),
        ("ttft_p99=2s,ttft_p99=1s", "given twice"),
        ("", "expected METRIC_STAT=DURATION"),
        (" , ", "expected METRIC_STAT=DURATION"),
    ],
)
def test_parse_errors_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(SloError, match=says):
        parse_slo(text)


def test_scenario_field_validates_and_names_the_field() -> None:
    sc = apply_overrides(Scenario(), {"slo": "TTFT_p99=2s,tpot_p50=50ms"}, "flag --slo")
    assert sc.slo == "ttft_p99=2s,tpot_p50=50ms"
    assert apply_overrides(Scenario(), {"slo": ""}).slo is None  # the web form's empty box: no SLO
    with pytest.raises(ScenarioError, match=r"flag --slo: field 'slo': 'ttft_p98=2s': p98"):
        apply_overrides(Scenario(), {"slo": "ttft_p98=2s"}, "flag --slo")
    with pytest.raises(ScenarioError, match="field 'slo'"):
        apply_overrides(Scenario(), {"slo": 5}, "x.toml")


def test_bad_slo_flag_exits_2_before_any_traffic() -> None:
    # Port 1 is never a server: the flag must be refused before anyone is asked.
    out = subprocess.run(
        specload_cmd("sweep", "--host", "http://127.0.0.1:1", "--slo", "ttft_p99=2"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "field 'slo'" in out.stderr and "ms or s" in out.stderr
    out = subprocess.run(
        specload_cmd("capacity", "--host", "http://127.0.0.1:1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "needs an SLO" in out.stderr, out.stderr
    for flags, says in (
        (("--levels", "1,2"), "picks its own levels"),
        (("--repeat", "2"), "probes each level once"),
        (("--start", "0"), "0 < minimum <= start"),
    ):
        out = subprocess.run(
            specload_cmd("capacity", "--host", "http://127.0.0.1:1", "--slo", "ttft_p99=1s", *flags),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2 and says in out.stderr, (flags, out.stderr)


# ---------------------------------------------------------------- per request


def _hist(gaps_s: list[float]) -> list[list[int]]:
    h: dict[int, int] = {}
    for g in gaps_s:
        b = histogram.bin_of(g)
        h[b] = h.get(b, 0) + 1
    return histogram.to_pairs(h)


def meets(slo: Slo, status: str, ttft: float | None, tpot: float | None, e2e: float, itl: Any) -> bool:
    """Whether the SLO tally counts one request as good."""
    return tally(slo, [request(status, 0.0, 1.0, 10, ttft, tpot, e2e, itl)]).result().good == 1


def test_a_request_meets_the_slo_when_each_own_value_is_within_every_threshold() -> None:
    slo = parse_slo("ttft_p99=2s,tpot_p50=50ms")
    assert meets(slo, OK, 1.9, 0.049, 30.0, None)
    assert meets(slo, OK, 2.0, 0.05, 30.0, None)  # within = at most (vLLM's and AIPerf's <=)
    assert not meets(slo, OK, 2.1, 0.01, 30.0, None)  # one target missed is enough
    assert not meets(slo, OK, 1.0, 0.051, 30.0, None)
    assert not meets(slo, OK, 1.0, None, 30.0, None)  # no value (a one-token reply): not shown to meet it
    assert not meets(slo, FAILED, 1.0, 0.01, 30.0, None)
    assert not meets(slo, SHORT, 1.0, 0.01, 30.0, None)
    # ITL: the request's own gaps, at the target's percentile (p50 of 8 gaps of 10 ms and 2 of 300 ms).
    gaps = _hist([0.010] * 8 + [0.300] * 2)
    assert meets(parse_slo("itl_p50=20ms"), OK, 1.0, 0.01, 3.0, gaps)
    assert not meets(parse_slo("itl_p90=20ms"), OK, 1.0, 0.01, 3.0, gaps)
    assert not meets(parse_slo("itl_mean=50ms"), OK, 1.0, 0.01, 3.0, gaps)  # mean 68 ms
    assert not meets(parse_slo("itl_p50=20ms"), OK, 1.0, 0.01, 3.0, None)  # no gaps: no value


# ---------------------------------------------------------------- per level


def _tally(slo_text: str, rows: list[tuple[str, float, float, float, int]], wall: float = 10.0) -> SloTally:
    """rows: (status, ttft, tpot, e2e, output tokens); sends spread over [0, wall)."""
    t = tally(
        parse_slo(slo_text),
        [
            request(status, wall * i / len(rows), wall * i / len(rows) + e2e, n, ttft, tpot, e2e)
            for i, (status, ttft, tpot, e2e, n) in enumerate(rows)
        ],
    )
    t.last_end = wall  # the level's last end
    return t


def test_level_figures_goodput_and_verdict() -> None:
    # 10 requests: TTFT 0.1..1.0 s, TPOT 40 ms but the last two 60 ms, 100 tokens each.
    rows = [(OK, 0.1 * (i + 1), 0.060 if i >= 8 else 0.040, 5.0, 100) for i in range(10)]
    r = _tally("ttft_p90=1s,tpot_p50=50ms", rows).result()
    assert (r.sent, r.good, r.good_tokens) == (10, 8, 800)
    assert r.good_share == pytest.approx(0.8)
    assert r.wall_s == pytest.approx(10.0)
    assert r.goodput_req_s == pytest.approx(0.8) and r.goodput_tok_s == pytest.approx(80.0)
    ttft, tpot = r.targets
    # The level's statistic is the report's (numpy's linear percentile) when every request succeeded.
    assert ttft.value_s == pytest.approx(percentile([0.1 * (i + 1) for i in range(10)], 90))
    assert ttft.met and ttft.over == 0
    assert tpot.value_s == pytest.approx(0.040) and tpot.met and tpot.over == 2
    assert r.met is True and r.failed_targets == ()
    # Level met (each statistic within), yet 2 of 10 requests were not good: the two are different questions.
    assert r.good < r.sent


def test_failed_requests_count_as_infinitely_slow() -> None:
    ok = [(OK, 0.1, 0.01, 1.0, 10)] * 97
    # 3 failures of 100: p99 touches them, p90 does not; a mean cannot be had.
    r = _tally("ttft_p99=1s,ttft_p90=1s,ttft_mean=1s", ok + [(FAILED, 0.0, 0.0, 0.5, 0)] * 3).result()
    p99, p90, mean = r.targets
    assert math.isinf(p99.value_s) and not p99.met and p99.over == 3
    assert p90.value_s == pytest.approx(0.1) and p90.met
    assert math.isinf(mean.value_s) and not mean.met
    assert r.met is False and r.good == 97
    assert r.to_json()["targets"][0]["value_s"] is None and r.to_json()["targets"][0]["unbounded"] is True


def test_missing_values_are_counted_and_miss() -> None:
    one_token = request(OK, 0.0, 1.0, 1, 0.1, None, 1.0)  # a one-token reply has no TPOT
    r = tally(parse_slo("tpot_p50=50ms"), [one_token, request(OK, 0.0, 1.0, 100, 0.1, 0.01, 1.0)]).result()
    assert r.good == 1 and r.targets[0].missing == 1 and r.targets[0].over == 1


def test_itl_level_value_is_the_pooled_gaps() -> None:
    slo = parse_slo("itl_p90=20ms")
    reqs = [request(OK, 0.0, 1.0, 11, 0.1, 0.01, 1.0, _hist([0.010] * 10)) for _ in range(20)]
    r = tally(slo, reqs).result()
    assert r.targets[0].value_s == pytest.approx(0.010, rel=0.01) and r.met and r.good == 20
    # A failed request adds no gaps: one in 20 is within a p90's 10 %, three are not.
    failed = request(FAILED, 0.0, 1.0, 0, None, None, 1.0)
    assert tally(slo, [*reqs, failed]).result().met
    r = tally(slo, [*reqs, failed, failed, failed]).result()
    assert not r.met and math.isinf(r.targets[0].value_s)


def test_merge_is_the_same_as_one_tally() -> None:
    rows = [(OK, 0.1 * (i + 1), 0.04, 2.0, 50) for i in range(6)] + [(FAILED, 0.0, 0.0, 1.0, 0)]
    whole = _tally("ttft_p50=0.35s", rows).result()
    a, b = _tally("ttft_p50=0.35s", rows[:3]), _tally("ttft_p50=0.35s", rows[3:])
    a.merge(b)
    merged = a.result()
    assert (merged.sent, merged.good, merged.good_tokens) == (whole.sent, whole.good, whole.good_tokens)
    assert merged.targets[0].value_s == whole.targets[0].value_s


def test_nothing_measured_has_no_verdict() -> None:
    r = SloTally(parse_slo("ttft_p99=1s")).result()
    assert r.met is None and r.good_share is None and r.goodput_req_s is None and not r.inside_noise


# ---------------------------------------------------------------- statistics and noise


def test_percentile_with_inf() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([1.0, 2.0, 3.0, math.inf], 50) == pytest.approx(2.5)
    assert percentile([1.0, 2.0, 3.0, math.inf], 99) == math.inf
    assert percentile([1.0, math.inf, math.inf], 100) == math.inf  # never nan
    assert percentile([], 50) is None


def test_binomial_tails_exact_and_approximate() -> None:
    low, high = binomial_tails(0, 16, 0.01)
    assert low == pytest.approx(0.99**16) and high == pytest.approx(1.0)
    low, high = binomial_tails(2, 10, 0.5)
    assert low == pytest.approx(56 / 1024) and high == pytest.approx(1 - 11 / 1024)
    # Above the exact range (20,000 requests), the normal approximation: at the mean about a half
    # each side, two standard deviations (2 x 43.6) above it about 97.7 % below.
    low, high = binomial_tails(2000, 40_000, 0.05)
    assert 0.49 < low < 0.52 and 0.49 < high < 0.52
    low, high = binomial_tails(2087, 40_000, 0.05)
    assert 0.97 < low < 0.985 and 0.02 < high < 0.03
    # ... and it meets the exact sum at the switch (same question at 20,000 and at 20,001 requests).
    exact, approx = binomial_tails(1020, 20_000, 0.05)[0], binomial_tails(1020, 20_001, 0.05)[0]
    assert approx == pytest.approx(exact, abs=0.01)


def test_inside_the_noise_is_a_binomial_test() -> None:
    # p99 from 16 requests, none over: a server whose p99 is exactly the threshold gives that 85 % of the time.
    assert count_inside_noise(0, 16, 99)
    # 368 requests with none over settle a p99 pass (0.99^368 < 2.5 %); 367 do not quite.
    assert requests_to_settle(99) == 368 and requests_to_settle(90) == 36 and requests_to_settle(50) == 6
    assert not count_inside_noise(0, 368, 99) and count_inside_noise(0, 367, 99)
    # p50 with 80 of 100 over: far outside; 55 of 100: inside.
    assert not count_inside_noise(80, 100, 50) and count_inside_noise(55, 100, 50)


def test_level_noise_flags() -> None:
    near = [(OK, 0.1, 0.049 if i % 2 else 0.051, 1.0, 10) for i in range(20)]  # TPOT p50 right at 50 ms
    r = _tally("tpot_p50=50ms", near).result()
    assert r.targets[0].inside_noise and r.inside_noise
    far = [(OK, 0.1, 0.080, 1.0, 10)] * 40
    r = _tally("tpot_p50=50ms", far).result()
    assert not r.met and not r.inside_noise


def test_the_slo_columns_are_a_set_of_columns() -> None:
    from specload.present.tableview import parse_columns

    assert parse_columns("slo") == {"rate", "c", "slo_met", "good_pct", "goodput_tok_s", "goodput_req_s"}
