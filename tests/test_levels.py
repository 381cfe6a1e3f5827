"""specload.sweep.levels.SweepController: every transition, driven by a fake clock and fake records."""

from __future__ import annotations

import msgspec
import pytest

from specload.core.records import FAILED, OK, PHASE_MEASURE, PHASE_WARMUP, SHORT, RequestRecord, make_record
from specload.sweep.levels import (
    DONE,
    DRAINING,
    MEASURE,
    RAMPING,
    WARMUP,
    Grant,
    LevelPlan,
    SweepController,
    SweepState,
    plan_levels,
)
from specload.workload.config import Scenario


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def rec(
    g: Grant,
    status: str = OK,
    tokens: int = 10,
    t_send: float = 0.0,
    t_end: float = 1.0,
    level: int | None = None,
) -> RequestRecord:
    return make_record(
        t_send=t_send,
        t_first=None,
        t_last=None,
        t_end=t_end,
        output_tokens=tokens,
        level=g.level if level is None else level,
        concurrency=g.concurrency,
        phase=g.phase,
        seq=g.seq,
        backend="openai",
        status=status,
        reason=None,
        http_status=200,
        output_tokens_source="usage",
        prompt_tokens=None,
        requested_output_tokens=g.max_tokens,
        requested_prompt_tokens=1,
        chunks=tokens,
        itl_max_s=None,
        spec_verify_ct=None,
        worker="local",
        repeat=g.repeat,
    )


def ctrl(sc: Scenario, clock: Clock | None = None) -> tuple[SweepController, Clock]:
    clock = clock or Clock()
    return SweepController(plan_levels(sc), sc.pause_s, sc.level_timeout_s, clock=clock), clock


def grants(c: SweepController) -> list[Grant]:
    out = []
    while (g := c.grant()) is not None:
        out.append(g)
        assert len(out) < 10_000
    return out


# plans -----------------------------------------------------------------------------------------------


def test_plan_levels_reference() -> None:
    plans = plan_levels(Scenario())
    assert [p.concurrency for p in plans] == [1, 4, 16, 32, 64, 128]
    assert [p.budget for p in plans] == [4, 8, 32, 64, 128, 256]
    assert [p.index for p in plans] == list(range(6))
    assert all(p.repeat == 0 and p.warmup == 0 and p.duration_s is None for p in plans)


def test_plan_levels_repeat_expands_each_level_in_place() -> None:
    sc = Scenario(levels=[1, 4], repeat=3, warmup_requests=2, output_tokens=50, warmup_output_tokens=5)
    plans = plan_levels(sc)
    assert [(p.index, p.concurrency, p.repeat) for p in plans] == [
        (0, 1, 0),
        (1, 1, 1),
        (2, 1, 2),
        (3, 4, 0),
        (4, 4, 1),
        (5, 4, 2),
    ]
    assert all(p.warmup == 2 and p.warmup_tokens == 5 and p.output_tokens == 50 for p in plans)


def test_plan_levels_duration_mode() -> None:
    plans = plan_levels(Scenario(levels=[2], duration_s=30.0))
    assert plans[0].budget is None and plans[0].duration_s == 30.0


# a budget level --------------------------------------------------------------------------------------


def test_pending_level_wants_no_users_until_first_tick() -> None:
    c, _ = ctrl(Scenario(levels=[4]))
    assert c.desired_users() == 0
    assert c.grant() is None
    assert c.tick(0) == ["start"]
    assert c.desired_users() == 4
    assert c.levels[0].phase == RAMPING


def test_ramping_grants_nothing_until_all_users_are_there() -> None:
    c, clock = ctrl(Scenario(levels=[4], requests=3))
    c.tick(0)
    for users in (1, 2, 3):
        clock.t += 1
        assert c.tick(users) == []
        assert c.levels[0].phase == RAMPING
        assert c.grant() is None
        assert c.state().open is False
    clock.t += 1
    assert c.tick(4) == [MEASURE]
    assert c.levels[0].t_measure_start == clock.t
    assert c.state().open is True


