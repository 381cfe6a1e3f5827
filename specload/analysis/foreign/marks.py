"""Definition marks: which of a foreign run's figures are defined otherwise than specload's, and how.

A mark is data: the figure's column key (specload.present.tableview's keys: agg, per_req, ttft_p50,
ttft_p99, tpot_p50, itl_p99) and a sentence on how the tool's figure differs from its definition in
docs/metrics.md. The comparison table puts MARK after the marked figure's cells (and the Δ cells
computed from them); the notes carry the sentences.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specload.analysis.run import Run

MARK = "†"

# The table's headers of each figure key (specload.present.compare's column names), for the notes.
FIGURE_NAMES = {
    "agg": "Agg tok/s",
    "per_req": "Per-req tok/s",
    "ttft_p50": "TTFT p50",
    "ttft_p99": "TTFT p99",
    "tpot_p50": "TPOT p50",
    "itl_p99": "ITL p99",
}


@dataclass(frozen=True)
class Mark:
    figure: str  # a key of FIGURE_NAMES
    how: str  # how the tool's figure differs from specload's definition


@dataclass
class ForeignRun(Run):
    """A result file of another tool read as a specload run: its levels carry the figures the file
    gives, ``marks`` those whose definition differs; ``notices`` says both in words."""

    tool: str = ""
    source: Path | None = None
    marks: tuple[Mark, ...] = field(default_factory=tuple)

    @property
    def marked(self) -> frozenset[str]:
        return frozenset(m.figure for m in self.marks)


def mark_notes(tool: str, marks: Sequence[Mark]) -> list[str]:
    """One note per mark: '{figure}† is ...'."""
    return [f"{FIGURE_NAMES[m.figure]}{MARK} ({tool}): {m.how}" for m in marks]


def _run_of_column(header: str, labels: Sequence[str]) -> int | None:
    """The run a column belongs to: the longest label its header ends with (' vllm', not ' llm')."""
    hits = [i for i, lb in enumerate(labels) if header.endswith(" " + lb)]
    return max(hits, key=lambda i: len(labels[i])) if hits else None


def mark_cells(
    columns: Sequence[tuple[str, str]],
    labels: Sequence[str],
    runs: Sequence[Run],
    rows: list[list[str]],
    missing: str = "-",
) -> list[list[str]]:
    """The rows with MARK after each cell of a marked figure of a foreign run (its Δ cells too)."""
    marked: Mapping[int, frozenset[str]] = {
        i: r.marked for i, r in enumerate(runs) if isinstance(r, ForeignRun) and r.marks
    }
    if not marked:
        return rows
    cols = []
    for j, (header, key) in enumerate(columns):
        i = _run_of_column(header, labels)
        if i is not None and key in marked.get(i, frozenset()):
            cols.append(j)
    for row in rows:
        for j in cols:
            if row[j] != missing and not row[j].endswith(MARK):
                row[j] += MARK
    return rows
