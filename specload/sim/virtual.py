"""A closed-loop level played through :class:`BatchScheduler` in virtual time.

What the batch engine means to deliver at one concurrency, exactly and in milliseconds of CPU rather
than seconds of wall time: the ground truth the prediction tests (tests/test_predict*.py) compare a
fitted model against, and the check of a what-if (another running cap) without a live server.
The driver is bench/calibrate.py's: one warmup request alone, then C users start together and each
sends its next request ``gap_s`` after its last one ended, until the level's budget is spent.
"""

from __future__ import annotations

import heapq
import statistics
from dataclasses import dataclass

from specload.sim.batch import BatchParams, BatchRequest, BatchScheduler


@dataclass(frozen=True)
class VirtualLevel:
    """One level's figures as specload defines them (docs/metrics.md), from the scheduler's clock."""

    concurrency: int
    requests: int
    output_tokens: int
    wall_s: float  # last end - first send
    agg_tok_s: float  # output_tokens / wall_s
    per_req_tok_s: float  # mean over requests of tokens / e2e
    ttft_mean_ms: float
    tpot_mean_ms: float  # mean over requests of (e2e - ttft) / (tokens - 1)
    ttft_p50_ms: float  # medians of the same (bench/calibrate.py holds the presets to them)
    tpot_p50_ms: float
    accept_length: float | None  # 1 + accepted / drafting steps over the level (None: no speculation)
    running_max: int  # most requests running at a step start


def closed_loop_level(
    params: BatchParams,
    concurrency: int,
    prompt_tokens: int,
    output_tokens: int,
    requests: int,
    warmup_tokens: int = 50,
    gap_s: float = 0.0015,
    time_scale: float = 1.0,
) -> VirtualLevel:
    """Play ``requests`` requests from ``concurrency`` closed-loop users; see the module docstring."""
    s = BatchScheduler(params, time_scale)
    arrivals: list[tuple[float, int, int, int]] = [(0.0, 0, -1, warmup_tokens)]  # (t, seq, user, tokens)
    seq, left = 1, requests
    first: dict[int, float] = {}
    sent: dict[int, tuple[int, float]] = {}
    done: list[tuple[float, float, float, int]] = []  # (t_send, t_first, t_end, tokens)
    last_end = 0.0
    running_max = 0
    drafts0 = accepted0 = 0
    while arrivals or s.running or s.queue:
        if s.running:
            start = last_end
        elif s.queue:
            start = max(last_end, s.queue[0].arrival)
        else:
            start = max(last_end, arrivals[0][0])
        while arrivals and arrivals[0][0] <= start:
            t, _, user, n = heapq.heappop(arrivals)
            req = BatchRequest(prompt_tokens, n, t)
            sent[id(req)] = (user, t)
            s.submit(req)
        step = s.begin_step(start)
        if step is None:
            last_end = start
            continue
        running_max = max(running_max, len(s.running))
        end = last_end = step.end
        for req in s.end_step():
            first.setdefault(id(req), end)
            if req.generated < req.max_tokens:
                continue
            user, t_send = sent.pop(id(req))
            t_first = first.pop(id(req))  # (ids are reused once a request is freed)
            if user < 0:  # the warmup is over: the level's users start together
                drafts0, accepted0 = s.num_drafts, s.num_accepted_tokens
                running_max = 0
                for u in range(min(concurrency, left)):
                    heapq.heappush(arrivals, (end + gap_s, seq, u, output_tokens))
                    seq += 1
                left -= min(concurrency, left)
                continue
            done.append((t_send, t_first, end, req.generated))
            if left > 0:
                heapq.heappush(arrivals, (end + gap_s, seq, user, output_tokens))
                seq += 1
                left -= 1
    t0, t1 = min(r[0] for r in done), max(r[2] for r in done)
    tokens = sum(r[3] for r in done)
    drafts = s.num_drafts - drafts0
    return VirtualLevel(
        concurrency=concurrency,
        requests=len(done),
        output_tokens=tokens,
        wall_s=t1 - t0,
        agg_tok_s=tokens / (t1 - t0),
        per_req_tok_s=sum(r[3] / (r[2] - r[0]) for r in done) / len(done),
        ttft_mean_ms=1e3 * sum(r[1] - r[0] for r in done) / len(done),
        tpot_mean_ms=1e3 * sum((r[2] - r[1]) / (r[3] - 1) for r in done) / len(done),
        ttft_p50_ms=1e3 * statistics.median(r[1] - r[0] for r in done),
        tpot_p50_ms=1e3 * statistics.median([(r[2] - r[1]) / (r[3] - 1) for r in done if r[3] > 1] or [0.0]),
        accept_length=1.0 + (s.num_accepted_tokens - accepted0) / drafts if drafts else None,
        running_max=running_max,
    )
