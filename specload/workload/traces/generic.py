"""Any JSONL or CSV trace, read with what the command line declares: the field names, the time unit
and, when the rows carry prefix blocks, their size. Nothing is assumed: a time unit must be given
(``--trace-time-unit s|ms|us|ns``), and a hash field needs ``--trace-block-size``.

In a CSV file a hash field holds the ids as a JSON list (``"[1, 2, 3]"``) or separated by spaces
or semicolons.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specload.workload.traces.jsonrows import csv_rows, json_rows
from specload.workload.traces.model import (
    UNITS,
    Trace,
    TraceError,
    TraceRequest,
    length,
    number,
    read_rows,
)

JSONL, CSV = "jsonl", "csv"


@dataclass(frozen=True)
class Layout:
    """A generic file's declared layout."""

    time_unit: str  # one of UNITS
    time_field: str = "timestamp"
    input_field: str = "input_length"
    output_field: str = "output_length"
    hash_field: str | None = None
    block_size: int | None = None

    def check(self, source: str) -> None:
        if self.time_unit not in UNITS:
            raise TraceError(
                f"{source}: a generic trace needs its time unit declared (--trace-time-unit "
                f"{'|'.join(UNITS)}), got {self.time_unit!r}"
            )
        if self.hash_field and not self.block_size:
            raise TraceError(
                f"{source}: hash field {self.hash_field!r} needs its block size declared "
                f"(--trace-block-size TOKENS: Mooncake's are 512, vLLM's default 16)"
            )


def _ids(source: str, row: int, name: str, value: Any) -> tuple[int, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        text = value.strip()
        try:
            value = (
                json.loads(text) if text.startswith("[") else [int(x) for x in re.split(r"[\s;]+", text) if x]
            )
        except ValueError:
            raise TraceError(
                f"{source}: row {row}: {name} is {text[:60]!r}, not a list of integers"
            ) from None
    if not isinstance(value, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in value):
        raise TraceError(f"{source}: row {row}: {name} is {str(value)[:60]!r}, not a list of integers")
    return tuple(value)


def read(path: str | Path, kind: str, layout: Layout) -> Trace:
    source = str(path)
    layout.check(source)
    fields = (layout.time_field, layout.input_field, layout.output_field)
    if kind == CSV:
        rows_iter: Any = csv_rows(source, fields + ((layout.hash_field,) if layout.hash_field else ()))
    elif kind == JSONL:
        rows_iter = json_rows(source)
    else:
        raise TraceError(f"{source}: unknown generic format {kind!r} (jsonl or csv)")

    def request(row: int, d: dict[str, Any]) -> TraceRequest:
        for key in fields:
            if key not in d:
                raise TraceError(f"{source}: row {row}: no field {key!r}")
        ids = _ids(source, row, layout.hash_field, d.get(layout.hash_field)) if layout.hash_field else ()
        return TraceRequest(
            row,
            number(source, row, layout.time_field, d[layout.time_field]),
            length(source, row, layout.input_field, d[layout.input_field]),
            length(source, row, layout.output_field, d[layout.output_field]),
            ids,
        )

    block = layout.block_size if layout.hash_field else None
    return read_rows(kind, source, layout.time_unit, UNITS[layout.time_unit], block, rows_iter, request)
