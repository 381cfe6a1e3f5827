"""specload.analysis.capacity: the search state machine on synthetic pass/fail functions (noisy ones too),
the answer read from levels, its words, and the controller hook that adds levels while a sweep runs."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from specload.analysis.capacity import (
    KIND_CONCURRENCY,
    KIND_RATE,
    Capacity,
    CapacityRecord,
    SearchSpace,
    ServerLimits,
    capacity_of,
    compare_sentence,
    describe,
    limit_reason,
)
from specload.core.records import OK, PHASE_MEASURE, RequestRecord, make_record
from specload.core.slo import LevelSlo, parse_slo
from specload.sweep.capacity import (
    BRACKETED,
    FAILS_AT_MIN,
    MEETS_AT_MAX,
    PROBE_LIMIT,
    STOPPED,
    CapacityRun,
    CapacitySearch,
    Probe,
    probe_plan,
    search_space,
)
from specload.sweep.levels import Change, LevelPlan, SweepController
from specload.workload.config import Scenario
from tests.fixtures.slorows import request, tally


def run_search(space: SearchSpace, passes: Callable[[float], bool]) -> CapacitySearch:
    s = CapacitySearch(space)
    while s.next_x is not None:
        x = s.next_x
        s.observe(Probe(x, passes(x)))
    return s


def xs(s: CapacitySearch) -> list[float]:
    return [p.x for p in s.probes]


# ---------------------------------------------------------------- the search


def test_doubling_then_bisection_on_integers() -> None:
    s = run_search(SearchSpace(start=8, maximum=512), lambda x: x <= 24)
    assert xs(s) == [8, 16, 32, 24, 28, 26, 25]
    assert (s.lo, s.hi, s.status) == (24, 25, BRACKETED)


def test_halving_when_the_start_fails() -> None:
    s = run_search(SearchSpace(start=64, maximum=512), lambda x: x <= 5)
    assert xs(s) == [64, 32, 16, 8, 4, 6, 5]
    assert (s.lo, s.hi, s.status) == (5, 6, BRACKETED)


@pytest.mark.parametrize("capacity", [1, 2, 3, 7, 8, 9, 31, 100, 511])
def test_any_capacity_is_found_exactly_in_few_probes(capacity: int) -> None:
    s = run_search(SearchSpace(start=8, maximum=512), lambda x: x <= capacity)
    assert (s.lo, s.hi, s.status) == (capacity, capacity + 1, BRACKETED)
    # Bracketing takes at most log2(512/8) + 1 probes going up (or log2(8) down), bisection
    # log2 of the bracket (at most 256 wide): the default 16 probes are enough for 1..512.
    assert len(s.probes) <= 7 + 8
    assert len(set(xs(s))) == len(s.probes)  # no level is probed twice


def test_the_ends_of_the_space() -> None:
    s = run_search(SearchSpace(start=8, maximum=100), lambda x: True)
    assert (xs(s), s.lo, s.hi, s.status) == ([8, 16, 32, 64, 100], 100, None, MEETS_AT_MAX)
    s = run_search(SearchSpace(start=8, minimum=2), lambda x: False)
    assert (xs(s), s.lo, s.hi, s.status) == ([8, 4, 2], None, 2, FAILS_AT_MIN)
    s = run_search(SearchSpace(start=8, maximum=512, max_probes=4), lambda x: x <= 24)
    assert (xs(s), s.lo, s.hi, s.status) == ([8, 16, 32, 24], 24, 32, PROBE_LIMIT)


def test_tolerance_stops_early() -> None:
    s = run_search(SearchSpace(start=16, minimum=16, maximum=32, tolerance=0.125), lambda x: x <= 22)
    assert xs(s) == [16, 32, 24, 20, 22] and (s.lo, s.hi, s.status) == (22, 24, BRACKETED)


def test_rates_are_searched_as_floats() -> None:
    space = SearchSpace(KIND_RATE, start=1.0, minimum=0.1, maximum=1000.0, tolerance=0.05)
    s = run_search(space, lambda x: x <= 7.3)
    assert s.status == BRACKETED and s.lo is not None and s.hi is not None
    assert s.lo <= 7.3 < s.hi and (s.hi - s.lo) <= 0.05 * s.lo
    assert xs(s)[:4] == [1.0, 2.0, 4.0, 8.0]


def test_a_noisy_boundary_still_gives_a_consistent_bracket() -> None:
    """The SLO passes with a probability falling from 1 to 0 between C=20 and C=28 (noise around a
    true capacity of 24). Whatever the draws, the answer is a bracket the observations support
    (every probe below lo... is consistent with lo met and hi failed), found in few probes, within
    the noisy band."""
    for seed in range(200):
        rng = random.Random(seed)

        def noisy(x: float, rng: random.Random = rng) -> bool:
            p = min(1.0, max(0.0, (28 - x) / 8))
            return rng.random() < p

        s = run_search(SearchSpace(start=8, maximum=512), noisy)
        assert s.status == BRACKETED, (seed, xs(s))
        assert s.lo is not None and s.hi == s.lo + 1
        assert 19 <= s.lo <= 28, (seed, xs(s))
        met = {p.x: p.met for p in s.probes}
        assert met[s.lo] and not met[s.hi]
        assert len(s.probes) <= 9


def test_observe_checks_its_input_and_stop() -> None:
    s = CapacitySearch(SearchSpace(start=8))
    with pytest.raises(ValueError, match="expected a probe at x=8"):
        s.observe(Probe(9, True))
    s.observe(Probe(8, True))
    s.stop()
    assert s.status == STOPPED and s.next_x is None and s.lo == 8
    with pytest.raises(ValueError, match="over"):
        s.observe(Probe(16, True))


@pytest.mark.parametrize(
    ("space", "says"),
    [
        (SearchSpace(start=0), "0 < minimum"),
        (SearchSpace(start=4, minimum=8), "minimum <= start"),
        (SearchSpace(start=2.5), "whole numbers"),
        (SearchSpace(KIND_RATE, start=1.0, minimum=0.5, tolerance=0.0), "> 0 for rates"),
        (SearchSpace(max_probes=1), "at least 2"),
        (SearchSpace("users"), "kind"),
    ],
)
def test_bad_spaces(space: SearchSpace, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        space.check()


def test_space_option_round_trip() -> None:
    sp = SearchSpace(start=8, minimum=2, maximum=64, tolerance=0.1, max_probes=9)
    assert SearchSpace.from_option(sp.to_option()) == sp
    with pytest.raises(ValueError, match="KIND:START"):
        SearchSpace.from_option("concurrency:8")


def test_probe_plan_uses_the_scenarios_budget_and_warmup() -> None:
    sc = Scenario(warmup_requests=2, output_tokens=100, warmup_output_tokens=10)
    plan = probe_plan(sc, SearchSpace(), 24, 3)
    assert plan == LevelPlan(3, 24, 0, 48, 2, None, 10, 100)
    # A rate probe: x requests/s, the scenario's arrivals, its user pool and its rate budget.
    rsc = Scenario(warmup_requests=1, rates=[4.0], arrival="constant", max_in_flight=32, rate_window_s=10.0)
    plan = probe_plan(rsc, SearchSpace(KIND_RATE, 4.0, 0.5, 64.0, 0.05), 6.5, 2)
    assert (plan.index, plan.rate, plan.arrival, plan.concurrency, plan.budget, plan.warmup) == (
        2,
        6.5,
        "constant",
        32,
        65,
        1,
    )
    assert plan.x == 6.5


def test_search_space_follows_the_scenario() -> None:
    sp = search_space(Scenario())
    assert (sp.kind, sp.start, sp.minimum, sp.maximum, sp.tolerance, sp.max_probes) == (
        "concurrency",
        8,
        1,
        512,
        0.0,
        16,
    )
    sp = search_space(Scenario(rates=[4.0]), minimum=0.5)
    assert (sp.kind, sp.start, sp.minimum, sp.tolerance) == (KIND_RATE, 4.0, 0.5, 0.05)
    assert search_space(Scenario(rates=[4.0, 8.0]), start=2).start == 2
    with pytest.raises(ValueError, match="one rate to start"):
        search_space(Scenario(rates=[4.0, 8.0]))
    with pytest.raises(ValueError, match="whole numbers"):
        search_space(Scenario(), start=2.5)


# ---------------------------------------------------------------- the answer from levels


def level(met_ttft_s: float, n: int = 400, slo: str = "ttft_p90=1s") -> LevelSlo:
    """A level of n requests whose TTFTs are all ``met_ttft_s`` (far from any noise when n is large)."""
    return tally(
        parse_slo(slo), [request(OK, i, i + 1.0, 10, met_ttft_s, 0.01, 1.0) for i in range(n)]
    ).result()


PASS, FAIL = level(0.5), level(2.0)


def test_capacity_of_levels() -> None:
    c = capacity_of([(1, PASS), (4, PASS), (16, PASS), (32, FAIL), (64, FAIL)])
    assert c is not None and (c.lo, c.hi, c.above, c.measured) == (16, 32, (), 5)
    assert not c.inside_noise
    assert describe(c) == "meets the SLO up to C=16 (met at C=16, failed at C=32); outside the noise"
    # Out of order (a capacity run's probes) gives the same.
    assert capacity_of([(32, FAIL), (1, PASS), (16, PASS)]).lo == 16  # type: ignore[union-attr]
    # A level above the first failure that met it: the levels disagree, inside the noise.
    c = capacity_of([(16, PASS), (32, FAIL), (64, PASS)])
    assert c is not None and (c.lo, c.hi, c.above) == (16, 32, (64.0,)) and c.inside_noise
    # Repeats: a concurrency met the SLO only when every repeat did.
    c = capacity_of([(16, PASS), (32, PASS), (32, FAIL)])
    assert c is not None and (c.lo, c.hi) == (16, 32)
    c = capacity_of([(1, PASS), (4, PASS)])
    assert c is not None and (c.lo, c.hi) == (4, None)
    assert "none failed: the capacity may be higher" in describe(c)
    c = capacity_of([(1, FAIL)])
    assert c is not None and (c.lo, c.hi) == (None, 1) and "does not meet the SLO at any level" in describe(c)
    assert capacity_of([(1, None)]) is None


def test_noise_at_the_boundary_is_said_with_what_would_settle_it() -> None:
    shaky = level(0.5, n=20)  # met, but 20 requests cannot show a p90 below 1 s (36 can)
    c = capacity_of([(16, shaky), (32, FAIL)])
    assert c is not None and c.inside_noise
    text = describe(c)
    assert "inside the noise: at C=16 TTFT p90 was 500 ms against 1 s with 0 of 20 requests over it" in text
    assert "it takes 36 requests with none over to tell" in text


def test_limit_reason_names_the_running_request_cap() -> None:
    c = capacity_of([(48, PASS), (49, FAIL)])
    assert c is not None
    why = limit_reason(c, ServerLimits(max_running=48, speculative_algorithm="NEXTN", queued_max=1))
    assert why == (
        "fails at C=49 on TTFT p90 2 s > 1 s: C=49 is above the server's max_running_requests (48, with "
        "NEXTN speculation), so the excess requests wait in its queue (up to 1 waiting)"
    )
    # Queued below the cap: the memory held fewer.
    why = limit_reason(c, ServerLimits(max_running=64, kv_tokens=300000, queued_max=3, running_max=40))
    assert why is not None and "queued requests below its max_running_requests (64)" in why
    assert "at most 40 running" in why and "300000" in why
    # A request rate beyond what the server runs at once: it ran its cap and queued the rest.
    r = capacity_of([(20.0, PASS), (28.0, FAIL)], KIND_RATE)
    assert r is not None
    why = limit_reason(r, ServerLimits(max_running=8, queued_max=5, running_max=8))
    assert why == (
        "fails at 28 req/s on TTFT p90 2 s > 1 s: the server ran its max_running_requests (8) at once "
        "and queued the rest (up to 5 waiting)"
    )
    # A TPOT failure is the batch slowing decoding, with the value where it still met it.
    fast = level(0.5, slo="tpot_p50=50ms")
    slow = tally(
        parse_slo("tpot_p50=50ms"), [request(OK, i, i + 1.0, 10, 0.1, 0.080, 1.0) for i in range(100)]
    ).result()
    c = capacity_of([(16, fast), (24, slow)])
    assert c is not None
    why = limit_reason(c, ServerLimits())
    assert (
        why
        == "fails at C=24 on TPOT p50 80 ms > 50 ms: decoding slows as the batch grows (TPOT p50 10 ms at C=16)"
    )


def test_compare_sentence() -> None:
    base = capacity_of([(16, PASS), (24, PASS), (25, FAIL)])
    treat = capacity_of([(16, PASS), (31, PASS), (32, FAIL)])
    assert base is not None and treat is not None
    text = compare_sentence("baseline", base, "mtp", treat, {"mtp": "fails at C=32 on TTFT p90 2 s > 1 s"})
    assert text.startswith(
        "With mtp the deployment meets the SLO up to C=31 instead of C=24 (+29%): mtp met it "
        "at C=31 and failed at C=32, baseline met it at C=24 and failed at C=25."
    )
    assert "mtp fails at C=32 on TTFT p90 2 s > 1 s." in text and "noise" not in text
    same = compare_sentence("a", base, "b", base)
    assert same.startswith("With b the deployment meets the SLO up to the same C=24")
    never = capacity_of([(16, PASS), (64, PASS)])
    assert never is not None
    text = compare_sentence("a", base, "b", never)
    assert "up to C=64 instead of C=24 (no percentage: " in text and "so its capacity may be higher" in text
    shaky = capacity_of([(16, level(0.5, n=20)), (32, FAIL)])
    assert shaky is not None
    assert "Inside the noise: b's pass at C=16 (TTFT p90)" in compare_sentence("a", base, "b", shaky)
    assert Capacity("concurrency", None, 1).lo is None


def test_compare_sentence_claims_no_change_from_coarse_levels() -> None:
    """The demo's sweep ladder (1,4,16,32,64): met at C=4 and C=16, failed at C=16 and C=32. The lower
    ends differ by +300%, but the capacities lie anywhere in 4..16 and 16..32: no percentage; the
    capacity search's brackets (12..13, 20..22) are narrow, and their change is the headline (+67%)."""
    base = capacity_of([(1, PASS), (4, PASS), (16, FAIL)])
    treat = capacity_of([(1, PASS), (4, PASS), (16, PASS), (32, FAIL)])
    assert base is not None and treat is not None
    text = compare_sentence("baseline", base, "mtp", treat)
    assert "%" not in text.split(":")[0] and "+300" not in text
    assert text.startswith("With mtp the deployment meets the SLO up to C=16 instead of C=4 (no percentage")
    searched_base = capacity_of([(8, PASS), (12, PASS), (13, FAIL)])
    searched_treat = capacity_of([(16, PASS), (20, PASS), (22, FAIL)])
    assert searched_base is not None and searched_treat is not None
    assert compare_sentence("baseline", searched_base, "mtp", searched_treat).startswith(
        "With mtp the deployment meets the SLO up to C=20 instead of C=12 (+67%)"
    )


