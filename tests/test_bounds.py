"""Sizes have bounds (review ab9c161, M10, M12): a 200,000-level form pinned the UI at 7.6 GB, and
integers of 2^64 or more (``--seed``, ``output_tokens=1e100`` from the form) crashed the run's start
after the probe was sent. The field table refuses them with the field named, before any load."""

from __future__ import annotations

import pytest

from specload.workload.config import MAX_LEVELS, ScenarioError, scenario_from_dict


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"seed": 2**64}, "field 'seed': expected an integer <= 2^53"),
        ({"output_tokens": 10**100}, "field 'output_tokens': expected an integer <= 2^53"),
        ({"levels": [1, 2**60]}, "field 'levels': expected a non-empty list of positive integers"),
        ({"levels": list(range(1, 200_001))}, f"200000 levels, more than {MAX_LEVELS}"),
        ({"levels": ",".join(map(str, range(1, 2000)))}, f"1999 levels, more than {MAX_LEVELS}"),
        ({"rates": [1.0] * (MAX_LEVELS + 1)}, f"{MAX_LEVELS + 1} levels, more than {MAX_LEVELS}"),
    ],
)
def test_sizes_beyond_the_bounds_are_refused_naming_the_field(fields: dict, says: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ScenarioError, match=None) as e:
        scenario_from_dict(fields, "start form")
    assert says in str(e.value), str(e.value)


def test_sizes_within_the_bounds_are_kept() -> None:
    sc = scenario_from_dict({"seed": 2**53, "levels": list(range(1, MAX_LEVELS + 1))}, "file")
    assert sc.seed == 2**53 and len(sc.levels) == MAX_LEVELS
