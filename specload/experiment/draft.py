"""Which arms differ only in draft length, and what each one's is: read from their command lines.

vLLM sets it in ``--speculative-config`` (``num_speculative_tokens``), SGLang with
``--speculative-num-steps``, ``--speculative-eagle-topk`` and ``--speculative-num-draft-tokens``.
Arms whose command lines are the same once those values are taken out form one family; an arm
without any ``--speculative*`` flag whose command line is the family's with every such flag taken
out is the family's "off" setting. The family's runs make the draft-length table
(specload.analysis.draftlen).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from specload.analysis.draftlen import SGLANG, SGLANG_FIELDS, VLLM, VLLM_K, DraftSetting

VLLM_FLAGS = ("--speculative-config", "--speculative_config")
SGLANG_FLAGS = {"--" + f.replace("_", "-"): f for f in SGLANG_FIELDS}
SPECULATIVE = "--speculative"  # every vLLM / SGLang speculative flag starts so


def _split(argv: Sequence[str]) -> list[tuple[str, str | None]]:
    """(flag, value) pairs (a value joined by '=' or the next argument that is not a flag);
    (argument, None) for the rest."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and "=" in arg:
            flag, _, value = arg.partition("=")
            out.append((flag, value))
        elif arg.startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out.append((arg, argv[i + 1]))
            i += 1
        else:
            out.append((arg, None))
        i += 1
    return out


def draft_setting(label: str, argv: Sequence[str]) -> tuple[DraftSetting, tuple[str, ...]]:
    """The arm's draft setting and its command line without the draft-length values (its family key)."""
    values: list[tuple[str, int]] = []
    method: tuple[tuple[str, object], ...] = ()
    engine: str | None = None
    rest: list[str] = []
    for flag, value in _split(argv):
        if flag in VLLM_FLAGS and value is not None:
            try:
                cfg = json.loads(value)
            except ValueError:
                cfg = None
            if isinstance(cfg, dict) and isinstance(cfg.get(VLLM_K), int):
                engine = VLLM
                values.append((VLLM_K, cfg[VLLM_K]))
                method = tuple(sorted((k, v) for k, v in cfg.items() if k != VLLM_K))
                rest += [flag, json.dumps(dict(method), sort_keys=True)]
                continue
        if flag in SGLANG_FLAGS and value is not None and value.isdigit():
            engine = SGLANG
            values.append((SGLANG_FLAGS[flag], int(value)))
            continue
        rest += [flag] if value is None else [flag, value]
    if engine is None and any(a.startswith(SPECULATIVE) for a in argv):
        engine = "other"  # speculative, but no draft length we know how to read
    return DraftSetting(label, engine if engine != "other" else None, tuple(values), method), tuple(rest)


def _without_speculation(argv: Sequence[str]) -> tuple[str, ...]:
    out: list[str] = []
    for flag, value in _split(argv):
        if flag.startswith(SPECULATIVE):
            continue
        out += [flag] if value is None else [flag, value]
    return tuple(out)


def draft_family(arms: Sequence[tuple[str, Sequence[str]]]) -> list[DraftSetting]:
    """The largest group of arms (label, command line) that differ only in draft length, with the
    arm that runs the same command without speculation as its "off" setting; [] when no two
    speculative arms differ only so."""
    families: dict[tuple[str, ...], list[DraftSetting]] = {}
    plain: dict[tuple[str, ...], DraftSetting] = {}
    for label, argv in arms:
        setting, key = draft_setting(label, argv)
        if setting.values:
            families.setdefault(key, []).append(setting)
        elif not any(a.startswith(SPECULATIVE) for a in argv):
            plain.setdefault(_without_speculation(argv), setting)
    best: list[DraftSetting] = []
    for group in families.values():
        if len({s.values for s in group}) < 2 or len(group) <= len(best):
            continue
        spec_argv = next(argv for label, argv in arms if label == group[0].label)
        off = plain.get(_without_speculation(spec_argv))
        best = ([off] if off is not None else []) + group
    return best