def test_budget_level_grants_exactly_budget_then_finishes_on_last_record() -> None:
    c, clock = ctrl(Scenario(levels=[2], output_tokens=77))  # budget(2) = 4
    c.tick(2)
    gs = grants(c)
    assert len(gs) == 4
    assert [g.seq for g in gs] == [0, 1, 2, 3]
    assert all(g.phase == PHASE_MEASURE and g.max_tokens == 77 and g.concurrency == 2 for g in gs)
    assert c.levels[0].phase == DRAINING
    assert c.state().open is False
    assert c.levels[0].in_flight == 4
    for g in gs[:3]:
        assert c.receive(rec(g)) == []
        assert c.tick(2) == []
        assert not c.finished
    clock.t += 5
    assert c.receive(rec(gs[3])) == ["done", "finished"]
    assert c.finished and c.outcome == "completed"
    lv = c.levels[0]
    assert (lv.phase, lv.status, lv.t_end) == (DONE, "completed", clock.t)
    assert (lv.granted, lv.received, lv.ok) == (4, 4, 4)
    assert c.state() == SweepState(finished=True)
    assert c.grant() is None


def test_next_level_starts_after_previous_is_done() -> None:
    c, clock = ctrl(Scenario(levels=[1, 4]))
    c.tick(1)
    gs = grants(c)
    assert len(gs) == 4
    for g in gs:
        c.receive(rec(g))
    assert c.cursor == 1 and not c.finished
    assert c.desired_users() == 0  # pending: the next level has not started
    assert c.tick(1) == ["start"]
    assert c.desired_users() == 4
    assert c.grant() is None  # ramping with one user
    assert c.tick(4) == [MEASURE]
    gs = grants(c)
    assert len(gs) == 8
    assert all(g.level == 1 and g.concurrency == 4 for g in gs)


def test_records_are_counted_by_status() -> None:
    c, _ = ctrl(Scenario(levels=[1], requests=3))
    c.tick(1)
    g1, g2, g3 = grants(c)
    c.receive(rec(g1, OK, 10, t_send=100.0, t_end=101.0))
    c.receive(rec(g2, SHORT, 4, t_send=99.5, t_end=102.0))
    c.receive(rec(g3, FAILED, 0, t_send=100.5, t_end=100.6))
    lv = c.levels[0]
    assert (lv.ok, lv.short, lv.failed, lv.tokens) == (1, 1, 1, 14)
    assert (lv.first_send, lv.last_end) == (99.5, 102.0)
    assert lv.agg_tok_s() == pytest.approx(14 / 2.5)
    assert c.outcome == "completed"


def test_record_for_unknown_level_is_ignored() -> None:
    c, _ = ctrl(Scenario(levels=[1]))
    g = Grant(0, 1, 0, PHASE_MEASURE, 0, 10)
    assert c.receive(rec(g, level=5)) == []
    assert c.receive(rec(g, level=-1)) == []
    assert c.levels[0].received == 0


# warmup ----------------------------------------------------------------------------------------------


def test_warmup_then_measure() -> None:
    c, clock = ctrl(
        Scenario(levels=[2], requests=3, warmup_requests=2, output_tokens=100, warmup_output_tokens=7)
    )
    c.tick(2)
    assert c.levels[0].phase == WARMUP
    assert c.state().phase == WARMUP and c.state().open is True
    w = grants(c)
    assert [(g.phase, g.seq, g.max_tokens) for g in w] == [(PHASE_WARMUP, 0, 7), (PHASE_WARMUP, 1, 7)]
    # All warmup tickets out, none back: closed, and measuring has not started.
    assert c.state().open is False
    assert c.levels[0].t_measure_start is None
    assert c.receive(rec(w[0])) == []
    assert c.grant() is None
    clock.t += 3
    assert c.receive(rec(w[1])) == [MEASURE]
    assert c.levels[0].t_measure_start == clock.t
    m = grants(c)
    assert [(g.phase, g.seq, g.max_tokens) for g in m] == [(PHASE_MEASURE, i, 100) for i in range(3)]
    lv = c.levels[0]
    assert (lv.granted_warmup, lv.received_warmup, lv.granted) == (2, 2, 3)
    # Warmup records count nowhere in the measured tallies.
    assert (lv.received, lv.ok, lv.tokens) == (0, 0, 0)


def test_failed_warmup_does_not_abort() -> None:
    c, _ = ctrl(Scenario(levels=[1], requests=1, warmup_requests=1))
    c.tick(1)
    (w,) = grants(c)
    c.receive(rec(w, FAILED))
    (m,) = grants(c)
    assert c.receive(rec(m, OK)) == ["done", "finished"]
    assert c.outcome == "completed"


# duration mode ---------------------------------------------------------------------------------------


