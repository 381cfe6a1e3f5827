"""tok/s over time is one series live and after the level: the streamed-token samples the owner
writes to streamed.jsonl (specload.analysis.streamed), drawn by one function for the live page, the
page after the level and ``specload report`` (its JSON, --plot and --format html).

On the simulator's batch engine every prompt's prefill is one long step that stalls every stream
in the batch: a dip of tok/s inside the streams, which the records (each request's tokens spread
evenly from its first to its last) average away, and the streamed samples keep.
"""

from __future__ import annotations

import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import orjson
import pytest

from specload.analysis.metrics import SERIES_STREAMED, streamed_tok_s
from specload.analysis.run import load_run
from specload.analysis.streamed import STREAMED, StreamSample, StreamTally, read_streamed
from tests.conftest import Procs, free_port, specload_cmd, wait_until

pytestmark = pytest.mark.slow  # a web UI and a sweep of a few seconds

# A step is 10 ms (one token for each stream); a prompt's prefill takes one step of 1.2 s more.
SIM = (
    "--engine",
    "batch",
    "--preset",
    "baseline",
    "--param",
    "decode_ms=[[1, 10.0]]",
    "--param",
    "ctx_us_per_token=0",
    "--param",
    "prefill_us_per_token=600",
    "--model",
    "m",
)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read()


def _post(url: str, form: dict[str, str]) -> bytes:
    data = urllib.parse.urlencode(form).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as resp:
        return resp.read()


def test_streamed_tok_s_is_the_rise_of_the_samples_per_bucket() -> None:
    # 100 tokens/s for 2 s, a stall of 1 s, 100 tokens/s again: buckets of 1 s from t=10
    t = [10.0, 11.0, 12.0, 13.0, 14.0, 14.5]
    n = [0, 100, 200, 200, 300, 350]
    assert streamed_tok_s(t, n, (10.0, 14.5)) == [100.0, 100.0, 0.0, 100.0, 100.0]
    # between two samples the rise is linear, outside them flat; a partial last bucket by its length
    assert streamed_tok_s(t[:2], n[:2], (9.5, 11.25)) == pytest.approx([50.0, 50.0 / 0.75])
    assert streamed_tok_s([1.0], [5], (0.0, 2.0)) == []
    # a count that reached the owner after the level's last end came by that end
    assert streamed_tok_s([10.0, 11.0, 11.8], [0, 100, 180], (10.0, 11.5)) == pytest.approx([100.0, 160.0])


def test_a_late_count_of_an_ended_level_is_sampled() -> None:
    tally = StreamTally()
    tally.note(0, "local", 100, 0.8)
    assert [(s.level, s.t, s.tokens) for s in tally.sample(0, 1.0)] == [(0, 0.8, 100)]  # timed by its count
    tally.note(0, "local", 150, 1.6)  # the process's last word on level 0, after level 1 began
    tally.note(1, "local", 20, 1.9)
    assert [(s.level, s.t, s.tokens) for s in tally.sample(1, 2.0)] == [(0, 1.6, 150), (1, 1.9, 20)]
    assert [(s.level, s.tokens) for s in tally.sample(None, 3.0)] == []  # nothing grew
    assert [(s.t, s.tokens) for s in tally.sample(1, 3.0)] == [(3.0, 20)]  # the total held until now
    assert StreamSample.from_dict(orjson.loads(tally.samples[0][-1].to_json())) == tally.samples[0][-1]