def test_compare_sentence_claims_no_change_between_unlike_runs() -> None:
    base = capacity_of([(16, PASS), (24, PASS), (25, FAIL)])
    treat = capacity_of([(16, PASS), (31, PASS), (32, FAIL)])
    assert base is not None and treat is not None
    text = compare_sentence("a", base, "b", treat, unlike="the runs differ in output tokens (a 128, b 384)")
    assert "instead of" not in text and "%" not in text.split(". ")[0]
    assert text.startswith("b meets the SLO up to C=31; a meets the SLO up to C=24; no capacity change")
    assert "not like for like (the runs differ in output tokens (a 128, b 384))" in text


# ---------------------------------------------------------------- inside a sweep: the controller hook


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _finish_level(ctrl: SweepController, ttft_s: float) -> tuple[list[Change], list[RequestRecord]]:
    """Open the current level, send its whole budget, bring every record back."""
    lv = ctrl.current
    assert lv is not None
    changes = ctrl.tick(0) + ctrl.tick(lv.plan.concurrency)
    grants, records = [], []
    while (g := ctrl.grant()) is not None:
        grants.append(g)
    for g in grants:
        rec = make_record(
            t_send=ctrl.clock(),
            t_first=ctrl.clock() + ttft_s,
            t_last=ctrl.clock() + ttft_s + 0.1,
            t_end=ctrl.clock() + ttft_s + 0.1,
            output_tokens=10,
            level=g.level,
            concurrency=g.concurrency,
            phase=g.phase,
            seq=g.seq,
            backend="openai",
            status=OK,
            reason=None,
            http_status=200,
            output_tokens_source="usage",
            prompt_tokens=None,
            requested_output_tokens=10,
            requested_prompt_tokens=1,
            chunks=10,
            itl_max_s=None,
            spec_verify_ct=None,
            worker="local",
            repeat=g.repeat,
        )
        changes += ctrl.receive(rec)
        records.append(rec)
    return changes, records


