"""The client knows when it is the bottleneck: the verdict (pure), the probe, and two real sweeps.

The saturating sweep pins one Locust process to one core (``taskset -c 1``) and the simulator to
the other, at C=256 with 1 ms tokens: it cannot keep up on any machine, busy or quiet (quiet, its
process runs at ~100 % CPU; busy, it waits for a CPU and its loop lags), so the flag must fire.
The light sweep (C=2, 10 ms tokens) uses ~5 % of a core and its loop lags under ~11 ms even with
the machine's cores kept busy by other processes (measured), half the 20 ms threshold.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

from specload.analysis.clientcheck import (
    CPU_SATURATED,
    LAG_P50_MS,
    LAG_P99_MS,
    MASTER,
    STALL_MS,
    ClientFigures,
    LagHistogram,
    LevelTraffic,
    ProcessLoad,
    cell,
    client_flags,
    client_notes,
    in_flight_due,
    judge_in_flight,
    level_flags,
    mean_in_flight,
    peak_in_flight,
)
from specload.core.rundir import LevelMeta, RunMeta
from specload.locust.clientload import INTERVAL_S as PROBE_INTERVAL_S
from specload.locust.clientload import LoadProbe
from specload.locust.protocol import ClientLoadMsg
from specload.present.report import load_run
from tests.conftest import specload_cmd


def load(
    cpu: float = 0.05, lag: float = 1.0, wait: float | None = 0.0, median: float | None = None
) -> ProcessLoad:
    """A process's figures; the median wake-up a third of the p99 unless given."""
    return ProcessLoad(cpu, lag, lag * 1.5, 100, 5.0, wait, lag / 3 if median is None else median)


# ---------------------------------------------------------------- the verdict (pure)


def test_lag_histogram_percentiles_within_a_bucket_and_exact_max() -> None:
    h = LagHistogram()
    assert h.percentile(0.99) is None
    for _ in range(97):
        h.add(1.0)
    h.add(25.0)
    h.add(30.0)
    h.add(-0.2)  # an early wake-up counts as on time
    assert h.n == 100 and h.max_ms == 30.0
    assert 1.0 <= (h.percentile(0.5) or 0) <= 1.1  # the bucket's upper bound: at most 10 % high
    assert 1.0 <= (h.percentile(0.98) or 0) <= 1.1
    assert 25.0 <= (h.percentile(0.99) or 0) <= 27.5  # nearest rank: the 99th of 100
    assert h.percentile(1.0) == 30.0
    big = LagHistogram()
    big.add(1e9)  # beyond the last bucket: still counted, the max is exact
    assert big.percentile(0.99) == 1e9


