"""Open-loop rate levels: the arrival schedules, the controller's grants, and real sweeps.

The integration tests run real Locust processes against the simulator with fixed timings, so the
expected latencies are known: below the simulator's running cap every TTFT is its fixed TTFT; a
request that waits for a free user (the in-flight cap) is late by a computable amount.
"""

from __future__ import annotations

import math
import statistics
import subprocess
from pathlib import Path

import pytest

from specload.analysis.metrics import LATE_S
from specload.core.records import PHASE_MEASURE, level_label, read_records
from specload.present.compare import run_compare
from specload.present.report import load_run, render_report
from specload.sweep.levels import GRANT_AHEAD_S, MEASURE, SCHEDULE_LEAD_S, SweepController, plan_levels
from specload.workload.arrivals import CONSTANT, GAMMA, POISSON, Schedule, offsets, schedule_seed
from specload.workload.config import DEFAULT_POOL, Scenario, ScenarioError, apply_overrides
from tests.conftest import run_together, specload_cmd
from tests.rundelay import RunDelay, client_lateness_s

# ---------------------------------------------------------------- schedules (pure)


def _gaps(xs: list[float]) -> list[float]:
    return [b - a for a, b in zip(xs, xs[1:], strict=False)]


def test_constant_gaps_are_exact() -> None:
    xs = offsets(4.0, 9, CONSTANT)
    assert xs[0] == 0.0
    assert all(g == pytest.approx(0.25, abs=1e-12) for g in _gaps(xs))


@pytest.mark.parametrize(
    "arrival, burstiness, cv", [(POISSON, 1.0, 1.0), (GAMMA, 0.25, 2.0), (GAMMA, 4.0, 0.5)]
)
def test_random_gaps_have_the_rate_and_the_spread(arrival: str, burstiness: float, cv: float) -> None:
    """Mean gap 1/rate; coefficient of variation 1/sqrt(burstiness) (Poisson: 1), as vLLM's gamma."""
    gaps = _gaps(offsets(8.0, 40_001, arrival, burstiness, seed=3))
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / 8.0, rel=0.03)
    assert statistics.stdev(gaps) / mean == pytest.approx(cv, rel=0.05)


def test_schedule_is_seeded_and_a_function_of_the_sequence_number() -> None:
    a, b = Schedule(5.0, POISSON, seed=7), Schedule(5.0, POISSON, seed=7)
    late_first = [b.offset(i) for i in (9, 3, 0, 5)]  # asked out of order (a ticket given back)
    assert late_first == [a.offset(i) for i in (9, 3, 0, 5)]
    assert offsets(5.0, 10, POISSON, seed=8) != offsets(5.0, 10, POISSON, seed=7)
    assert schedule_seed(0, 1, "warmup") != schedule_seed(0, 1, "measure") != schedule_seed(0, 2, "measure")
    with pytest.raises(ValueError):
        Schedule(0.0)


# ---------------------------------------------------------------- scenario fields


def test_rate_fields() -> None:
    sc = apply_overrides(Scenario(), {"rates": "0.5, 2,8", "arrival": "gamma", "burstiness": 0.5})
    assert sc.rates == [0.5, 2.0, 8.0] and sc.arrival == "gamma" and sc.burstiness == 0.5
    assert sc.rate_budget(2.0) == 60 and sc.rate_budget(0.1) == 4  # rate * 30 s, at least min_requests
    assert sc.pool() == DEFAULT_POOL
    plans = plan_levels(apply_overrides(sc, {"max_in_flight": 8, "requests": 10}))
    assert [(p.rate, p.concurrency, p.budget) for p in plans] == [(0.5, 8, 10), (2.0, 8, 10), (8.0, 8, 10)]
    assert [p.x for p in plans] == [0.5, 2.0, 8.0]
    for bad in ({"rates": "1,x"}, {"rates": "0"}, {"rates": "-2"}, {"arrival": "bursty"}, {"burstiness": 0}):
        with pytest.raises(ScenarioError, match=next(iter(bad))):
            apply_overrides(Scenario(), bad)
    assert level_label(512, 0, 2.0) == "rate2" and level_label(512, 1, 0.5) == "rate0.5.r1"


