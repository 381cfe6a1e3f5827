"""The simulated server: timing model in-process, then the real server process over plain HTTP.

The simulator is the yardstick other integration tests measure against, so its own timing is
checked here against the configured values with a few milliseconds of tolerance.
"""

from __future__ import annotations

import http.client
import json
import select
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import gevent
import pytest

from specload.clock import hrtimer
from specload.sim.app import DIE_EXIT_CODE
from specload.sim.cli import build_faults, build_parser
from specload.sim.faults import FaultInjector, Faults
from specload.sim.process import stop_process
from specload.sim.timing import ADMITTED, Chunk, FifoSlots, FixedEngine, clock, sleep_until
from tests.conftest import wait_until
from tests.rundelay import RunDelay

# Measured-vs-configured tolerances (seconds). Deadlines are absolute, so a token is never early
# (LATE_MAX covers client wake-up and scheduling noise on a quiet box; what the machine's load adds
# is measured in the same test and added: the run-queue wait of tests/rundelay.py).
EARLY_MAX = 0.0005
LATE_MAX = 0.010


# ---------------------------------------------------------------------------------------------------
# FixedEngine, in-process


def _run(engine: FixedEngine, prompt: int, n: int, out: list[tuple[float, Chunk]]) -> None:
    for chunk in engine.generate(prompt, n):
        out.append((clock(), chunk))


def test_chunk_sizes_and_absolute_deadlines() -> None:
    scale = 0.5
    eng = FixedEngine(
        ttft_s=0.04,
        itl_s=0.01,
        max_running=4,
        prefill_per_token_s=0.0002,
        tokens_per_chunk=3,
        time_scale=scale,
    )
    waited = RunDelay()
    t0 = clock()
    out: list[tuple[float, Chunk]] = []
    _run(eng, 100, 9, out)
    late_max = LATE_MAX + waited.s
    assert [c for _, c in out] == [ADMITTED, Chunk(1, 1), Chunk(3, 3), Chunk(3, 3), Chunk(2, 2)]
    first = t0 + (0.04 + 0.0002 * 100) * scale
    # token i is due at first + (i - 1) * itl; a chunk goes when its last token is due
    expected = [t0, first, first + 3 * 0.01 * scale, first + 6 * 0.01 * scale, first + 8 * 0.01 * scale]
    for (t, _), due in zip(out, expected, strict=True):
        assert due - EARLY_MAX <= t <= due + late_max, (t - due, late_max)


def test_single_token_and_zero_tokens() -> None:
    eng = FixedEngine(ttft_s=0.01, itl_s=0.01, max_running=1, time_scale=0.1)
    assert list(eng.generate(5, 1)) == [ADMITTED, Chunk(1, 1)]
    assert list(eng.generate(5, 0)) == [ADMITTED]
    assert eng.running == 0 and eng.queued == 0


def test_fifo_queueing_under_the_cap() -> None:
    eng = FixedEngine(ttft_s=0.05, itl_s=0.01, max_running=2)  # 50 ms: the four arrivals come first
    # request 0 ends first (70 ms), so request 2 (not the shorter-lived 3) takes its slot, and ends
    # (130 ms) 60 ms before request 1: request 3 takes request 2's slot
    lengths = [3, 15, 2, 2]
    runs: list[list[tuple[float, Chunk]]] = [[] for _ in lengths]
    greenlets = []
    waited = RunDelay()
    for i, n in enumerate(lengths):
        greenlets.append(gevent.spawn(_run, eng, 1, n, runs[i]))
        gevent.sleep(0)  # arrival order 0, 1, 2, 3 (each runs until it sleeps or queues)
    assert (eng.running, eng.queued) == (2, 2)
    gevent.joinall(greenlets, timeout=5, raise_error=True)
    assert (eng.running, eng.queued) == (0, 0)
    late_max = LATE_MAX + waited.s
    admitted = [r[0][0] for r in runs]
    ended = [r[-1][0] for r in runs]
    assert admitted[2] == pytest.approx(ended[0], abs=0.003 + waited.s)
    assert admitted[3] == pytest.approx(ended[2], abs=0.003 + waited.s)  # request 2 ended before request 1
    assert admitted[3] > admitted[2]
    for r, start in zip(runs, admitted, strict=True):  # each timeline counts from its admission
        assert 0.05 - EARLY_MAX <= r[1][0] - start <= 0.05 + late_max, (r[1][0] - start, late_max)


def test_fifo_slots_hand_over_without_overtaking() -> None:
    slots = FifoSlots(1)
    order: list[str] = []

    def take(name: str, hold: float) -> None:
        slots.acquire()
        order.append(name)
        gevent.sleep(hold)
        slots.release()

    a = gevent.spawn(take, "a", 0.01)
    gevent.sleep(0)
    b = gevent.spawn(take, "b", 0)
    gevent.sleep(0.005)
    assert slots.queued == 1
    a.join()  # a released and handed its slot to b, which has not run yet
    c = gevent.spawn(take, "c", 0)  # a newcomer must not slip in before b
    gevent.joinall([b, c], timeout=2, raise_error=True)
    assert order == ["a", "b", "c"]
    assert (slots.running, slots.queued) == (0, 0)


