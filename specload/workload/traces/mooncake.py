"""Mooncake's traces (kvcache-ai/Mooncake, FAST'25): JSONL rows of ``timestamp``, ``input_length``,
``output_length`` and ``hash_ids``.

Units, fixed here: ``timestamp`` is milliseconds since the first request (Mooncake issue #4; the
published conversation trace spans 3,536,999 of them, one hour); each ``hash_id`` stands for one
block of 512 prompt tokens, equal ids for equal blocks. The peers' traps are these two numbers:
GuideLLM reads the times as seconds (1000x slow), vLLM's ``timed_trace`` defaults to 16-token
blocks (prompts 32x short), SGLang ignores ``input_length``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specload.workload.traces.jsonrows import json_rows
from specload.workload.traces.model import Trace, TraceError, TraceRequest, length, number, read_rows

FORMAT = "mooncake"
TIME_UNIT = "ms"
SECONDS_PER_UNIT = 1e-3
BLOCK_SIZE = 512


def hash_ids(source: str, row: int, value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in value):
        raise TraceError(f"{source}: row {row}: hash_ids is {str(value)[:60]!r}, not a list of integers")
    return tuple(value)


def read(path: str | Path) -> Trace:
    source = str(path)

    def request(row: int, d: dict[str, Any]) -> TraceRequest:
        for key in ("timestamp", "input_length", "output_length"):
            if key not in d:
                raise TraceError(
                    f"{source}: row {row}: no {key!r} (a Mooncake row has timestamp, "
                    f"input_length, output_length, hash_ids)"
                )
        return TraceRequest(
            row,
            number(source, row, "timestamp", d["timestamp"]),
            length(source, row, "input_length", d["input_length"]),
            length(source, row, "output_length", d["output_length"]),
            hash_ids(source, row, d.get("hash_ids")),
        )

    return read_rows(FORMAT, source, TIME_UNIT, SECONDS_PER_UNIT, BLOCK_SIZE, json_rows(source), request)
