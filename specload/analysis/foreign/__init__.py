"""Other tools' result files read as specload runs, for ``specload compare`` (analysis layer).

``load_foreign(path)`` returns a ``ForeignRun`` (a Run whose levels carry the figures the file gives,
with ``marks`` for those whose definition differs from docs/metrics.md) or None when ``path`` is not
a result of a known tool (a specload run directory, say). One module per tool, each a typed reader
of its tool's schema: vllm (``vllm bench serve --save-result``), sglang (``bench_serving
--output-file``), guidellm (its JSON report), genai_bench (an experiment folder).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specload.analysis.foreign import genai_bench, guidellm, sglang, vllm
from specload.analysis.foreign.level import ForeignLevel, repeats_in_order
from specload.analysis.foreign.marks import MARK, ForeignRun, Mark, mark_cells, mark_notes
from specload.core import safeopen
from specload.core.rundir import RUN_COMPLETED, RunMeta

__all__ = ["MARK", "ForeignRun", "Mark", "ForeignError", "load_foreign", "mark_cells"]

Read = tuple[list[ForeignLevel], list[Mark], dict[str, str | None]]


class ForeignError(ValueError):
    """A file that looks like a tool's result but cannot be read as one."""


def _objects(path: Path) -> list[dict[str, Any]]:
    """The JSON objects in a file: one document, or JSON lines (vLLM --append-result, SGLang)."""
    text = safeopen.read_text(path)
    try:
        doc = json.loads(text)
        return [doc] if isinstance(doc, dict) else []
    except json.JSONDecodeError:
        pass
    out = []
    for line in text.splitlines():
        if line.strip():
            obj = json.loads(line)
            if isinstance(obj, dict):
                out.append(obj)
    return out


def _read_file(path: Path) -> tuple[str, Read] | None:
    try:
        objs = _objects(path)
    except safeopen.UnsafeFile as e:
        raise ForeignError(str(e)) from None
    except RecursionError:
        raise ForeignError(f"{path}: JSON nested too deep to be a tool's result") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not objs:
        return None
    readers: list[tuple[str, Callable[[dict[str, Any]], bool], Callable[[], Read]]] = [
        (guidellm.TOOL, guidellm.looks_like, lambda: guidellm.read(objs[0])),
        (sglang.TOOL, sglang.looks_like, lambda: sglang.read(objs)),
        (vllm.TOOL, vllm.looks_like, lambda: vllm.read(objs)),
    ]
    for tool, looks, read in readers:
        if looks(objs[0]):
            return tool, read()
    return None


# Larger than any real figure of these (tok/s, ms, s, counts): a 309-digit "measurement" is a broken file.
_IMPLAUSIBLE = 1e15


def _check_level(path: Path, tool: str, lv: ForeignLevel) -> None:
    """Refuse a level whose figures cannot be measurements: not finite, negative, or absurdly large.
    A tool writes NaN for "no value" at times; it is refused here too, as the table would show it as
    a number (or fail to round it)."""
    values: list[tuple[str, object]] = [(f.name, getattr(lv, f.name)) for f in dataclasses.fields(lv)]
    values += [(f"extra.{k}", v) for k, v in lv.extra.items()]
    for name, v in values:
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if not math.isfinite(v) or v < 0 or v > _IMPLAUSIBLE:
            what = "not finite" if not math.isfinite(v) else "negative" if v < 0 else "implausibly large"
            raise ForeignError(
                f"{path}: a {tool} result whose level C={lv.concurrency} has {name} = {v!r} ({what}); "
                "not a measurement, so the file is not compared"
            )


def load_foreign(path: str | Path, label: str | None = None) -> ForeignRun | None:
    """The tool's result at ``path`` as a run (labelled by the file's name); None: not one we know."""
    p = Path(path)
    if p.is_dir():
        if not genai_bench.is_experiment(p):
            return None
        found: tuple[str, Read] | None = (genai_bench.TOOL, genai_bench.read(p))
    elif p.is_file():
        found = _read_file(p)
    else:
        return None
    if found is None:
        return None
    tool, (levels, marks, meta) = found
    if not levels:
        raise ForeignError(f"{p}: a {tool} result without any level")
    for lv in levels:
        _check_level(p, tool, lv)
    name = label or (p.name if p.is_dir() else p.stem)
    info = RunMeta(label=name, model=meta.get("model"), backend=meta.get("backend"), status=RUN_COMPLETED)
    notices = [
        f"read from a {tool} result ({p.name}): of one server measured by two tools, the changes are the "
        f"tools' differences; figures marked {MARK} are defined otherwise:"
    ]
    notices += mark_notes(tool, marks)
    return ForeignRun(
        run_dir=p,
        meta={},
        levels=repeats_in_order(levels),
        notices=notices,
        info=info,
        tool=tool,
        source=p,
        marks=tuple(marks),
    )