def test_slot_released_on_early_close_and_when_killed_in_queue() -> None:
    eng = FixedEngine(ttft_s=0.01, itl_s=0.01, max_running=1)
    gen = eng.generate(10, 100)
    assert next(gen) == ADMITTED
    assert next(gen) == Chunk(1, 1)
    waiting = gevent.spawn(lambda: list(eng.generate(1, 1)))
    gevent.sleep(0.001)
    assert (eng.running, eng.queued) == (1, 1)
    waiting.kill()  # client gone while queued
    assert (eng.running, eng.queued) == (1, 0)
    gen.close()  # client gone mid-stream (GeneratorExit)
    assert (eng.running, eng.queued) == (0, 0)
    assert list(eng.generate(1, 2)) == [ADMITTED, Chunk(1, 1), Chunk(1, 1)]


def test_admission_counts_from_arrival_when_a_slot_is_free() -> None:
    slots = FifoSlots(1)
    t0 = clock()
    assert slots.acquire(arrival=t0 - 0.005) == t0 - 0.005  # free since long before it arrived
    before = clock()
    slots.release()
    after = clock()
    # the gate was full until the release, so a request that arrived before that is admitted then
    assert before <= slots.acquire(arrival=before - 0.005) <= after
    slots.release()
    assert slots.acquire(arrival=clock() + 1) <= clock()  # never in the future
    slots.release()
    eng = FixedEngine(ttft_s=0.02, itl_s=0.01, max_running=4)
    waited = RunDelay()
    arrival = clock() - 0.015  # e.g. arrived while 15 ms of other requests were being parsed
    out: list[tuple[float, Chunk]] = []
    for chunk in eng.generate(1, 2, arrival=arrival):
        out.append((clock(), chunk))
    late_max = LATE_MAX + waited.s
    assert 0.02 - EARLY_MAX <= out[1][0] - arrival <= 0.02 + late_max, (out[1][0] - arrival, late_max)
    assert 0.03 - EARLY_MAX <= out[2][0] - arrival <= 0.03 + late_max, (out[2][0] - arrival, late_max)


def test_sleep_until_is_precise_and_wakes_in_deadline_order() -> None:
    woke: list[tuple[float, float]] = []
    slept: set[float] = set()  # deadlines still ahead when their sleeper went to sleep

    def sleeper(deadline: float) -> None:
        if clock() < deadline:
            slept.add(deadline)
        sleep_until(deadline)
        woke.append((deadline, clock()))

    # A sleeper whose deadline passed before it slept (the setup preempted for the whole margin, seen
    # at 117 ms with both cores busy) returns at once, in spawn order, and tests nothing: the setup
    # (not the checks) is made again until most sleepers slept.
    for _setup in range(5):
        woke.clear()
        slept.clear()
        waited = RunDelay()
        t0 = clock() + 0.05
        deadlines = [t0 + (k * 7919 % 50) * 0.0003 for k in range(50)]  # shuffled, 0.3 ms apart
        greenlets = [gevent.spawn(sleeper, d) for d in deadlines]
        victim = gevent.spawn(sleeper, t0 + 0.005)
        gevent.sleep(0)
        victim_slept = t0 + 0.005 in slept and all(d != t0 + 0.005 for d, _ in woke)  # asleep when killed
        victim.kill()  # killed while asleep: its timer entry must wake no one else
        gevent.joinall(greenlets, timeout=5, raise_error=True)
        load = waited.s  # what the machine's load made this thread wait for a CPU meanwhile
        if len(slept) >= 40:
            break
    assert len(slept) >= 40, (len(slept), load)
    if victim_slept:
        assert t0 + 0.005 not in [d for d, _ in woke]
    order = [d for d, _ in woke if d in slept and d in deadlines]
    assert order == sorted(order)
    late = sorted(t - d for d, t in woke if d in slept)
    assert late[0] >= 0  # never early
    assert late[len(late) // 2] < 0.002 + load and late[-1] < LATE_MAX + load, (late, load)
    if hrtimer.sleeper() is not None:  # timerfd: a short sleep is not rounded up to a millisecond
        lates = []
        for _ in range(20):
            waited = RunDelay()
            d = clock() + 0.0003
            sleep_until(d)
            lates.append(clock() - d - waited.s)  # the lateness the load did not add
        assert sorted(lates)[10] < 0.0005, lates


def test_precise_sleeper_is_one_per_hub() -> None:
    mine = hrtimer.sleeper()
    assert hrtimer.sleeper() is mine
    if mine is None:  # no timerfd here
        return
    theirs: list[Any] = []
    t = threading.Thread(target=lambda: theirs.append(hrtimer.sleeper()))  # another thread, another hub
    t.start()
    t.join()
    assert theirs[0] is not None and theirs[0] is not mine and theirs[0].hub is not mine.hub


def test_engine_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        FixedEngine(0.01, 0.01, max_running=0)
    with pytest.raises(ValueError):
        FixedEngine(0.01, 0.01, max_running=1, tokens_per_chunk=0)
    with pytest.raises(ValueError):
        FixedEngine(-1, 0.01, max_running=1)


# ---------------------------------------------------------------------------------------------------
# Fault selection, in-process


def test_fault_selection_every_nth_rate_and_default() -> None:
    inj = FaultInjector(Faults(http_error_status=503, http_error_every=3, short_by=2, short_every=2))
    plans = [inj.next_request() for _ in range(6)]
    assert [p.http_error for p in plans] == [None, None, 503, None, None, 503]
    assert [p.short_by for p in plans] == [0, 2, 0, 2, 0, 0]  # request 6 already failed with 503
    inj = FaultInjector(Faults(omit_done=True))
    assert all(inj.next_request().omit_done for _ in range(3))  # no every/rate: every request

    def picks(seed: int) -> list[bool]:
        inj = FaultInjector(Faults(cut_after_tokens=1, cut_rate=0.3, seed=seed))
        return [inj.next_request().cut_after is not None for _ in range(400)]

    assert picks(7) == picks(7)
    assert 80 < sum(picks(7)) < 160


def test_fault_validation_and_cli_defaults() -> None:
    with pytest.raises(ValueError):
        Faults(http_error_status=404).validate()
    with pytest.raises(ValueError):
        Faults(cut_rate=2).validate()
    args = build_parser().parse_args(
        [
            "--fault-cut-after",
            "4",
            "--fault-every",
            "5",
            "--fault-stall-after",
            "2",
            "--fault-stall-every",
            "2",
        ]
    )
    f = build_faults(args)
    assert (f.cut_after_tokens, f.cut_every, f.stall_every) == (4, 5, 2)
    d = build_parser().parse_args([])
    assert (d.host, d.port, d.ttft_ms, d.itl_ms, d.max_running, d.metrics_style) == (
        "127.0.0.1",
        30000,
        50.0,
        10.0,
        48,
        "sglang",
    )


# ---------------------------------------------------------------------------------------------------
# The real server process


@dataclass
class Sim:
    proc: subprocess.Popen[bytes]
    port: int


@dataclass
class Resp:
    status: int
    headers: dict[str, str]
    t_send: float
    events: list[tuple[float, bytes]] = field(default_factory=list)  # (arrival time, payload after "data: ")
    body: bytes = b""
    cut: bool = False  # the body ended without its chunked terminator
    # run-queue wait of this thread and the simulator over the call (tests/rundelay.py): what the
    # machine's load added to any lateness seen
    waited: float = 0.0

    def json_events(self) -> list[dict[str, Any]]:
        return [json.loads(p) for _, p in self.events if p != b"[DONE]"]

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1][1] == b"[DONE]"