def test_duration_level_closes_after_duration_and_drains() -> None:
    c, clock = ctrl(Scenario(levels=[2], duration_s=10.0))
    c.tick(2)
    t0 = clock.t
    gs = [c.grant() for _ in range(25)]  # no budget: as many as asked for
    assert all(g is not None for g in gs)
    clock.t = t0 + 9.9
    assert c.tick(2) == []
    assert c.state().open is True
    clock.t = t0 + 10.0
    assert c.tick(2) == [DRAINING]
    assert c.grant() is None
    assert c.state().open is False
    for g in gs[:-1]:
        c.receive(rec(g))
    assert not c.finished
    assert c.receive(rec(gs[-1])) == ["done", "finished"]
    assert c.levels[0].granted == c.levels[0].received == 25


def test_duration_level_with_nothing_in_flight_finishes_on_tick() -> None:
    c, clock = ctrl(Scenario(levels=[1], duration_s=1.0))
    c.tick(1)
    g = c.grant()
    c.receive(rec(g))
    clock.t += 1.0
    assert c.tick(1) == [DRAINING, "done", "finished"]


# pause, give back, timeout, abort ----------------------------------------------------------------------


def test_pause_delays_next_level_start() -> None:
    c, clock = ctrl(Scenario(levels=[1, 2], requests=1, pause_s=5.0))
    c.tick(1)
    (g,) = grants(c)
    c.receive(rec(g))
    t_done = clock.t
    clock.t = t_done + 4.9
    assert c.tick(2) == []
    assert c.desired_users() == 0
    assert c.grant() is None
    clock.t = t_done + 5.0
    assert c.tick(2) == ["start", MEASURE]
    assert c.levels[1].t_start == t_done + 5.0
    assert c.grant() is not None


def test_give_back_reopens_a_ticket() -> None:
    c, _ = ctrl(Scenario(levels=[2], requests=2))
    c.tick(2)
    g1, g2 = grants(c)
    assert c.levels[0].phase == DRAINING
    c.give_back(g2.level, g2.phase)
    assert c.levels[0].phase == MEASURE
    assert c.state().open is True
    g3 = c.grant()
    assert g3 is not None and g3.seq == 1  # the same seq again: seqs stay unique
    assert c.grant() is None
    c.receive(rec(g1))
    assert c.receive(rec(g3)) == ["done", "finished"]
    assert c.levels[0].received == 2


def test_give_back_warmup_ticket() -> None:
    c, _ = ctrl(Scenario(levels=[1], requests=1, warmup_requests=1))
    c.tick(1)
    (w,) = grants(c)
    c.give_back(w.level, w.phase)
    assert c.levels[0].phase == WARMUP
    w2 = c.grant()
    assert w2 is not None and w2.phase == PHASE_WARMUP and w2.seq == 0


def test_level_timeout_aborts_with_incomplete_status() -> None:
    c, clock = ctrl(Scenario(levels=[1, 4], requests=2, level_timeout_s=60.0))
    c.tick(1)
    g1, _g2 = grants(c)
    c.receive(rec(g1))
    clock.t += 60.0
    assert c.tick(1) == []  # not yet: strictly longer than the timeout
    clock.t += 0.5
    assert c.tick(1) == ["timeout"]
    assert c.finished and c.outcome == "aborted"
    lv = c.levels[0]
    assert lv.status == "incomplete"
    assert lv.t_end == clock.t
    assert "timed out after 60 s with 1 requests in flight" in lv.note
    assert c.abort_reason == lv.note
    assert c.levels[1].status == "pending"
    assert c.grant() is None
    assert c.state().finished is True


def test_every_measured_request_failed_aborts_sweep() -> None:
    c, _ = ctrl(Scenario(levels=[1, 4], requests=2))
    c.tick(1)
    g1, g2 = grants(c)
    c.receive(rec(g1, FAILED, 0))
    assert c.receive(rec(g2, FAILED, 0)) == ["done", "abort"]
    assert c.finished and c.outcome == "aborted"
    assert c.abort_reason == "every measured request of level C=1 failed"
    assert c.levels[0].status == "completed"
    assert c.levels[1].status == "pending"
    assert c.current is None


def refused(g: Grant) -> RequestRecord:
    r = rec(g, FAILED, 0)
    r.reason, r.http_status = "connection refused", None
    return r


def test_a_refused_connection_holds_new_tickets_until_the_server_is_back() -> None:
    c, clock = ctrl(Scenario(levels=[2], requests=6))
    c.tick(2)
    g1, g2 = c.grant(), c.grant()
    assert g1 and g2
    assert c.receive(refused(g1)) == ["outage"]
    assert c.outage_since == clock.t and not c.is_open and not c.state().open
    assert c.grant() is None  # a restarting server is not fed a budget's worth of refusals
    assert c.receive(refused(g2)) == []  # the same outage
    clock.t += 0.4
    assert c.tick(2) == []  # within --outage-timeout: waiting
    assert c.resume() == ["resumed"] and c.resume() == []
    lv = c.levels[0]
    assert c.is_open and lv.refused == 2 and lv.failed == 2 and lv.outage_s == pytest.approx(0.4)
    assert lv.note == "the server refused connections for 0.40 s; 2 measured request(s) refused"
    rest = grants(c)
    assert len(rest) == 4  # the budget is exact: refused requests were measured (as failed)
    for g in rest:
        c.receive(rec(g))
    assert c.finished and c.outcome == "completed"
    assert lv.meta().refused == 2 and lv.meta().outage_s == 0.4