# ---------------------------------------------------------------- the controller (pure, fake clock)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _rate_controller(clock: Clock, **fields: object) -> SweepController:
    sc = apply_overrides(
        Scenario(), {"rates": "4", "arrival": "constant", "requests": 6, "max_in_flight": 3, **fields}
    )
    ctrl = SweepController(plan_levels(sc), clock=clock)
    ctrl.tick(0)
    ctrl.tick(3)  # all 3 users exist: the level opens
    return ctrl


def test_rate_tickets_are_granted_just_before_they_are_due() -> None:
    clock = Clock()
    ctrl = _rate_controller(clock)
    opened = clock.t
    assert ctrl.current is not None and ctrl.current.phase == MEASURE
    due = [opened + SCHEDULE_LEAD_S + i * 0.25 for i in range(6)]
    # The first request is due SCHEDULE_LEAD_S after the level opened: not grantable before.
    assert ctrl.wait_s() == pytest.approx(
        SCHEDULE_LEAD_S - GRANT_AHEAD_S if SCHEDULE_LEAD_S > GRANT_AHEAD_S else 0
    )
    g0 = ctrl.grant()
    assert g0 is not None and g0.rate == 4.0 and g0.delay_s == pytest.approx(due[0] - clock.t)
    assert ctrl.wait_s() == pytest.approx(due[1] - GRANT_AHEAD_S - clock.t)
    clock.t = due[1] - GRANT_AHEAD_S
    assert ctrl.wait_s() == 0.0
    g1 = ctrl.grant()
    assert g1 is not None and g1.delay_s == pytest.approx(GRANT_AHEAD_S)
    # Nobody asked for a second: the next ticket is granted late, with a negative delay.
    clock.t = due[2] + 0.5
    g2 = ctrl.grant()
    assert g2 is not None and g2.delay_s == pytest.approx(-0.5)
    # A ticket handed back keeps its due time when granted again.
    ctrl.give_back(g2.level, g2.phase)
    again = ctrl.grant()
    assert again is not None and again.seq == g2.seq and again.delay_s == pytest.approx(-0.5)


def test_concurrency_levels_never_wait() -> None:
    clock = Clock()
    ctrl = SweepController(
        plan_levels(apply_overrides(Scenario(), {"levels": "2", "requests": 4})), clock=clock
    )
    ctrl.tick(0)
    ctrl.tick(2)
    assert ctrl.wait_s() == 0.0
    g = ctrl.grant()
    assert g is not None and g.delay_s is None and g.rate is None


# ---------------------------------------------------------------- real sweeps against the simulator

TTFT_MS, ITL_MS, OUT = 100, 10, 20
E2E_S = (TTFT_MS + (OUT - 1) * ITL_MS) / 1000  # 0.29 s


def _sweep(sim, out: Path, *flags: str, sim_args: tuple[str, ...] = ()) -> Path:  # type: ignore[no-untyped-def]
    return _sweep_waited(sim, out, *flags, sim_args=sim_args)[0]