SIM_PIDS: dict[int, int] = {}  # port -> simulator PID, for the run-queue wait (tests/rundelay.py)


def _start(args: list[str], log_path: Any) -> Sim:
    with open(log_path, "wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "specload.sim", "--port", "0", *args], stdout=subprocess.PIPE, stderr=log
        )
    ready, _, _ = select.select([proc.stdout], [], [], 15)
    line = proc.stdout.readline().decode() if ready else ""  # type: ignore[union-attr]
    if not line.startswith("specload-sim listening on http://127.0.0.1:"):
        _stop(proc)
        with open(log_path) as f:
            raise RuntimeError(f"sim did not start: {line!r}; stderr: {f.read()}")
    port = int(line.rsplit(":", 1)[1])
    SIM_PIDS[port] = proc.pid
    return Sim(proc, port)


def _stop(proc: subprocess.Popen[bytes]) -> int | None:
    return stop_process(proc, 5)


@pytest.fixture
def start_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Sim]]:
    """Start sim processes; every one is terminated (then killed) by PID in teardown."""
    started: list[Sim] = []

    def start(*args: str) -> Sim:
        sim = _start(list(args), tmp_path_factory.mktemp("sim") / "stderr.log")
        started.append(sim)
        return sim

    yield start
    for sim in started:
        _stop(sim.proc)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """The shared server: TTFT 40 ms + 0.1 ms per prompt token, ITL 10 ms, context 512."""
    s = _start(
        [
            "--ttft-ms",
            "40",
            "--itl-ms",
            "10",
            "--prefill-us-per-token",
            "100",
            "--max-model-len",
            "512",
            "--model",
            "m1",
        ],
        tmp_path_factory.mktemp("sim") / "stderr.log",
    )
    yield s
    _stop(s.proc)


def call(port: int, path: str, body: Any = None, method: str = "POST", timeout: float = 10) -> Resp:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.connect()
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    waited = RunDelay([SIM_PIDS[port]] if port in SIM_PIDS else [])
    t_send = time.perf_counter()
    try:
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        out = Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, t_send)
        if out.headers.get("content-type", "").startswith("text/event-stream"):
            # read1 (not readline, whose peek() swallows a truncated chunked body) so a cut shows
            buf = b""
            while True:
                try:
                    data = r.read1(65536)
                except (http.client.IncompleteRead, ConnectionError):
                    out.cut = True
                    break
                if not data:
                    break
                t = time.perf_counter()
                *lines, buf = (buf + data).split(b"\n")
                out.events += [(t, line[6:].rstrip(b"\r")) for line in lines if line.startswith(b"data: ")]
        else:
            try:
                out.body = r.read()
            except (http.client.IncompleteRead, ConnectionError):
                out.cut = True
        out.waited = waited.s
        return out
    finally:
        conn.close()


def get_json(port: int, path: str) -> Any:
    r = call(port, path, method="GET")
    assert r.status == 200, r.body
    return json.loads(r.body)