def test_open_ended_controller_waits_for_append_or_close() -> None:
    sc = Scenario(requests=4)
    clock = Clock()
    ctrl = SweepController([probe_plan(sc, SearchSpace(), 8, 0)], clock=clock, open_ended=True)
    changes, _ = _finish_level(ctrl, 0.1)
    assert Change.DONE in changes and Change.FINISHED not in changes and not ctrl.finished
    added = ctrl.append(probe_plan(sc, SearchSpace(), 16, 99))
    assert added.index == 1 and ctrl.levels[1].plan.concurrency == 16  # the index is the controller's
    changes, _ = _finish_level(ctrl, 0.1)
    assert Change.DONE in changes and not ctrl.finished
    assert ctrl.close() == [Change.FINISHED] and ctrl.finished
    assert [m.concurrency for m in ctrl.levels_meta()] == [8, 16]
    # A closed (ordinary) controller finishes with its last level, as before.
    plain = SweepController([probe_plan(sc, SearchSpace(), 8, 0)], clock=clock)
    assert Change.FINISHED in _finish_level(plain, 0.1)[0] and plain.finished


def test_capacity_run_drives_a_controller_to_the_answer() -> None:
    """The owner's loop without Locust: records into tallies, each level done -> the next plan."""
    sc = Scenario(requests=40)
    slo = parse_slo("ttft_p90=1s")
    run = CapacityRun(SearchSpace(start=8, maximum=64), slo, sc)
    ctrl = SweepController([run.first_plan()], clock=Clock(), open_ended=True)
    lines = []
    while not ctrl.finished:
        c = ctrl.current.plan.concurrency  # type: ignore[union-attr]
        _, records = _finish_level(ctrl, 0.2 if c <= 20 else 3.0)  # the server meets the SLO up to C=20
        measured = tally(slo, [r for r in records if r.phase == PHASE_MEASURE])
        plan, line = run.level_done(ctrl.levels[ctrl.cursor - 1].plan.index, measured)
        lines.append(line)
        if plan is None:
            ctrl.close()
        else:
            ctrl.append(plan)
    assert [lv.plan.concurrency for lv in ctrl.levels] == [8, 16, 32, 24, 20, 22, 21]
    assert (run.search.lo, run.search.hi, run.search.status) == (20, 21, BRACKETED)
    assert lines[0].startswith("capacity: C=8 met the SLO") and "next C=16 (bracketing: doubling)" in lines[0]
    assert "next C=24 (bisecting C=16..C=32)" in lines[2]
    assert "search bracketed: meets the SLO up to C=20 (met at C=20, failed at C=21)" in lines[-1]
    doc = run.to_json()
    assert doc["status"] == BRACKETED and [p["x"] for p in doc["probes"]] == [8, 16, 32, 24, 20, 22, 21]
    assert doc["answer"]["lo"] == 20 and doc["probes"][0]["slo"]["good"] == 40
    assert not math.isnan(doc["probes"][2]["slo"]["targets"][0]["value_s"])
    assert set(doc["space"]) == {"kind", "start", "minimum", "maximum", "tolerance", "max_probes"}
    assert set(doc["probes"][0]) == {"x", "level", "met", "inside_noise", "note", "slo"}
    back = CapacityRecord.from_json(doc)
    assert back is not None and back.space == run.space and back.status == BRACKETED
    assert [p["x"] for p in back.probes] == [8, 16, 32, 24, 20, 22, 21]


def test_an_older_capacity_json_still_reads() -> None:
    """A capacity.json from before the space had its kind, tolerance and probe budget reads with
    their defaults (a concurrency search, 0, 16); what is no capacity.json reads as None."""
    older = {
        "slo": "ttft_p99<=1s",
        "space": {"start": 8, "minimum": 1.0, "maximum": 64},
        "probes": [{"x": 8}],
    }
    assert CapacityRecord.from_json(older) == CapacityRecord(
        "ttft_p99<=1s", SearchSpace(KIND_CONCURRENCY, 8, 1, 64, 0.0, 16), None, [{"x": 8}]
    )
    assert CapacityRecord.from_json({}) == CapacityRecord()
    for bad in ([1], None, {"space": "8:1:64"}, {"probes": 3}):
        assert CapacityRecord.from_json(bad) is None
