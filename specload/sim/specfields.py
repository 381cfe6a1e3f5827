"""Per-request speculative-decoding fields, named and shaped as each engine sends them.

Made from the draft tokens each verify step of the request accepted (``timing.Chunk.accepted``) and
k, the draft tokens proposed per step:

- vLLM ``metrics.speculative_decoding`` (vllm/v1/metrics/stats.py ``to_dict``, served when the server
  runs with ``--per-request-spec-decode-metrics summary|detailed``): the prefill's first token is no
  spec step; ``acceptance_histogram`` has k + 1 bins; ``per_step_*`` only at ``detailed``.
- SGLang ``meta_info`` / ``sglext.spec_tokens_details``: ``spec_verify_ct`` counts the prefill's pass
  as a verify step that accepted nothing, so that completion_tokens = spec_verify_ct +
  spec_num_correct_drafts and ``spec_accept_length`` = completion_tokens / spec_verify_ct, as SGLang
  computes it.
"""

from __future__ import annotations

from typing import Any

PER_REQUEST_LEVELS = ("none", "summary", "detailed")  # vLLM's --per-request-spec-decode-metrics


def _hist(steps: list[int], k: int) -> list[int]:
    hist = [0] * (k + 1)
    for a in steps:
        hist[min(a, k)] += 1
    return hist


def vllm_spec(steps: list[int], k: int, level: str) -> dict[str, Any]:
    """vLLM's SpeculativeDecodingMetrics of one request."""
    n = len(steps)
    accepted = sum(steps)
    drafted = k * n
    out: dict[str, Any] = {
        "mean_acceptance_length": 1.0 + accepted / n if n else 1.0,
        "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
        "acceptance_histogram": _hist(steps, k),
        "num_spec_steps": n,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_spec_tokens": k,
    }
    if level == "detailed" and steps:
        out["per_step_accepted"] = list(steps)
        out["per_step_drafted"] = [k] * n
    return out


def sglang_spec(steps: list[int], k: int, completion_tokens: int, verify: int) -> dict[str, Any]:
    """SGLang's spec_* fields of one request (``verify``: its verify steps, the prefill's included)."""
    correct = sum(steps)
    proposed = k * len(steps)
    hist = _hist(steps, k)
    hist[0] += max(0, verify - len(steps))  # the prefill's pass: a verify step with no draft accepted
    return {
        "spec_verify_ct": verify,
        "spec_accept_length": completion_tokens / verify if verify else 0.0,
        "spec_accept_rate": correct / proposed if proposed else 0.0,
        "spec_num_correct_drafts": correct,
        "spec_num_proposed_drafts": proposed,
        "spec_correct_drafts_histogram": hist,
    }
