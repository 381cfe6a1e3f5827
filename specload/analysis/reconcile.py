"""The records against run.json's own counts: a records.jsonl cut short, or a run.json that claims
more (or fewer) than the records hold, is said, not silently believed either way (review ab9c161,
M11: records cut in half showed c004 = 0 while run.json said received 8, with no note)."""

from __future__ import annotations

from collections.abc import Sequence

from specload.analysis.metrics import LevelStats
from specload.core.records import level_label
from specload.core.rundir import LevelMeta


def reconcile(planned: Sequence[LevelMeta], levels: Sequence[LevelStats]) -> list[str]:
    """One note per level whose measured records differ from what run.json says it received
    (less the requests written off with a lost worker, which never have a record)."""
    sent = {lv.index: lv.sent for lv in levels if lv.index is not None}
    notes = []
    for lm in planned:
        if lm.index is None or lm.received is None:
            continue
        expected = lm.received - lm.lost
        have = sent.get(lm.index, 0)
        if have != expected:
            what = "missing" if have < expected else "more than it counted"
            notes.append(
                f"{level_label(lm.concurrency, lm.repeat, lm.rate)}: {abs(expected - have)} measured record(s) {what}: records.jsonl "
                f"holds {have}, run.json received {lm.received}"
                + (f" ({lm.lost} written off)" if lm.lost else "")
            )
    return notes