def test_a_server_away_longer_than_the_outage_timeout_stops_the_sweep() -> None:
    c, clock = ctrl(Scenario(levels=[1], requests=5))
    c.outage_timeout_s = 3.0
    c.tick(1)
    c.receive(refused(c.grant()))
    clock.t += 3.0
    assert c.tick(1) == []
    clock.t += 0.1
    assert c.tick(1) == ["abort"]
    assert c.finished and c.outcome == "aborted"
    assert (
        c.abort_reason
        == "the server refused connections for 3.1 s (--outage-timeout 3); last: connection refused"
    )


def test_refusals_do_not_trip_the_breaker_nor_abort_a_level_refused_whole() -> None:
    c, _ = ctrl(Scenario(levels=[4, 8], requests=4))
    c.tick(4)
    gs = grants(c)
    assert [c.receive(refused(g)) for g in gs][-1] == ["done"]  # all 4 refused: no "every request failed"
    assert not c.finished and c.cursor == 1 and c.outage_since is not None


def test_one_short_request_is_enough_to_go_on() -> None:
    c, _ = ctrl(Scenario(levels=[1, 4], requests=2))
    c.tick(1)
    g1, g2 = grants(c)
    c.receive(rec(g1, FAILED, 0))
    assert c.receive(rec(g2, SHORT, 3)) == ["done"]
    assert not c.finished and c.cursor == 1


def test_abort_marks_running_level_incomplete() -> None:
    c, clock = ctrl(Scenario(levels=[1, 2], requests=2))
    c.tick(1)
    grants(c)
    clock.t += 7
    c.abort("stopped by user")
    assert (c.finished, c.outcome, c.abort_reason) == (True, "aborted", "stopped by user")
    assert c.levels[0].status == "incomplete"
    assert c.levels[0].note == "stopped by user"
    assert c.levels[0].t_end == clock.t
    c.abort("again")  # a second abort changes nothing
    assert c.abort_reason == "stopped by user"


# reporting --------------------------------------------------------------------------------------------


def test_levels_meta_has_run_json_keys() -> None:
    c, clock = ctrl(Scenario(levels=[1, 4], requests=1))
    c.tick(1)
    (g,) = grants(c)
    clock.t += 2
    c.receive(rec(g))
    meta = [msgspec.to_builtins(lv) for lv in c.levels_meta()]
    assert len(meta) == 2
    required = {
        "index",
        "concurrency",
        "repeat",
        "budget",
        "warmup",
        "t_start",
        "t_measure_start",
        "t_end",
        "status",
        "granted",
        "received",
    }
    assert required <= set(meta[0])
    assert meta[0]["index"] == 0 and meta[0]["concurrency"] == 1 and meta[0]["budget"] == 1
    assert meta[0]["status"] == "completed"
    assert (meta[0]["granted"], meta[0]["received"]) == (1, 1)
    assert meta[0]["t_end"] - meta[0]["t_start"] == 2
    assert meta[1]["status"] == "pending" and meta[1]["t_start"] is None


def test_state_reports_level_and_open_flag() -> None:
    c, _ = ctrl(Scenario(levels=[3], repeat=2, requests=1))
    c.tick(0)
    st = c.state()
    assert st == SweepState(level=0, concurrency=3, repeat=0, phase=RAMPING, open=False, finished=False)
    c.tick(3)
    assert c.state().open is True and c.is_open
    (g,) = grants(c)
    assert c.state().open is False
    c.receive(rec(g))
    c.tick(3)
    st = c.state()
    assert (st.level, st.repeat, st.open) == (1, 1, True)


def test_controller_with_no_levels_is_inert() -> None:
    c = SweepController([], clock=Clock())
    assert c.current is None
    assert c.tick(5) == []
    assert c.grant() is None


def test_level_plan_is_frozen() -> None:
    p = LevelPlan(0, 1, 0, 4, 0, None, 10, 10)
    with pytest.raises(AttributeError):
        p.budget = 5  # type: ignore[misc]
