"""``--processes auto``: how many Locust processes a sweep's largest level needs on this machine.

A gevent process runs on one core, and the client check flags a process above 90 % of it (its
users then read tokens late). docs/bench.md ("How many Locust processes does a server need?")
sizes them from the measured CPU per streamed token and per request, each process kept under half
a core; this is that recipe, with its figures.

The token rate of a concurrency level is not known before the sweep (it is what the sweep
measures): it is taken as C streams of ``STREAM_TOK_S`` each, a fast server's decode; a rate level
expects its rate x the output tokens. Pure: the caller says how many cores there are.
"""

from __future__ import annotations

import math

from specload.workload.config import Scenario

US_PER_TOKEN = 35.0  # docs/bench.md: every token its own event and recv, as a real server streams
US_PER_REQUEST = 400.0  # docs/bench.md: with 1000-token prompts
STREAM_TOK_S = 100.0  # tokens a second per stream assumed for a concurrency level
CORE_SHARE = 0.5  # what a process is planned to use of its core: room for bursts under the 90 % flag
AUTO = "auto"


def plan_processes(sc: Scenario, cores: int) -> tuple[int | None, str]:
    """(processes, why): None for one process (no master: nothing to spread), else N >= 2, at most
    one fewer than the cores (the master hands out every ticket and writes every record)."""
    if sc.rates:
        rate = max(sc.rates)
        tok_s, req_s = rate * sc.output_tokens, rate
        level = f"{rate:g} requests/s x {sc.output_tokens} tokens"
    else:
        c = max(sc.levels)
        tok_s = c * STREAM_TOK_S
        req_s = tok_s / max(1, sc.output_tokens)
        level = f"C={c} at an assumed {STREAM_TOK_S:g} tok/s per stream"
    cpu = (tok_s * US_PER_TOKEN + req_s * US_PER_REQUEST) / 1e6  # cores busy
    need = max(1, math.ceil(cpu / CORE_SHARE))
    most = max(1, cores - 1)
    n = min(need, most)
    why = (
        f"the largest level ({level}) expects about {tok_s:,.0f} tok/s and {req_s:,.1f} requests/s: "
        f"{cpu:.2f} cores at {US_PER_TOKEN:g} µs a token and {US_PER_REQUEST:g} µs a request "
        f"(docs/bench.md), planned at {CORE_SHARE:g} of a core per process; {cores} core(s) here"
    )
    if need > most:
        why += f", so at most {most} beside the master: the client check will say if they cannot keep up"
    return (n if n >= 2 else None), why


def describe(n: int | None, why: str) -> str:
    """The line the CLI prints."""
    chosen = "one process (no --processes)" if n is None else f"--processes {n}"
    return f"specload: --processes auto: {chosen}: {why}"