def assert_on_schedule(r: Resp, due: list[float]) -> None:
    """Event k arrived due[k] seconds after the request was sent: never early, at most LATE_MAX late
    plus what the machine's load made the client and the simulator wait for a CPU (r.waited).

    Checked against the send time, not the previous event, so drift would show as growing lateness.
    """
    late = [t - r.t_send - d for (t, _), d in zip(r.events[: len(due)], due, strict=True)]
    bound = LATE_MAX + r.waited
    assert all(-EARLY_MAX <= x <= bound for x in late), ([round(x * 1000, 2) for x in late], r.waited)


COMPLETION = {
    "model": "m1",
    "prompt": list(range(100)),
    "max_tokens": 12,
    "stream": True,
    "stream_options": {"include_usage": True},
    "ignore_eos": True,
    "temperature": 0,
}


def test_info_endpoints(shared: Sim) -> None:
    r = call(shared.port, "/health", method="GET")
    assert (r.status, r.body) == (200, b"ok")
    models = get_json(shared.port, "/v1/models")
    assert models == {
        "object": "list",
        "data": [{"id": "m1", "object": "model", "owned_by": "specload-sim", "max_model_len": 512}],
    }
    info = get_json(shared.port, "/get_server_info")
    assert info["model_path"] == "m1" and info["simulated"] is True
    assert info["max_running_requests"] == 48
    assert info["speculative_algorithm"] is None and info["speculative_num_draft_tokens"] is None
    assert info["internal_states"] == [{"num_running_reqs": 0, "num_queue_reqs": 0}]
    metrics = call(shared.port, "/metrics", method="GET").body.decode()
    assert 'sglang:num_running_reqs{model_name="m1"} 0' in metrics
    assert 'sglang:num_queue_reqs{model_name="m1"} 0' in metrics


def test_completions_stream_format_and_timing(shared: Sim) -> None:
    r = call(shared.port, "/v1/completions", COMPLETION)
    assert r.status == 200
    assert r.headers["content-type"] == "text/event-stream" and r.headers["cache-control"] == "no-cache"
    assert r.headers.get("transfer-encoding") == "chunked"
    assert r.done and not r.cut
    events = r.json_events()
    content, usage = events[:-1], events[-1]
    assert len(content) == 12
    for e in content:
        assert e["object"] == "text_completion" and e["model"] == "m1" and e["id"].startswith("cmpl-")
        assert e["choices"][0]["text"] == " tok" and e["choices"][0]["logprobs"] is None
    assert [e["choices"][0]["finish_reason"] for e in content] == [None] * 11 + ["length"]
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 100, "completion_tokens": 12, "total_tokens": 112}
    # TTFT = 40 ms + 100 prompt tokens * 0.1 ms; then exactly 10 ms per token, on absolute deadlines
    assert_on_schedule(r, [0.050 + k * 0.010 for k in range(12)])


def test_chat_stream_role_first_then_content(shared: Sim) -> None:
    body = {
        "model": "m1",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "three more words"}]},
        ],
        "max_completion_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = call(shared.port, "/v1/chat/completions", body)
    assert r.status == 200 and r.done
    events = r.json_events()
    role = events[0]
    assert role["object"] == "chat.completion.chunk" and role["id"].startswith("chatcmpl-")
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert role["choices"][0]["finish_reason"] is None
    content = events[1:-1]
    assert [e["choices"][0]["delta"] for e in content] == [{"content": " tok"}] * 5
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}
    # the role event is sent at admission, the first token TTFT later (40 ms + 5 * 0.1 ms)
    t_role, t_first = r.events[0][0], r.events[1][0]
    assert t_role - r.t_send < 0.015 + r.waited
    assert 0.0405 - EARLY_MAX <= t_first - r.t_send <= 0.0405 + LATE_MAX + r.waited, (
        t_first - r.t_send,
        r.waited,
    )


def test_generate_stream_cumulative_text_and_meta_info(shared: Sim) -> None:
    body = {
        "input_ids": [1] * 20,
        "sampling_params": {"max_new_tokens": 6, "ignore_eos": True},
        "stream": True,
    }
    r = call(shared.port, "/generate", body)
    assert r.status == 200 and r.done
    events = r.json_events()
    assert len(events) == 6
    for k, e in enumerate(events, start=1):
        assert e["text"] == " tok" * k and e["index"] == 0
        meta = e["meta_info"]
        assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == (20, k, 0)
        assert "spec_verify_ct" not in meta
        assert meta["finish_reason"] == (None if k < 6 else {"type": "length", "length": 6})
    lat = [e["meta_info"]["e2e_latency"] for e in events]
    assert lat == sorted(lat) and 0.042 <= lat[0] <= 0.042 + LATE_MAX + r.waited, (lat, r.waited)