def test_mean_in_flight_is_time_weighted_over_the_window() -> None:
    # Two requests in flight the whole window, a third for half of it.
    spans = [(0.0, 10.0), (0.0, 10.0), (5.0, 20.0)]
    assert mean_in_flight(spans, 0.0, 10.0) == pytest.approx(2.5)
    assert mean_in_flight(spans, 0.0, 0.1) is None  # too short to say anything
    t = LevelTraffic()
    t.add(-1.0, 1.0, measured=False, failed=False)  # a warmup request still running counts
    for i in range(4):  # C=4, one wave then another, each request 1 s, sends 1 s apart
        t.add(float(i // 4), float(i // 4) + 1.0, measured=True, failed=False)
    t.add(1.0, 2.0, measured=True, failed=False)
    assert (t.first_send, t.last_send, t.received) == (0.0, 1.0, 5)
    assert t.mean_in_flight() == pytest.approx(5.0)
    assert t.mean_in_flight(skip_s=0.5) == pytest.approx(5.0)


def test_in_flight_not_judged_when_the_server_or_the_plan_explains_the_gap() -> None:
    t = LevelTraffic()
    for i in range(20):
        t.add(i * 0.1, i * 0.1 + 0.1, measured=True, failed=i < 2)  # one in flight of C=8
    assert judge_in_flight(None, 8, 16, False) == (None, "no measured request")
    assert judge_in_flight(t, 8, 8, False)[1] == "one wave only (8 requests for C=8)"
    assert "server was away" in (judge_in_flight(t, 8, 16, True)[1] or "")
    assert judge_in_flight(t, 8, 16, False)[1] == "2 of 20 requests failed"
    t.failed = 0
    mif, why = judge_in_flight(t, 8, 16, False)
    assert why is None and mif == pytest.approx(1.0, rel=0.1)
    assert judge_in_flight(t, 8, None, False)[0] == mif  # time-boxed levels are judged too


def test_verdict_names_each_cause_and_the_fix() -> None:
    quiet = ClientFigures(32, {"local": load()}, 31.8)
    assert quiet.reasons() == [] and quiet.flag() is None and cell(quiet) == "ok"
    busy = ClientFigures(256, {"w1": load(0.3), "w2": load(0.98, 38.0)}, 110.3)
    assert busy.flag() == (
        "the client was the bottleneck at C=256 (a Locust process at 98% CPU, loop lag p99 38 ms (median 13 ms), "
        "mean in flight 110 of 256): add processes (`--processes N`) or worker machines"
    )
    assert cell(busy).startswith("BOTTLENECK: a Locust process at 98% CPU")
    # Starved: little CPU, but the process waited for one the rest of the time.
    starved = ClientFigures(64, {"local": load(0.4, 5.0, 0.55)}, 63.0)
    assert starved.reasons() == [
        "a Locust process at 40% CPU and 55% waiting for one (other work on its machine)"
    ]
    assert (starved.flag() or "").endswith("; keep other work off the client's cores")
    # Each cause alone, just over its threshold; just under it, nothing.
    assert ClientFigures(8, {"l": load(CPU_SATURATED)}).reasons() == ["a Locust process at 90% CPU"]
    assert ClientFigures(8, {"l": load(CPU_SATURATED - 0.01)}).reasons() == []
    assert ClientFigures(8, {"l": load(lag=LAG_P99_MS + 1, median=6)}).reasons() == [
        "loop lag p99 21 ms (median 6 ms)"
    ]
    assert ClientFigures(8, {"l": load(lag=LAG_P99_MS, median=6)}).reasons() == []
    # A one-off late wake-up in an idle loop (the machine's doing, measured: up to 158 ms) is no verdict.
    assert ClientFigures(8, {"l": load(lag=158.0, median=LAG_P50_MS)}).reasons() == []
    assert ClientFigures(100, {}, 89.0).reasons() == ["mean in flight 89 of 100"]
    assert ClientFigures(100, {}, 90.0).reasons() == []
    master = ClientFigures(64, {MASTER: load(0.95), "w": load(0.5)})
    assert "give the master a core of its own" in (master.flag() or "")
    assert cell(None) == "-" and cell(ClientFigures(4)) == "-"


def test_figures_round_trip_through_run_json_and_readers_judge_them_anew() -> None:
    fig = ClientFigures(256, {"local": load(1.0, 38.0, 0.0, 12.0)}, 110.25, None)
    d = fig.to_json()
    assert d["cpu_max"] == 1.0 and d["loop_lag_p99_ms"] == 38.0 and d["loop_lag_max_ms"] == 57.0
    assert d["processes"] == 1 and d["mean_in_flight"] == 110.2 and d["flag"] == fig.flag()
    back = ClientFigures.from_json(256, orjson.loads(orjson.dumps(d)))
    assert back is not None and back.flag() == fig.flag()
    levels = [
        LevelMeta(index=0, concurrency=2, client=ClientFigures(2, {"local": load()}, 2.0).to_json()),
        LevelMeta(index=1, concurrency=256, repeat=1, client=d),
        LevelMeta(index=2, concurrency=512),  # a run from before: no figures, no flag
        LevelMeta(index=3, concurrency=8, client={"per_process": "garbage", "mean_in_flight": "x"}),
    ]
    meta = RunMeta(levels=levels)
    assert RunMeta.from_json(orjson.loads(orjson.dumps(meta.to_json()))).levels[1].client == d
    assert level_flags(levels) == {1: fig.flag()}
    assert client_notes(levels) == [f"c256.r1: {fig.flag()}"]
    stale = dict(d, flag=None)  # the recorded flag is not trusted: the figures are judged again
    assert level_flags([LevelMeta(index=0, concurrency=256, client=stale)]) == {0: fig.flag()}


def test_the_live_verdict_is_the_one_stored_and_read_back_at_a_rounding_edge() -> None:
    """run.json keeps a mean in flight of 60.51 as 60.5: live, stored and judged anew by a reader,
    the flag says 60 (the live figure said 61 and the report 60)."""
    live = ClientFigures(256, {"local": load(0.9155, 5.0)}, 60.51, None)
    assert "mean in flight 61 of 256" in (live.flag() or "")  # the unrounded figure's verdict
    fig = live.as_stored()
    d = fig.to_json()
    back = ClientFigures.from_json(256, orjson.loads(orjson.dumps(d)))
    assert back is not None and fig.flag() == d["flag"] == back.flag()
    assert "mean in flight 60 of 256" in d["flag"] and "92% CPU" in d["flag"]
    assert fig.as_stored() == fig


# ---------------------------------------------------------------- the probe (no greenlet: ticks by hand)


def test_probe_counts_only_active_levels_and_reports_each_once_more_at_its_end() -> None:
    where: list[tuple[str | None, int] | None] = [None]
    sent: list[ClientLoadMsg] = []
    probe = LoadProbe(lambda: where[0], sent.append)
    probe.tick(0.0, 0.5)  # no level: nothing measured
    where[0] = ("run", 0)
    probe.tick(0.05, 0.5)  # the wake-up that saw the level start belongs to neither
    for i in range(1, 4):
        probe.tick(0.05 + i * 0.05, 0.002)
    probe.tick(0.30, 0.030)  # 0.25 s after the start: a report
    assert [(m.run, m.level, m.load.samples) for m in sent] == [("run", 0, 4)]
    assert sent[0].load.lag_max_ms == pytest.approx(30.0) and sent[0].load.cpu >= 0
    where[0] = ("run", 1)
    probe.tick(0.35, 0.0)  # the level changed: the last word on level 0, nothing yet for level 1
    assert [(m.level, m.load.samples) for m in sent] == [(0, 4), (0, 4)]
    where[0] = None
    probe.tick(0.40, 0.0)
    assert len(sent) == 2  # level 1 had no sample: nothing to say
    wire = sent[0].to_wire()
    assert ClientLoadMsg.from_wire(orjson.loads(orjson.dumps(wire))).to_wire() == wire
    assert sent[0].load.wall_s == pytest.approx(0.25)


# ---------------------------------------------------------------- real sweeps


def _sweep(tmp_path: Path, url: str, *flags: str, pin: str | None = None) -> tuple[str, dict, Path]:
    cmd = specload_cmd(
        "sweep", "--host", url, "--input-tokens", "16", "--read-timeout", "30", "--out", str(tmp_path), *flags
    )
    if pin is not None:
        cmd = ["taskset", "-c", pin, *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    (run_dir,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    return log, orjson.loads((run_dir / "run.json").read_bytes()), run_dir


def _pin(pid: int, cpu: int) -> None:
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), {cpu})


@pytest.mark.slow  # make test-slow: it keeps both cores busy on purpose, under every other test's timings
@pytest.mark.skipif(
    shutil.which("taskset") is None or not {0, 1} <= os.sched_getaffinity(0),
    reason="needs taskset and cores 0, 1",
)
def test_a_client_that_cannot_keep_up_is_flagged(sim, tmp_path: Path) -> None:
    server = sim(
        "--ttft-ms", "1", "--itl-ms", "1", "--tokens-per-chunk", "1", "--max-running", "1024", "--model", "m"
    )
    _pin(server.proc.pid, 0)
    # Requests of 4 tokens: most of the client's work is then per request (~0.3 ms of CPU each), and
    # its users cannot keep 256 in flight at this server's pace (measured: 40-45). With 50-token
    # requests the client and the simulator were both near saturation, and the flag hung on a few %.
    log, meta, run_dir = _sweep(
        tmp_path,
        server.url,
        "--levels",
        "256",
        "--output-tokens",
        "4",
        "--requests-per-level",
        "4096",
        pin="1",
    )
    client = meta["levels"][0]["client"]
    flag = client["flag"]
    assert flag and flag.startswith("the client was the bottleneck at C=256 ("), (client, log[-3000:])
    assert "add processes (`--processes N`) or worker machines" in flag
    assert client["processes"] == 1 and list(client["per_process"]) == ["local"]
    assert None not in (client["cpu_max"], client["loop_lag_p99_ms"], client["mean_in_flight"]), client
    done = next(line for line in log.splitlines() if "c256 done:" in line)
    assert "WARNING" in done and "the client was the bottleneck at C=256" in done, done
    report = (run_dir / "report.md").read_text()
    assert f"- c256: {flag}" in report
    assert client_flags(load_run(run_dir)) == {0: flag}


def test_a_light_sweep_is_not_flagged(sim, tmp_path: Path) -> None:
    server = sim("--ttft-ms", "50", "--itl-ms", "10", "--model", "m")
    log, meta, run_dir = _sweep(
        tmp_path, server.url, "--levels", "2", "--output-tokens", "50", "--requests-per-level", "8"
    )
    client = meta["levels"][0]["client"]
    assert client["flag"] is None, client
    assert client["processes"] == 1 and client["per_process"]["local"]["samples"] >= 10
    assert client["cpu_max"] < 0.5
    assert 1.8 <= client["mean_in_flight"] <= 2.01  # each user's gap between two requests: a few ms
    assert "c002 done:" in log and "; client ok" in log
    assert "bottleneck" not in (run_dir / "report.md").read_text()
    assert client_flags(load_run(run_dir)) == {}


def test_the_live_in_flight_figure_is_made_again_only_as_the_records_grow() -> None:
    """Made again on every run.json update, the sum over a long level's spans grew without bound
    (3.6M spans a second at 1000 req/s for an hour); it is redone when the records grew by 5 %, and
    always once more at the level's end."""
    assert in_flight_due(None, 0, False)
    assert not in_flight_due(1000, 1000, False) and not in_flight_due(1000, 1000, True)
    assert not in_flight_due(1000, 1049, False) and in_flight_due(1000, 1050, False)
    assert in_flight_due(1000, 1001, True)  # the level ended: from every record
    made, n = [], 10
    for n in range(10, 200_001, 10):  # records as they come, one update per 10
        if in_flight_due(made[-1] if made else None, n, False):
            made.append(n)
    assert sum(made) < 25 * n  # O(records) in all, not O(records) per update


def test_more_in_flight_than_c_is_flagged_with_its_cause() -> None:
    """M2 (review ab9c161): a worker written off as lost came back with its users; C=4 ran 6."""
    assert peak_in_flight([]) is None
    assert peak_in_flight([(0.0, 1.0), (1.0, 2.0)]) == 1  # a hand-off is no overlap
    assert peak_in_flight([(0.0, 2.0), (1.0, 3.0), (1.5, 1.6)]) == 3
    held = ClientFigures(4, {}, 4.0, None, 4)
    assert held.flag() is None and held.over() == []
    over = ClientFigures(4, {}, 4.4, None, 6)
    assert over.over() == ["peak 6 in flight", "mean in flight 4.4"]
    flag = over.flag() or ""
    assert flag.startswith("more than C=4 requests in flight (peak 6 in flight, mean in flight 4.4)")
    assert "add processes" not in flag  # not the client's slowness: more load than C
    assert cell(over).startswith("OVER C: peak 6")
    back = ClientFigures.from_json(4, over.to_json())
    assert back is not None and back.peak_in_flight == 6 and back.flag() == flag
    # Runs recorded before the peak was kept: judged on the mean alone.
    assert ClientFigures(4, {}, 4.4).over() == ["mean in flight 4.4"]
    assert ClientFigures(100, {}, 101.0).over() == []  # within the rounding share


def test_one_long_stall_is_flagged_whatever_the_percentiles() -> None:
    """The review's M15: a 6 s freeze of the Locust process (SIGSTOP, SIGCONT) gave loop lag max
    5,917 ms with a p99 of 6.6 ms and no flag; the report blamed the server."""
    frozen = ProcessLoad(0.2, 6.63, 5916.63, 2400, 30.0, 0.0, 1.0)
    fig = ClientFigures(4, {"local": frozen}, 3.9)
    assert fig.reasons() == ["one stall of 5.9 s"]
    assert fig.flag() == (
        "the client stalled at C=4 (one stall of 5.9 s, over the 1 s bound: the Locust process did not "
        "run, as when it is paused, swapped out or blocked): the level's figures include the stall; "
        "run the level again"
    )
    assert cell(fig).startswith("BOTTLENECK: one stall of 5.9 s") or "stall" in cell(fig)
    # Just under the bound: an idle loop's one-off late wake-up, no verdict.
    assert ClientFigures(4, {"l": ProcessLoad(0.2, 6.0, STALL_MS, 2400, 30.0, 0.0, 1.0)}).flag() is None
    # With a saturated process too, both causes are said, with the capacity fix.
    both = ClientFigures(4, {"l": ProcessLoad(0.97, 6.0, 1500.0, 2400, 30.0, 0.0, 1.0)})
    assert both.reasons() == ["a Locust process at 97% CPU", "one stall of 1.5 s"]
    assert (both.flag() or "").endswith("add processes (`--processes N`) or worker machines")
    # Said per level, labelled as the table labels it: which levels the stall hit.
    levels = [
        LevelMeta(index=0, concurrency=2, client=ClientFigures(2, {"local": load()}, 2.0).to_json()),
        LevelMeta(index=1, concurrency=4, client=fig.to_json()),
    ]
    assert client_notes(levels) == [f"c004: {fig.flag()}"]


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


FREEZE_S = 1.5  # over STALL_MS (1 s) with the probe's interval to spare


def test_a_frozen_locust_process_is_flagged_at_its_level(sim, tmp_path: Path) -> None:
    """SIGSTOP of the Locust process for 1.5 s mid-level, then SIGCONT: that level's verdict names
    the stall, at least as long as the freeze less one probe interval, and the report's notes say
    which level it hit. On a quiet machine the stall is all the process measured of itself, and the
    verdict is the stall's own; on a loaded one the process may also have measured its wait for a
    CPU or a lagging loop, and the verdict is then the bottleneck's, naming the stall among them."""
    import signal
    import time

    from tests.conftest import wait_until

    server = sim("--ttft-ms", "10", "--itl-ms", "5", "--model", "m")
    cmd = specload_cmd(
        "sweep", "--host", server.url, "--input-tokens", "8", "--output-tokens", "200", "--levels", "2",
        "--requests-per-level", "12", "--out", str(tmp_path),
    )  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        locust = wait_until(lambda: _children(proc.pid), 30, "the Locust process")[0]
        wait_until(
            lambda: any(
                (r := d / "records.jsonl").exists() and r.stat().st_size > 0 for d in tmp_path.iterdir()
            ),
            60,
            "a record",
        )
        os.kill(locust, signal.SIGSTOP)
        time.sleep(FREEZE_S)
        os.kill(locust, signal.SIGCONT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out.decode()[-3000:]
    (run_dir,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    client = orjson.loads((run_dir / "run.json").read_bytes())["levels"][0]["client"]
    assert client["loop_lag_max_ms"] >= (FREEZE_S - PROBE_INTERVAL_S) * 1e3 > STALL_MS, client
    fig = ClientFigures.from_json(2, client)
    assert fig is not None
    stall = f"one stall of {client['loop_lag_max_ms'] / 1e3:.1f} s"
    measured_besides = [r for r in fig.reasons() if r != stall]
    said = (
        "the client was the bottleneck at C=2 ("
        if measured_besides
        else f"the client stalled at C=2 ({stall}, "
    )
    assert client["flag"] and client["flag"].startswith(said) and stall in client["flag"], client
    assert f"- c002: {client['flag']}" in (run_dir / "report.md").read_text()
