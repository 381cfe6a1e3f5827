"""Which draft length to run at which load: ``draft_length_table(comp, settings) -> DraftLengthTable``.

A longer draft pays while the server has compute to spare (a small batch) and costs once verifying
every running request's drafts fills it (a large batch). The experiment's arms that differ only in
draft length are the measurements; per level, the setting with the best aggregate and the best
per-request tok/s, and those that the noise cannot tell apart from it, are the answer, printed as
the engine's own setting: vLLM's ``num_speculative_tokens_per_batch_size`` (dynamic speculative
decoding, "requires exhaustive per-batch-size profiling"), or the SGLang flags per load range.
docs/metrics.md ("Draft length per load") defines the choice.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specload.analysis.comparison import NEGLIGIBLE_PCT, Change, Comparison, change_of
from specload.analysis.metrics import RepeatedLevelStats

VLLM, SGLANG = "vllm", "sglang"
# vLLM's field for the draft length; its per-batch-size table (inclusive ranges) of it
VLLM_K = "num_speculative_tokens"
VLLM_TABLE = "num_speculative_tokens_per_batch_size"
# SGLang's draft-length flags, as its server arguments name them
SGLANG_FIELDS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")


@dataclass(frozen=True)
class DraftSetting:
    """One arm's draft length, in its engine's own fields; ``engine`` None: speculation off."""

    label: str
    engine: str | None
    values: tuple[tuple[str, int], ...] = ()  # e.g. (("num_speculative_tokens", 3),)
    method: tuple[tuple[str, Any], ...] = ()  # vLLM: the rest of its speculative config (method, ...)

    @property
    def k(self) -> int:
        """The draft length it is ordered by: vLLM's num_speculative_tokens, SGLang's num_steps (else
        its num_draft_tokens - 1); 0 when off."""
        v = dict(self.values)
        if self.engine is None:
            return 0
        if VLLM_K in v:
            return v[VLLM_K]
        if "speculative_num_steps" in v:
            return v["speculative_num_steps"]
        return max(0, v.get("speculative_num_draft_tokens", 1) - 1)

    def flags(self) -> str:
        """The setting as the engine's command line has it."""
        if self.engine is None:
            return "no speculative flags (speculation off)"
        if self.engine == VLLM:
            cfg = {**dict(self.method), **dict(self.values)}
            return f"--speculative-config '{json.dumps(cfg)}'"
        return " ".join(f"--{name.replace('_', '-')} {value}" for name, value in self.values)


@dataclass(frozen=True)
class LevelChoice:
    """The best setting at one level for one figure, and those inside its noise."""

    level: float
    best: str  # the label of the setting with the highest mean
    tied: tuple[str, ...]  # the others the noise cannot tell from it (their change vs best is ~ or under 1%)
    single: bool  # some setting has a single run here: the ranking is measured, not established
    values: dict[str, float] = field(default_factory=dict)  # the means, by label
    changes: dict[str, Change] = field(default_factory=dict)  # each other setting vs the best

    def to_json(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "best": self.best,
            "inside_the_noise": list(self.tied),
            "single_runs": self.single,
            "values": self.values,
            "changes_vs_best": {k: ch.to_dict() for k, ch in self.changes.items()},
        }


def choose(level: float, figs: dict[str, RepeatedLevelStats], attr: str) -> LevelChoice | None:
    """The best setting at ``level`` by ``attr`` (``agg_tok_s`` or ``per_req_tok_s``): the highest
    mean over the repeats; a setting is inside the noise of it when Welch's test finds no
    difference (repeats on both sides) or the difference is under NEGLIGIBLE_PCT."""
    means = {k: f.of(attr) for k, f in figs.items()}
    have = {k: float(v) for k, v in means.items() if v is not None}
    if not have:
        return None
    best = max(have, key=lambda k: have[k])
    changes = {}
    tied = []
    for k in have:
        if k == best:
            continue
        ch = change_of(figs[best].values(attr), figs[k].values(attr), have[best], have[k])
        changes[k] = ch
        if ch.noise or (ch.pct is not None and abs(ch.pct) < NEGLIGIBLE_PCT):
            tied.append(k)
    single = any(figs[k].n < 2 for k in have)
    return LevelChoice(level, best, tuple(tied), single, have, changes)