def test_non_streaming_responses(shared: Sim) -> None:
    r = call(shared.port, "/v1/completions", {"prompt": "four words of text", "max_tokens": 3})
    body = json.loads(r.body)
    assert r.headers["content-type"] == "application/json"
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == " tok tok tok" and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    r = call(
        shared.port,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "a b"}], "max_tokens": 2},
    )
    body = json.loads(r.body)
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": " tok tok"}
    assert body["usage"]["completion_tokens"] == 2
    r = call(shared.port, "/generate", {"text": "x y z", "sampling_params": {"max_new_tokens": 4}})
    body = json.loads(r.body)
    assert body["text"] == " tok tok tok tok"
    assert body["meta_info"]["completion_tokens"] == 4 and body["meta_info"]["prompt_tokens"] == 3
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 4}


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/completions", b"{not json", 400, "Invalid JSON"),
        ("/v1/completions", b"[1, 2]", 400, "JSON object"),
        ("/v1/completions", {"max_tokens": 3}, 400, "'prompt' is required"),
        ("/v1/completions", {"prompt": [1], "max_tokens": "3"}, 400, "'max_tokens' must be an integer"),
        ("/v1/completions", {"prompt": [1], "max_tokens": 0}, 400, "'max_tokens' must be >= 1"),
        ("/v1/completions", {"prompt": [[1], [2]]}, 400, "batches are not supported"),
        ("/v1/completions", {"prompt": [1], "max_tokens": 2, "min_tokens": 3}, 400, "min_tokens"),
        (
            "/v1/completions",
            {"prompt": [1], "stream_options": {"include_usage": True}},
            400,
            "stream_options",
        ),
        (
            "/v1/completions",
            {"prompt": [1] * 500, "max_tokens": 13},
            400,
            "This model's maximum context length is 512 tokens. However, you requested 513 tokens",
        ),
        ("/v1/completions", {"model": "other", "prompt": [1]}, 404, "does not exist"),
        ("/v1/chat/completions", {"max_tokens": 3}, 400, "'messages' is required"),
        ("/v1/chat/completions", {"messages": []}, 400, "non-empty list"),
        ("/generate", {"sampling_params": {"max_new_tokens": 3}}, 400, "'input_ids' or 'text'"),
        (
            "/generate",
            {"text": "a", "sampling_params": {"max_new_tokens": 600}},
            400,
            "maximum context length",
        ),
        ("/nowhere", {}, 404, "Not found"),
    ],
)
def test_errors(shared: Sim, path: str, body: Any, status: int, needle: str) -> None:
    r = call(shared.port, path, body)
    assert r.status == status
    assert r.headers["content-type"] == "application/json"
    err = json.loads(r.body)["error"]
    assert needle in err["message"] and err["code"] == status and err["type"]


def test_wrong_method(shared: Sim) -> None:
    assert call(shared.port, "/v1/completions", method="GET").status == 405


def test_client_disconnect_frees_the_slot(shared: Sim) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", shared.port, timeout=5)
    conn.request(
        "POST", "/v1/completions", body=json.dumps({"prompt": [1], "max_tokens": 400, "stream": True})
    )
    resp = conn.getresponse()
    assert resp.readline().startswith(b"data: ")
    assert get_json(shared.port, "/get_server_info")["internal_states"][0]["num_running_reqs"] == 1
    conn.close()  # the server notices at its next write and must close the engine stream
    deadline = time.monotonic() + 2
    while get_json(shared.port, "/get_server_info")["internal_states"][0]["num_running_reqs"] != 0:
        assert time.monotonic() < deadline, "slot not released after the client went away"
        time.sleep(0.02)


