"""Rows of a JSONL or CSV trace file, numbered as the records' ``trace_index`` counts them."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from typing import Any

import orjson

from specload.core.safeopen import open_regular
from specload.workload.datasets import DATASET_MAX_BYTES
from specload.workload.traces.model import TraceError


def _open(source: str) -> Any:
    # (a trace is a dataset: a regular file only, never a FIFO or a device, under the dataset cap)
    try:
        return io.TextIOWrapper(open_regular(source, DATASET_MAX_BYTES), encoding="utf-8", newline="")
    except OSError as e:
        raise TraceError(f"{source}: cannot read the trace file: {e.strerror or e}") from None


def json_rows(source: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row, object) for each non-blank line; row counts the objects from 0."""
    row = 0
    with _open(source) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise TraceError(f"{source}: line {lineno}: not JSON ({e})") from None
            if not isinstance(d, dict):
                raise TraceError(f"{source}: line {lineno}: not a JSON object")
            yield row, d
            row += 1


def csv_rows(source: str, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """(row, {column: text}) for each data row after the header; row counts data rows from 0."""
    with _open(source) as f:
        reader = csv.DictReader(f)
        header = [h.strip() for h in (reader.fieldnames or [])]
        reader.fieldnames = header
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(
                f"{source}: no column {', '.join(repr(c) for c in missing)} in the header "
                f"({', '.join(header) or 'empty'})"
            )
        try:
            yield from enumerate(reader)
        except csv.Error as e:
            raise TraceError(f"{source}: line {reader.line_num}: {e}") from None