def test_a_prefill_stall_is_as_deep_after_the_level_as_live(sim, procs: Procs, tmp_path: Path) -> None:
    server = sim(*SIM)
    web_port = free_port()
    procs.popen(
        specload_cmd(
            "ui",
            "--host",
            server.url,
            "--no-web-auth",
            "--web-host",
            "127.0.0.1",
            "--web-port",
            str(web_port),
            "--out",
            str(tmp_path),
        )
    )
    base = f"http://127.0.0.1:{web_port}"

    def _up() -> bool:
        try:
            return orjson.loads(_get(base + "/specload/live"))["state"] is not None
        except OSError:
            return False

    wait_until(_up, 60, "the web UI")
    form = {
        "host": server.url,
        "levels": "4",
        "input_tokens": "2000",
        "output_tokens": "400",
        "output_dist": "uniform:150:400",
        "requests_per_level": "16",
        "warmup": "0",
    }
    assert orjson.loads(_post(base + "/swarm", form))["success"]
    live_points: list[list[float]] = []

    def _done() -> dict | None:
        live = orjson.loads(_get(base + "/specload/live"))
        s = live.get("series")
        if s and s.get("running") and len(s["points"]) >= len(live_points):
            live_points[:] = s["points"]
        return live if live["state"] == "stopped" and live["run"] and live["run"]["report"] else None

    live = wait_until(_done, 120, "the sweep and its run directory", interval=0.25)
    run_dir = Path(live["run"]["run_dir"])
    after = live["series"]
    assert after["source"] == SERIES_STREAMED and not after["running"], after
    assert (run_dir / STREAMED).exists() and read_streamed(run_dir)[0]
    report = orjson.loads(
        subprocess.run(
            specload_cmd("report", str(run_dir), "--format", "json", "--no-write"),
            capture_output=True,
            timeout=60,
        ).stdout
    )
    series = report[0]["tok_s_series"]
    assert report[0]["tok_s_series_source"] == SERIES_STREAMED
    # the page after the level is the report's series, to the page's rounding
    assert [p[1] for p in after["points"]] == [round(v, 1) for v in series]
    live_values = [p[1] for p in live_points]
    assert len(live_values) >= 4, live_points
    # the stalls: live, some second between the level's first and last busy ones (above half its
    # best second) has less than a third of the best; after the level as deep (within 15% of the
    # peak) and the peak as high
    peak_live, peak = max(live_values), max(series)
    assert min(_busy(live_values)) < peak_live / 3, live_values
    assert min(_busy(series)) < peak / 3, series
    assert abs(min(_busy(series)) - min(_busy(live_values))) <= 0.15 * peak_live, (series, live_values)
    assert abs(peak - peak_live) <= 0.15 * peak_live, (series, live_values)
    # the records alone spread each request's tokens over its stream: the stall averaged away
    records_only = tmp_path / "records-only"
    shutil.copytree(run_dir, records_only, ignore=shutil.ignore_patterns(STREAMED))
    spread = load_run(records_only).levels[0].tok_s_series
    assert min(_busy(spread, peak)) > min(_busy(series)) + 0.1 * peak, (spread, series)


def _busy(values: list[float], peak: float | None = None) -> list[float]:
    """The values from the first to the last above half the peak (the level's own or ``peak``):
    without the first prefill of every prompt at once and the drain."""
    half = (max(values) if peak is None else peak) / 2
    above = [i for i, v in enumerate(values) if v > half]
    return values[above[0] : above[-1] + 1]


def test_a_stream_sample_line_reads_back_and_a_foreign_one_is_none() -> None:
    """streamed.jsonl's line as the module's docstring gives it; one without "v" (version 1) reads;
    a line of wrong types or missing fields is no sample."""
    s = StreamSample(2, 1700000000.25, 1234)
    assert orjson.loads(s.to_json()) == {"v": 1, "level": 2, "t": 1700000000.25, "tokens": 1234}
    assert StreamSample.from_dict(orjson.loads(s.to_json())) == s
    assert StreamSample.from_dict({"level": 0, "t": 5, "tokens": 3, "x": 1}) == StreamSample(0, 5.0, 3)
    for bad in (
        {"level": True, "t": 1.0, "tokens": 1},
        {"level": 0, "t": "1", "tokens": 1},
        {"level": 0, "tokens": 1},
    ):
        assert StreamSample.from_dict(bad) is None
    assert StreamSample.from_dict([1]) is None and StreamSample.from_dict(None) is None