def test_queueing_gauges_and_vllm_metrics(start_sim: Callable[..., Sim]) -> None:
    s = start_sim("--max-running", "1", "--ttft-ms", "20", "--itl-ms", "10", "--metrics-style", "vllm")
    body = {"prompt": [1], "max_tokens": 60, "stream": True}
    results: list[Resp] = []
    threads = [
        threading.Thread(target=lambda: results.append(call(s.port, "/v1/completions", body)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()

    def both_in() -> tuple[str, Any] | None:
        """The gauges once both requests are in, one running and one queued (a loaded machine may
        take longer than the first's 0.6 s to deliver the second: waited for, not assumed)."""
        metrics = call(s.port, "/metrics", method="GET").body.decode()
        states = get_json(s.port, "/get_server_info")["internal_states"]
        queued = 'vllm:num_requests_waiting{model_name="specload-sim"} 1' in metrics
        return (metrics, states) if queued and states[0]["num_queue_reqs"] == 1 else None

    metrics, states = wait_until(both_in, 10, "the second request to queue", interval=0.02)
    assert 'vllm:num_requests_running{model_name="specload-sim"} 1' in metrics
    assert states == [{"num_running_reqs": 1, "num_queue_reqs": 1}]
    for t in threads:
        t.join(5)
    first, second = sorted(results, key=lambda r: r.events[0][0])
    # the second request is admitted when the first ends: its first token comes one TTFT later
    gap = second.events[0][0] - first.events[-2][0]
    assert gap == pytest.approx(0.020, abs=LATE_MAX + first.waited + second.waited), (
        gap,
        first.waited,
        second.waited,
    )


def test_metrics_style_none(start_sim: Callable[..., Sim]) -> None:
    s = start_sim("--metrics-style", "none")
    assert call(s.port, "/metrics", method="GET").status == 404
    assert call(s.port, "/get_server_info", method="GET").status == 404
    assert call(s.port, "/health", method="GET").status == 200


def test_tokens_per_chunk_over_http(start_sim: Callable[..., Sim]) -> None:
    s = start_sim("--ttft-ms", "20", "--itl-ms", "5", "--tokens-per-chunk", "4")
    r = call(s.port, "/v1/completions", {"prompt": [1], "max_tokens": 10, "stream": True})
    texts = [e["choices"][0]["text"] for e in r.json_events()]
    assert texts == [" tok", " tok tok tok tok", " tok tok tok tok", " tok"]
    assert_on_schedule(r, [0.020, 0.040, 0.060, 0.065])  # a chunk goes when its last token is due


# ---------------------------------------------------------------------------------------------------
# Faults over HTTP


def test_fault_http_error_every_nth(start_sim: Callable[..., Sim]) -> None:
    s = start_sim("--fault-http-status", "503", "--fault-every", "2", "--ttft-ms", "1", "--itl-ms", "1")
    body = {"prompt": [1], "max_tokens": 2, "stream": True}
    statuses = [call(s.port, "/v1/completions", body).status for _ in range(4)]
    assert statuses == [200, 503, 200, 503]
    assert call(s.port, "/v1/completions", body).status == 200
    err = json.loads(call(s.port, "/generate", {"text": "a", "sampling_params": {"max_new_tokens": 1}}).body)
    assert err == {
        "error": {
            "message": "simulated fault: HTTP 503 on request 6",
            "type": "ServiceUnavailableError",
            "param": None,
            "code": 503,
        }
    }


def test_fault_cut_mid_stream(start_sim: Callable[..., Sim]) -> None:
    s = start_sim("--fault-cut-after", "3", "--ttft-ms", "5", "--itl-ms", "2")
    r = call(s.port, "/v1/completions", {"prompt": [1], "max_tokens": 10, "stream": True})
    assert r.status == 200 and r.cut and not r.done
    assert len(r.json_events()) == 3
    with pytest.raises(http.client.RemoteDisconnected):  # non-streaming: no response at all
        call(s.port, "/v1/completions", {"prompt": [1], "max_tokens": 10})
    info = get_json(s.port, "/get_server_info")  # still alive, slot given back
    assert info["internal_states"] == [{"num_running_reqs": 0, "num_queue_reqs": 0}]


def test_fault_stall(start_sim: Callable[..., Sim]) -> None:
    s = start_sim("--fault-stall-after", "2", "--fault-stall-s", "0.3", "--ttft-ms", "5", "--itl-ms", "10")
    r = call(s.port, "/v1/completions", {"prompt": [1], "max_tokens": 6, "stream": True})
    assert r.done and len(r.json_events()) == 6
    t = [t for t, _ in r.events]
    assert t[1] - t[0] == pytest.approx(0.010, abs=LATE_MAX + r.waited)
    assert t[2] - t[1] == pytest.approx(0.300, abs=0.020 + r.waited)  # nothing sent for stall_s ...
    assert t[5] - t[2] < LATE_MAX + r.waited  # ... then the tokens that came due meanwhile, back to back


def test_fault_malformed_omit_done_and_short(start_sim: Callable[..., Sim]) -> None:
    s = start_sim("--fault-malformed-every", "1", "--ttft-ms", "2", "--itl-ms", "1")
    r = call(s.port, "/v1/completions", {"prompt": [1], "max_tokens": 6, "stream": True})
    payloads = [p for _, p in r.events]
    assert payloads[3] == b"{not json" and payloads[-1] == b"[DONE]" and len(payloads) == 8

    s = start_sim("--fault-omit-done", "--ttft-ms", "2", "--itl-ms", "1")
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = call(s.port, "/v1/chat/completions", body)
    assert not r.cut and not r.done
    assert r.json_events()[-1]["usage"]["completion_tokens"] == 3

    s = start_sim("--fault-short-by", "3", "--ttft-ms", "2", "--itl-ms", "1")
    r = call(
        s.port,
        "/v1/completions",
        {"prompt": [1], "max_tokens": 10, "stream": True, "stream_options": {"include_usage": True}},
    )
    events = r.json_events()
    assert r.done and len(events) == 8
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert events[-1]["usage"]["completion_tokens"] == 7
    r = call(
        s.port, "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 5}, "stream": True}
    )
    last = r.json_events()[-1]["meta_info"]
    assert last["completion_tokens"] == 2 and last["finish_reason"]["type"] == "stop"


def test_fault_die_after_requests(start_sim: Callable[..., Sim]) -> None:
    s = start_sim("--fault-die-after", "2", "--ttft-ms", "2", "--itl-ms", "1")
    body = {"prompt": [1], "max_tokens": 3, "stream": True}
    assert call(s.port, "/v1/completions", body).done
    try:
        r = call(s.port, "/v1/completions", body)
        assert not r.done
    except (ConnectionError, http.client.HTTPException):
        pass
    assert s.proc.wait(timeout=5) == DIE_EXIT_CODE


def test_sigterm_exits_cleanly(start_sim: Callable[..., Sim]) -> None:
    s = start_sim()
    s.proc.terminate()
    assert s.proc.wait(timeout=5) == 0


# ---------------------------------------------------------------------------------------------------
# The HTTP layer (specload.sim.httpd), byte by byte over raw sockets


def _conn(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # so split writes stay split
    return s


def _post(path: str, body: Any, extra: str = "", version: str = "HTTP/1.1") -> bytes:
    data = json.dumps(body).encode()
    head = f"POST {path} {version}\r\nHost: x\r\nContent-Length: {len(data)}\r\n{extra}\r\n"
    return head.encode() + data


def _read_response(
    sock: socket.socket, buf: bytes = b"", head_only: bool = False
) -> tuple[int, dict[str, str], bytes, bytes]:
    """One response from ``sock``: (status, lower-cased headers, decoded body, bytes read past it)."""

    def more() -> bytes:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed")
        return data

    while b"\r\n\r\n" not in buf:
        buf += more()
    head, buf = buf.split(b"\r\n\r\n", 1)
    first, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    status = int(first.split(" ")[1])
    if head_only or status < 200:  # a response to HEAD, or an interim response: no body
        return status, headers, b"", buf
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(buf) < n:
            buf += more()
        return status, headers, buf[:n], buf[n:]
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            while b"\r\n" not in buf:
                buf += more()
            size_line, buf = buf.split(b"\r\n", 1)
            size = int(size_line, 16)
            while len(buf) < size + 2:
                buf += more()
            body, buf = body + buf[:size], buf[size + 2 :]
            if size == 0:
                return status, headers, body, buf
    while True:  # no framing: the body ends when the server closes
        try:
            buf += more()
        except ConnectionError:
            return status, headers, buf, b""


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


STREAM_3 = {"prompt": [1], "max_tokens": 3, "stream": True}


def test_keep_alive_serves_many_requests_on_one_connection(shared: Sim) -> None:
    with _conn(shared.port) as s:
        rest = b""
        for _ in range(2):
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, body, rest = _read_response(s, rest)
            assert (status, body) == (200, b"ok") and "connection" not in headers and "date" in headers
            s.sendall(_post("/v1/completions", STREAM_3))
            status, headers, body, rest = _read_response(s, rest)
            assert status == 200 and headers["transfer-encoding"] == "chunked"
            assert body.count(b"data: ") == 4 and body.endswith(b"data: [DONE]\n\n")
            s.sendall(_post("/v1/completions", {"prompt": [1], "max_tokens": 2}))
            status, headers, body, rest = _read_response(s, rest)
            assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 2
            s.sendall(_post("/nowhere", {}))  # an application error keeps the connection
            status, headers, body, rest = _read_response(s, rest)
            assert status == 404 and json.loads(body)["error"]["code"] == 404
            s.sendall(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n")  # 405, head only, no body bytes
            status, headers, _, rest = _read_response(s, rest, head_only=True)
            assert status == 405 and int(headers["content-length"]) > 0
        assert rest == b""


def test_pipelined_requests_are_answered_in_order(shared: Sim) -> None:
    with _conn(shared.port) as s:
        s.sendall(
            _post("/v1/completions", STREAM_3)
            + b"\r\n"  # a stray CRLF between requests is ignored
            + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
            + _post("/v1/completions", {"prompt": [1], "max_tokens": 1})
        )
        status, _, body, rest = _read_response(s)
        assert status == 200 and body.count(b"data: ") == 4
        status, _, body, rest = _read_response(s, rest)
        assert (status, body) == (200, b"ok")
        status, _, body, rest = _read_response(s, rest)
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 1


def test_connection_close_is_honoured(shared: Sim) -> None:
    with _conn(shared.port) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status, headers, body, rest = _read_response(s)
        assert (status, body, headers["connection"]) == (200, b"ok", "close")
        assert rest == b"" and _closed_by_server(s)
    with _conn(shared.port) as s:
        s.sendall(_post("/v1/completions", STREAM_3, "Connection: keep-alive, Close\r\n"))
        status, headers, body, rest = _read_response(s)
        assert status == 200 and headers["connection"] == "close" and body.endswith(b"[DONE]\n\n")
        assert _closed_by_server(s)


def test_request_split_across_many_writes(shared: Sim) -> None:
    req = _post("/v1/completions", STREAM_3)
    cuts = [0, 3, 17, req.index(b"\r\n\r\n") + 1, req.index(b"\r\n\r\n") + 3, len(req) - 5, len(req)]
    with _conn(shared.port) as s:
        for a, b in zip(cuts, cuts[1:], strict=False):
            s.sendall(req[a:b])
            time.sleep(0.02)
        status, _, body, _ = _read_response(s)
        assert status == 200 and body.count(b"data: ") == 4


def test_body_after_head_and_ttft_from_the_whole_request(shared: Sim) -> None:
    req = _post("/v1/completions", STREAM_3)
    split = req.index(b"\r\n\r\n") + 4
    with _conn(shared.port) as s:
        s.sendall(req[:split])
        time.sleep(0.1)
        waited = RunDelay([shared.proc.pid])
        t_body = time.perf_counter()
        s.sendall(req[split:])
        s.settimeout(5)
        data = b""
        while b"data: " not in data:
            data += s.recv(65536)
        # TTFT (40 ms + 1 prompt token * 0.1 ms) counts from when the request was complete
        ttft = time.perf_counter() - t_body
        assert 0.0401 - EARLY_MAX <= ttft <= 0.0401 + LATE_MAX + waited.s, (ttft, waited.s)
        status, _, body, _ = _read_response(s, data)
        assert status == 200 and body.count(b"data: ") == 4


def test_expect_100_continue(shared: Sim) -> None:
    req = _post("/v1/completions", {"prompt": [1], "max_tokens": 1}, "Expect: 100-continue\r\n")
    split = req.index(b"\r\n\r\n") + 4
    with _conn(shared.port) as s:
        s.sendall(req[:split])
        status, _, _, rest = _read_response(s)  # "100 Continue" has no body
        assert status == 100
        s.sendall(req[split:])
        status, _, body, _ = _read_response(s, rest)
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 1


def test_unknown_method_is_405_and_keeps_the_connection(shared: Sim) -> None:
    with _conn(shared.port) as s:
        s.sendall(b"BREW /health HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, body, rest = _read_response(s)
        assert status == 405 and headers["content-type"] == "application/json"
        assert json.loads(body)["error"] == {
            "message": "Method BREW not allowed on /health",
            "type": "MethodNotAllowedError",
            "param": None,
            "code": 405,
        }
        s.sendall(b"PUT /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        status, _, _, rest = _read_response(s, rest)
        assert status == 405
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_response(s, rest)[:3:2] == (200, b"ok")


@pytest.mark.parametrize(
    ("raw", "status", "needle"),
    [
        (b"GARBAGE\r\n\r\n", 400, "malformed request line"),
        (b"GET  /health HTTP/1.1\r\n\r\n", 400, "malformed request line"),
        (b"G(T /health HTTP/1.1\r\n\r\n", 400, "malformed request line"),
        (b"GET /health SPDY/3\r\n\r\n", 400, "malformed request line"),
        (b"GET /health HTTP/2.0\r\n\r\n", 505, "not supported"),
        (b"GET /health HTTP/1.1\r\nno colon here\r\n\r\n", 400, "malformed header"),
        (b"GET /health HTTP/1.1\r\nHost : x\r\n\r\n", 400, "malformed header"),
        (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 12x\r\n\r\n", 400, "Content-Length"),
        (
            b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
            400,
            "Content-Length",
        ),
        (
            b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
            411,
            "Content-Length",
        ),
    ],
)
def test_malformed_requests_get_an_error_and_a_closed_connection(
    shared: Sim, raw: bytes, status: int, needle: str
) -> None:
    with _conn(shared.port) as s:
        s.sendall(raw)
        got, headers, body, _ = _read_response(s)
        assert got == status and headers["connection"] == "close"
        err = json.loads(body)["error"]
        assert needle in err["message"] and err["code"] == status
        assert _closed_by_server(s)


def test_http10_minimal(shared: Sim) -> None:
    with _conn(shared.port) as s:
        s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        status, headers, body, _ = _read_response(s)
        assert (status, body, headers["connection"]) == (200, b"ok", "close")
        assert _closed_by_server(s)
    with _conn(shared.port) as s:  # a stream without chunked encoding: the close ends it
        s.sendall(_post("/v1/completions", STREAM_3, version="HTTP/1.0"))
        status, headers, body, _ = _read_response(s)
        assert status == 200 and "transfer-encoding" not in headers and headers["connection"] == "close"
        assert body.count(b"data: ") == 4 and body.endswith(b"data: [DONE]\n\n")


def test_simultaneous_requests_all_get_the_configured_ttft(start_sim: Callable[..., Sim]) -> None:
    """C requests sent at once on open connections: none is shifted by those handled before it."""
    sim = start_sim("--ttft-ms", "100", "--itl-ms", "10", "--max-running", "256")
    n = 48
    socks = [_conn(sim.port) for _ in range(n)]
    try:
        time.sleep(0.2)  # all accepted
        payload = _post("/v1/completions", {"prompt": [1] * 16, "max_tokens": 2, "stream": True})
        waited = RunDelay([sim.proc.pid])
        sent: dict[socket.socket, float] = {}
        for s in socks:
            sent[s] = time.perf_counter()
            s.sendall(payload)
        sel = selectors.DefaultSelector()
        for s in socks:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
        bufs = dict.fromkeys(socks, b"")
        first: dict[socket.socket, float] = {}
        done = 0
        deadline = time.monotonic() + 10
        while done < n:
            assert time.monotonic() < deadline, "responses did not complete"
            for key, _ in sel.select(timeout=1):
                s = key.fileobj  # type: ignore[assignment]
                t = time.perf_counter()
                data = s.recv(65536)
                assert data, "server closed the connection"
                bufs[s] += data
                if s not in first and b"data: " in bufs[s]:
                    first[s] = t
                if bufs[s].endswith(b"\r\n0\r\n\r\n"):
                    sel.unregister(s)
                    done += 1
        late = sorted(first[s] - sent[s] - 0.100 for s in socks)
        load = waited.s  # what the machine's load made the client and the simulator wait for a CPU
        shown = ([round(x * 1000, 2) for x in late], round(load * 1000, 2))
        assert late[0] >= -EARLY_MAX, shown
        if load < LATE_MAX:
            # How late the whole batch is, on a machine that left the processes their CPUs. A
            # loaded one delayed all 48 first tokens alike by 69 ms with 26 ms of measured wait:
            # the batch's absolute lateness under load is make bench's accuracy figure, not this.
            assert late[0] < LATE_MAX + load, shown
        # Shifted by those handled before it: the spread over the batch. (pywsgi's ~0.25 ms per
        # request before admission made the median ~6 ms and the last ~12 ms after the first; a
        # stall of the whole VM delays every request alike, ~4 ms once in CI, and is no shift.)
        spread = [x - late[0] for x in late]
        assert spread[n // 2] < 0.004 + load and spread[-1] < LATE_MAX + load, shown
    finally:
        for s in socks:
            s.close()