def _sweep_waited(sim, out: Path, *flags: str, sim_args: tuple[str, ...] = ()) -> tuple[Path, float]:  # type: ignore[no-untyped-def]
    """The run directory, and the seconds the simulator waited for a CPU meanwhile (tests/rundelay.py)."""
    server = sim("--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS), "--model", "m", *sim_args)
    waited = RunDelay([server.proc.pid], this_thread=False)
    res = subprocess.run(
        specload_cmd(
            "sweep",
            "--host",
            server.url,
            "--input-tokens",
            "32",
            "--output-tokens",
            str(OUT),
            "--read-timeout",
            "30",
            "--out",
            str(out),
            *flags,
        ),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run_dir,) = [d for d in out.iterdir() if d.is_dir() and not d.name.startswith("compare-")]
    return run_dir, waited.s


def test_rate_sweep_keeps_its_schedule(sim, tmp_path: Path) -> None:
    """Constant arrivals at 8 and 16 req/s: exact budgets, sends on schedule (each record's due time
    is the seeded schedule's), the server never queues, so TTFT is the simulator's. A loaded machine
    widens the TTFT bound by what the simulator waited for a CPU and the client measured of its own
    lag, and may make the client send late, which the report must then blame on the client."""
    run_dir, server_wait_s = _sweep_waited(
        sim,
        tmp_path,
        "--rates",
        "8,16",
        "--arrival",
        "constant",
        "--requests-per-level",
        "24",
        "--max-in-flight",
        "32",
        sim_args=("--max-running", "64"),
    )
    recs = [r for r in read_records(str(run_dir / "records.jsonl")) if r.phase == PHASE_MEASURE]
    run = load_run(run_dir)
    assert [(s.rate, s.sent, s.ok) for s in run.levels] == [(8.0, 24, 24), (16.0, 24, 24)]
    for s, rate in zip(run.levels, (8.0, 16.0), strict=True):
        mine = sorted((r for r in recs if r.rate == rate), key=lambda r: r.seq)
        assert all(r.t_sched is not None for r in mine)
        # Each record's due time is its slot of the seeded schedule: the grant's delay counts from
        # the moment its reply reached the user, so a process preempted in between (a loaded
        # machine) shifts that one record by a few ms. Aligned on the median, most sit within 2 ms
        # of their slot and none drifts a quarter of a gap away.
        due = [r.t_sched - i / rate for i, r in enumerate(mine)]  # type: ignore[operator]
        off = sorted(d - statistics.median(due) for d in due)
        assert sum(abs(d) <= 0.002 for d in off) >= 0.9 * len(off), off
        assert max(abs(d) for d in off) < 0.25 / rate, off
        lags = sorted(r.t_send - r.t_sched for r in mine)  # type: ignore[operator]
        # The first to the last send: a client stalled at either end (a loaded machine) stretches
        # the span by as much as its worst lateness in the level, no more.
        worst_s = client_lateness_s(run, s.index or 0, worst=True)
        # median send within 5 ms of its due time, later only by what the client measured it waited
        assert lags[len(lags) // 2] < 0.005 + worst_s, (lags, worst_s)
        span_s = (len(mine) - 1) / rate + worst_s
        # No send comes before its due time, so the last is no earlier than the last slot: the span
        # shrinks only by how late the first send was (as the client stamped it), no more.
        least_s = max(r.t_sched for r in mine) - min(r.t_send for r in mine)  # type: ignore[type-var, operator]
        most = (len(mine) - 1) / least_s * 1.05 if least_s > 0 else math.inf
        assert (len(mine) - 1) / span_s * 0.95 <= (s.send_rate or 0.0) <= most, (s.send_rate, span_s, least_s)
        late_s = server_wait_s + client_lateness_s(run, s.index or 0)
        assert TTFT_MS * 0.97 <= (s.figure("ttft_p50") or 0.0) <= TTFT_MS * 1.03 + late_s * 1e3, (
            s.figure("ttft_p50"),
            late_s,
        )
        assert s.dists["ttft_sched"].n == 24 and s.dists["e2e_sched"].n == 24
        assert s.steady_tok_s is None  # closed-loop only
        # Sends more than LATE_S after they were due: none, unless the client's own loop lagged,
        # or it waited for a CPU, that long in this level, and then the note says so.
        if worst_s < LATE_S:
            assert s.late_note is None, s.late_note
        elif s.late_note is not None:
            assert "the client sent them late" in s.late_note, s.late_note
    md = (run_dir / "report.md").read_text()
    assert "Rate (req/s)" in md and "TTFT from schedule" in md


def test_coordinated_omission_is_not_hidden(sim, tmp_path: Path) -> None:
    """20 req/s into a cap of 2 users that each take 0.29 s (about 7 req/s): most sends wait for a
    free user. Latency from the send stays 0.29 s; from the schedule it grows with the backlog,
    and the level is flagged with the reason."""
    run_dir = _sweep(
        sim,
        tmp_path,
        "--rates",
        "20",
        "--arrival",
        "constant",
        "--requests-per-level",
        "20",
        "--max-in-flight",
        "2",
        sim_args=("--max-running", "64"),
    )
    (s,) = load_run(run_dir).levels
    assert s.sent == s.ok == 20
    assert s.figure("e2e_p50") == pytest.approx(E2E_S, rel=0.05)
    # Request k is due at k/20 s and can start only when user k mod 2 is free: at (k // 2) * E2E.
    expected_lags = sorted(max(0.0, (k // 2) * E2E_S - k / 20) for k in range(20))
    assert s.late >= sum(1 for x in expected_lags if x > 0.05)
    assert s.dists["e2e_sched"].p[50.0] > s.figure("e2e_p50") + 0.5 * expected_lags[10]
    assert s.late_note is not None and "users were busy" in s.late_note
    assert "--max-in-flight" in render_report(load_run(run_dir))


def test_rate_levels_with_worker_processes_and_compare(sim, tmp_path: Path) -> None:
    """--processes 2 (a real master and two workers): exact budgets, both workers send; then two
    rate runs compared on the request-rate axis (the faster server's per-request tok/s is higher)."""

    def slow_run() -> Path:
        return _sweep(
            sim,
            tmp_path / "a",
            "--rates",
            "6,12",
            "--requests-per-level",
            "18",
            "--max-in-flight",
            "16",
            "--label",
            "slow",
            "--processes",
            "2",
            sim_args=("--max-running", "64"),
        )

    def fast_run() -> Path:
        return _sweep(
            sim,
            tmp_path / "b",
            "--rates",
            "6,12",
            "--requests-per-level",
            "18",
            "--max-in-flight",
            "16",
            "--label",
            "fast",
            sim_args=("--itl-ms", "5", "--max-running", "64"),
        )

    slow, fast = run_together(slow_run, fast_run)  # light load, mostly waiting: side by side
    run = load_run(slow)
    assert [(s.rate, s.sent, s.ok) for s in run.levels] == [(6.0, 18, 18), (12.0, 18, 18)]
    workers = {r.worker for r in run.records}
    assert len(workers) == 2 and "local" not in workers
    assert {r.seq for r in run.records if r.rate == 12.0} == set(range(18))
    result = run_compare([slow, fast], out=tmp_path / "cmp", plot=False)
    assert result.comparison.axis.rate
    assert result.comparison.levels == [6.0, 12.0]
    assert "| Req/s" in result.text or "Req/s" in result.text.splitlines()[0] or "Req/s" in result.text
    (sentence,) = result.sentences
    assert "req/s" in sentence and "C=" not in sentence
    ch = result.comparison.per_req["fast"]
    assert all(c.pct is not None and c.pct > 20 for c in ch)  # ITL 10 -> 5 ms: much faster per request
    assert math.isfinite(run.levels[0].per_req_tok_s or math.nan)


def test_arrivals_above_capacity_queue_at_the_server(sim, tmp_path: Path) -> None:
    """20 req/s into a server that runs 2 requests at once (capacity 2 / 0.29 s = 6.9 req/s): the
    client keeps to its schedule (no late sends), the server queues, and each TTFT is the FIFO
    queue's answer: request k starts at s_k = max(a_k, s_{k-2} + E2E), TTFT = s_k - a_k + TTFT.
    On a loaded machine every slip of the simulator's timing stays in the queue: the bound widens
    by all it waited for a CPU, and by the most the client could have sent late."""
    n, rate = 16, 20.0
    run_dir, server_wait_s = _sweep_waited(
        sim,
        tmp_path,
        "--rates",
        str(rate),
        "--arrival",
        "constant",
        "--requests-per-level",
        str(n),
        "--max-in-flight",
        "32",
        sim_args=("--max-running", "2"),
    )
    run = load_run(run_dir)
    (s,) = run.levels
    client_s = client_lateness_s(run, 0, worst=True)
    assert s.sent == s.ok == n and (s.late == 0 or client_s >= LATE_S), (s.late, client_s)
    starts: list[float] = []
    for k in range(n):
        a = k / rate
        starts.append(max(a, starts[k - 2] + E2E_S) if k >= 2 else a)
    ttfts = sorted(st - k / rate + TTFT_MS / 1000 for k, st in enumerate(starts))
    got = sorted(r.ttft_s for r in run.records if r.phase == PHASE_MEASURE)  # type: ignore[misc]
    assert got == pytest.approx(ttfts, abs=0.03 + server_wait_s + client_s), (server_wait_s, client_s)
