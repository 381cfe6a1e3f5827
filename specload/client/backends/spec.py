"""The per-request speculative-decoding objects of each engine, read into a parser's ``spec_*`` fields.

Each engine reports the same four things under its own names: verify steps, draft tokens proposed,
draft tokens accepted, and a histogram of accepted tokens per step (index j: steps that accepted
exactly j, the bonus token left out). The names here are the engines' own:

- vLLM (``--per-request-spec-decode-metrics summary|detailed``): ``metrics.speculative_decoding``
  of the response, or of the final usage chunk of a stream (``choices: []``), with
  ``num_spec_steps``, ``num_draft_tokens``, ``num_accepted_draft_tokens``, ``acceptance_histogram``
  and, at ``detailed``, ``per_step_accepted`` / ``per_step_drafted``
  (vllm/entrypoints/generate/base/protocol.py ``SpeculativeDecodingMetrics``).
- SGLang: ``meta_info`` of /generate and ``sglext.spec_tokens_details`` of the OpenAI endpoints when
  the request sets ``return_spec_tokens_details`` (sglang/srt/entrypoints/openai/utils.py
  ``spec_tokens_details_from_meta_info``): ``spec_verify_ct``, ``spec_num_proposed_drafts``,
  ``spec_num_correct_drafts``, ``spec_correct_drafts_histogram``.
- llama.cpp: ``timings.draft_n`` / ``draft_n_accepted`` (no steps, no histogram).

A field that is absent, or not a count, leaves its figure out rather than failing the request: the
tokens were still delivered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specload.core.records import SPEC_ALONG_BUCKET


def _count(v: Any) -> int | None:
    return v if type(v) is int and v >= 0 else None


def _counts(v: Any) -> list[int] | None:
    if isinstance(v, list) and v and all(type(x) is int and x >= 0 for x in v):
        return v
    return None


def along(per_step_accepted: Sequence[int], first: int = 1) -> list[list[int]]:
    """[[bucket, steps, accepted], ...] of the steps by the output position of their first token.

    The first output token comes from the prefill (position 0), so the first verify step starts at
    ``first`` = 1; a step that accepted a draft tokens yields a + 1 tokens (the bonus one).
    """
    out: dict[int, list[int]] = {}
    pos = first
    for a in per_step_accepted:
        b = pos // SPEC_ALONG_BUCKET
        cell = out.get(b)
        if cell is None:
            out[b] = [b, 1, a]
        else:
            cell[1] += 1
            cell[2] += a
        pos += a + 1
    return [out[b] for b in sorted(out)]


def take_vllm(p: Any, sd: Any) -> None:
    """vLLM's ``metrics.speculative_decoding`` into parser ``p``."""
    if not isinstance(sd, dict):
        return
    steps = _count(sd.get("num_spec_steps"))
    if steps:
        p.spec_verify_ct = steps
    p.spec_drafted = _count(sd.get("num_draft_tokens"))
    p.spec_accepted = _count(sd.get("num_accepted_draft_tokens"))
    p.spec_hist = _counts(sd.get("acceptance_histogram"))
    per_step = _counts(sd.get("per_step_accepted"))
    if per_step is not None:
        p.spec_along = along(per_step)
    p.spec_source = "vllm_metrics"


def take_sglang(p: Any, info: Any, source: str) -> None:
    """SGLang's ``spec_*`` fields (of meta_info, or of sglext.spec_tokens_details) into parser ``p``."""
    if not isinstance(info, dict) or "spec_verify_ct" not in info:
        return
    steps = _count(info.get("spec_verify_ct"))
    if steps:
        p.spec_verify_ct = steps
    drafted = _count(info.get("spec_num_proposed_drafts"))
    accepted = _count(info.get("spec_num_correct_drafts"))
    if drafted or accepted:  # SGLang sends 0 for a count it does not keep
        p.spec_drafted, p.spec_accepted = drafted, accepted
    p.spec_hist = _counts(info.get("spec_correct_drafts_histogram")) or p.spec_hist
    p.spec_source = source
