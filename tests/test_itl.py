"""Inter-token gaps kept per request as a log-binned histogram, and the per-token figures that must
not be computed from what is not a token count (metrics audit F5, F6, F7). The streaming side of
the same is in test_stream.py."""

from __future__ import annotations

import math
import random

import pytest

from specload.core import histogram as h
from specload.core.records import derived


def exact_rank(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    return ys[max(1, math.ceil(q / 100 * len(ys))) - 1]


@pytest.mark.parametrize("seed", range(5))
def test_histogram_percentiles_are_within_the_stated_error(seed: int) -> None:
    rnd = random.Random(seed)
    gaps = [rnd.lognormvariate(math.log(0.005), 0.6) for _ in range(5000)]
    # Many requests, merged: counts add.
    parts = [gaps[i : i + 500] for i in range(0, len(gaps), 500)]
    hists = []
    for part in parts:
        one: h.Hist = {}
        for g in part:
            one[h.bin_of(g)] = one.get(h.bin_of(g), 0) + 1
        hists.append(h.to_pairs(one))
    merged = h.merge(hists)
    assert h.count(merged) == 5000
    for q in (50, 90, 95, 99, 99.9):
        got, want = h.quantile(merged, q), exact_rank(gaps, q)
        assert got is not None and abs(got / want - 1) <= h.MAX_REL_ERROR + 1e-12, (q, got, want)
    m, s = h.mean_std(merged)
    assert m == pytest.approx(sum(gaps) / len(gaps), rel=0.01)
    assert s is not None and s > 0


def test_histogram_edge_cases() -> None:
    assert h.quantile({}, 50) is None and h.mean_std({}) == (None, None)
    assert h.bin_of(0.0) == 0 and h.bin_of(1e-9) == 0
    assert h.merge([None, [[3, 2]], [[3, 1], [4, 0], ["x", 1], [5]]]) == {3: 3}  # bad pairs skipped
    assert h.mean_std({10: 1})[1] is None


def test_tpot_leaves_out_what_the_first_event_carried() -> None:
    # 10 tokens, the first event carried 3 (a speculative burst, or a buffering proxy): the other 7
    # came in 0.7 s, so 100 ms per token, not 0.7 / 9.
    _, _, tpot, _, decode = derived(0.0, 1.0, 1.7, 1.8, 10, first_event_tokens=3)
    assert tpot == pytest.approx(0.1) and decode == pytest.approx(10.0)
    _, _, tpot1, _, _ = derived(0.0, 1.0, 1.9, 2.0, 10)
    assert tpot1 == pytest.approx(0.1)  # unknown: one token assumed
    assert (
        derived(0.0, 1.0, 1.0, 1.1, 3, first_event_tokens=3)[2] is None
    )  # nothing came after the first event


def test_chunk_counted_requests_get_no_per_token_figures() -> None:
    ttft, e2e, tpot, per_req, decode = derived(0.0, 0.2, 1.2, 1.3, 20, counted=False)
    assert ttft == pytest.approx(0.2) and e2e == pytest.approx(1.3)
    assert (tpot, per_req, decode) == (None, None, None)
