"""specload.core.clocks: a worker's clock offset from ping round trips (NTP's estimate)."""

from __future__ import annotations

import pytest

from specload.core.clocks import ClockSample, describe, estimate, is_off
from specload.core.rundir import ClientClock


def test_the_tightest_round_trip_wins() -> None:
    # The worker is 250 ms ahead; two pings were delayed on the way back, one on the way out.
    samples = [
        ClockSample(sent=100.000, remote=100.2505, received=100.001),  # rtt 1 ms: offset 250.0 ms
        ClockSample(sent=101.000, remote=101.2505, received=101.030),  # slow return: offset 235.5 ms
        ClockSample(sent=102.000, remote=102.2800, received=102.031),  # slow way out: offset 264.5 ms
    ]
    clock = estimate("w1", samples, 103.0)
    assert clock is not None
    assert clock.offset_ms == pytest.approx(250.0) and clock.rtt_ms == pytest.approx(1.0)
    assert (clock.worker, clock.samples, clock.measured_at) == ("w1", 3, 103.0)


def test_no_usable_answer_gives_no_estimate() -> None:
    assert estimate("w", [], 0.0) is None
    assert estimate("w", [ClockSample(5.0, 5.0, 4.0)], 0.0) is None  # answered before it was asked: broken


@pytest.mark.parametrize(
    ("offset_ms", "rtt_ms", "off"),
    [(0.3, 0.5, False), (-4.9, 0.2, False), (6.0, 0.5, True), (-250.0, 1.0, True), (6.0, 4.0, False)],
)
def test_is_off_counts_the_round_trips_uncertainty(offset_ms: float, rtt_ms: float, off: bool) -> None:
    assert is_off(ClientClock("w", offset_ms, rtt_ms)) is off


def test_describe_says_which_way() -> None:
    assert (
        describe(ClientClock("w1", 250.04, 0.6))
        == "worker w1's clock is 250.0 ms ahead of the master's (±0.3 ms)"
    )
    assert (
        describe(ClientClock("w2", -12.0, 2.0))
        == "worker w2's clock is 12.0 ms behind the master's (±1.0 ms)"
    )