@dataclass
class DraftLengthTable:
    """Per level, the draft length with the best aggregate and the best per-request tok/s."""

    settings: list[DraftSetting]  # by draft length
    levels: list[float]
    agg: list[LevelChoice]
    per_req: list[LevelChoice]
    rate: bool = False  # the levels are request rates (then no per-batch-size table)
    cap: int | None = None  # the arms' smallest running cap: no batch is larger (analysis.cap)

    def _by(self, label: str) -> DraftSetting:
        return next(s for s in self.settings if s.label == label)

    @property
    def engine(self) -> str | None:
        return next((s.engine for s in self.settings if s.engine is not None), None)

    @property
    def single(self) -> bool:
        return any(c.single for c in (*self.agg, *self.per_req))

    def ranges(self, choices: Sequence[LevelChoice]) -> list[tuple[float, float, DraftSetting]]:
        """(first level, last level, setting): consecutive levels with the same best setting merged."""
        out: list[tuple[float, float, DraftSetting]] = []
        for c in choices:
            s = self._by(c.best)
            if out and out[-1][2] == s:
                out[-1] = (out[-1][0], c.level, s)
            else:
                out.append((c.level, c.level, s))
        return out

    def vllm_table(self, choices: Sequence[LevelChoice]) -> list[list[int]]:
        """vLLM's ``num_speculative_tokens_per_batch_size``: inclusive batch-size ranges, the first from 1;
        a level's choice holds from the batch size after the previous level up to its own (the batch
        sizes in between were not measured); vLLM carries the last one on to its max batch size.
        Above the servers' running cap the batch stays at the cap (the rest queue), so the first
        level at or above it decides up to the cap and the levels above it add no batch size."""
        table: list[list[int]] = []
        start = 1
        for c in choices:
            if self.cap is not None and start > self.cap:
                break
            k = self._by(c.best).k
            end = int(c.level) if self.cap is None else min(int(c.level), self.cap)
            if table and table[-1][2] == k:
                table[-1][1] = end
            else:
                table.append([start, end, k])
            start = end + 1
        return table

    def vllm_config(self, choices: Sequence[LevelChoice]) -> dict[str, Any] | None:
        """The ``--speculative-config`` that runs the chosen lengths: the arms' method fields, the
        longest chosen length as ``num_speculative_tokens`` and the per-batch-size table."""
        spec = [s for s in self.settings if s.engine == VLLM]
        if not spec or self.rate:
            return None
        table = self.vllm_table(choices)
        top = max(k for _, _, k in table)
        if top == 0:
            return None
        return {**dict(spec[-1].method), VLLM_K: top, VLLM_TABLE: table}

    def engine_setting(self, choices: Sequence[LevelChoice], axis: str) -> list[str]:
        """The choice as the engine's own setting, one line per part."""
        cfg = self.vllm_config(choices) if self.engine == VLLM else None
        if cfg is not None:
            return [f"--speculative-config '{json.dumps(cfg)}'"]
        lines = []
        parts = self.ranges(choices)
        for i, (lo, hi, s) in enumerate(parts):
            span = f"{axis}={lo:g}" if lo == hi else f"{axis}={lo:g} to {hi:g}"
            if i == len(parts) - 1 and len(parts) > 1:
                span = f"from {axis}={lo:g}"
            elif i == 0 and len(parts) > 1:
                span = f"up to {axis}={hi:g}"
            lines.append(f"{span}: {s.flags()}")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": [
                {"label": s.label, "engine": s.engine, "values": dict(s.values), "flags": s.flags()}
                for s in self.settings
            ],
            "levels": self.levels,
            "agg": [c.to_json() for c in self.agg],
            "per_req": [c.to_json() for c in self.per_req],
            "vllm_config_agg": self.vllm_config(self.agg),
            "vllm_config_per_req": self.vllm_config(self.per_req),
            "single_runs": self.single,
        }


def draft_length_table(comp: Comparison, settings: Sequence[DraftSetting]) -> DraftLengthTable | None:
    """The table over the comparison's levels for the runs named by ``settings`` (arm labels); None
    with fewer than two settings or no level measured by them."""
    by_label = {r.label: r for r in comp.runs}
    chosen = sorted((s for s in settings if s.label in by_label), key=lambda s: s.k)
    if len(chosen) < 2:
        return None
    agg, per = [], []
    for c in comp.levels:
        figs = {s.label: by_label[s.label].figures[c] for s in chosen}
        a, p = choose(c, figs, "agg_tok_s"), choose(c, figs, "per_req_tok_s")
        if a is not None and p is not None:
            agg.append(a)
            per.append(p)
    if not agg:
        return None
    caps = [r.cap.value for r in (by_label[s.label] for s in chosen) if r.cap is not None]
    return DraftLengthTable(
        chosen, [c.level for c in agg], agg, per, comp.axis.rate, min(caps) if caps else None
    )


def _cell(c: LevelChoice, label: str) -> str:
    v = c.values.get(label)
    if v is None:
        return "-"
    mark = " **best**" if label == c.best else (" ~" if label in c.tied else "")
    return f"{v:.1f}{mark}"


def render_draft_length(t: DraftLengthTable, axis: str = "C") -> str:
    """The table (markdown), the choice per level, and the engine's own setting for each figure."""
    heads = (
        [axis] + [f"Agg {s.label} (k={s.k})" for s in t.settings] + [f"Per-req {s.label}" for s in t.settings]
    )
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for a, p in zip(t.agg, t.per_req, strict=True):
        row = (
            [f"{a.level:g}"]
            + [_cell(a, s.label) for s in t.settings]
            + [_cell(p, s.label) for s in t.settings]
        )
        lines.append("| " + " | ".join(row) + " |")
    out = ["## Draft length per load", "", *lines, ""]
    out.append(
        "**best**: the highest mean tok/s at that level; ~: inside its noise (Welch's test over the repeats "
        "finds no difference, or under 1%), so either is as good."
    )
    if t.single:
        out.append(
            "Some levels are single runs: the ranking there is what one run measured, not a finding; "
            "`specload experiment --repeat 3` interleaves the arms and settles it."
        )
    for name, choices in (
        ("aggregate tok/s (throughput)", t.agg),
        ("per-request tok/s (latency)", t.per_req),
    ):
        out += ["", f"For the best {name}:"]
        for c in choices:
            tied = f" (inside the noise: {', '.join(c.tied)})" if c.tied else ""
            out.append(f"- {axis}={c.level:g}: {c.best}{tied}")
        out += ["", "```", *t.engine_setting(choices, axis), "```"]
    return "\n".join(out) + "\n"
