"""The server's cap on running requests, as it said it or as its gauges show it: ``running_cap``.

A server that runs at most N requests at once queues the rest, and every level above N measures
that queue as much as the server's speed. specload reads the cap where the server says it (SGLang's
``/get_server_info`` ``max_running_requests``, vLLM's ``/server_info`` ``max_num_seqs`` in dev mode,
llama.cpp's ``/props`` ``total_slots``, or the ``--max-num-seqs`` of a server that ``specload
experiment`` started); a server that says nothing still shows it in its gauges: the running gauge
holds a plateau while the queue gauge is above zero. docs/metrics.md ("The running cap") defines
the inference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from specload.analysis.metrics import LevelStats, ServerSample
from specload.client.introspect import CAP_SOURCE
from specload.core.rundir import ServerInfo

# The fewest samples with a queue behind a full running gauge that make a plateau.
CAP_MIN_SAMPLES = 3
# The share of the queued samples at the plateau's height (the rest are moments of admission).
CAP_MIN_SHARE = 0.5
# A level whose gauges were read fewer than this share of the times they were asked for is named:
# its Srv run / queue figures come from those few samples. Levels asked fewer than
# SAMPLED_MIN_ASKED times are not judged (one late answer is a large share of a few).
SAMPLED_MIN_SHARE = 0.5
SAMPLED_MIN_ASKED = 10


@dataclass(frozen=True)
class RunningCap:
    """The cap on running requests and how it is known."""

    value: int
    inferred: bool  # True: from the gauges, not from the server's word
    how: str  # ', read from ...', ', inferred from its gauges', or '' for SGLang's own field
    detail: str = ""  # how an inferred cap was found, in a sentence

    def to_json(self) -> dict[str, object]:
        return asdict(self) | {"how": self.how.strip(", ")}


def infer_cap(samples: Sequence[ServerSample]) -> tuple[int, int, int] | None:
    """(cap, samples at it, samples with a queue) from the gauges; None when they show no plateau.

    Among the samples whose queue gauge is above zero, the highest running value R is the cap when
    at least CAP_MIN_SAMPLES of them, and at least CAP_MIN_SHARE of them, show exactly R, and no
    sample at all shows more than R running: the server had work waiting and still ran no more.
    """
    queued = [s for s in samples if (s.queued or 0) > 0 and s.running is not None]
    if len(queued) < CAP_MIN_SAMPLES:
        return None
    top = max(s.running or 0.0 for s in queued)
    if top < 1 or any((s.running or 0.0) > top for s in samples):
        return None
    at_top = sum(1 for s in queued if s.running == top)
    if at_top < CAP_MIN_SAMPLES or at_top < CAP_MIN_SHARE * len(queued):
        return None
    return int(top), at_top, len(queued)


def running_cap(server: ServerInfo, samples: Sequence[ServerSample]) -> RunningCap | None:
    """The declared cap (run.json ``server``), else the one the gauges show, else None."""
    cap = server.max_running
    if cap is not None:
        source = server.get(CAP_SOURCE)
        return RunningCap(cap, False, f", read from {source}" if isinstance(source, str) and source else "")
    found = infer_cap(samples)
    if found is None:
        return None
    value, at, n = found
    return RunningCap(
        value,
        True,
        ", inferred from its gauges",
        f"max_running_requests {value} inferred: the server did not say its cap, and its running gauge held "
        f"{value} while its queue gauge was above zero ({at} of {n} samples with a queue)",
    )


def sparse_sampling_notes(levels: Sequence[LevelStats], interval_s: float) -> list[str]:
    """One note per level whose server gauges answered fewer than SAMPLED_MIN_SHARE of the times
    they were asked for (every ``interval_s`` over the level's wall time).

    A server busy with the load answers its /metrics late: a vLLM frontend that shares a core with
    the client answered 4 times in a level of 8 s asked every 0.1 s, each time as requests ended,
    and its running gauge read 0 at all four. Its Srv run max of 0 then says nothing about the
    level, and the cap inferred from the gauges has few samples to go on."""
    notes = []
    for s in levels:
        if not s.wall_s or interval_s <= 0:
            continue
        asked = s.wall_s / interval_s
        if asked >= SAMPLED_MIN_ASKED and s.server_samples < SAMPLED_MIN_SHARE * asked:
            notes.append(
                f"{s.label}: the server's /metrics answered {s.server_samples} times in {s.wall_s:.1f} s "
                f"(asked every {interval_s:g} s): Srv run and Srv queue, and a cap inferred from them, "
                "come from those samples alone (a server busy with the load answers late)"
            )
    return notes
