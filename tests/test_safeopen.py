"""A run directory, a foreign result or a dataset may hold a FIFO, a link to a device or a huge file
(an archive unpacked into results/ keeps them): every reader goes through specload.core.safeopen,
which refuses them at once, and the web UI lists runs off its event loop (reliability review M13, L4)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import gevent
import orjson
import pytest

from specload.analysis.run import load_run
from specload.core import safeopen
from specload.core.rundir import read_json, read_run_meta
from specload.present.compare import CompareError, run_compare
from specload.present.webview import list_runs
from specload.workload.datasets import DatasetError, jsonl_pairs
from tests.conftest import Procs, free_port, specload_cmd, wait_until

FIX = Path(__file__).parent / "fixtures" / "foreign"


def _within(seconds: float, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` in a daemon thread: its result, or a failure when it has not returned in time
    (a read that blocks on a FIFO would hold the test forever otherwise)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn(*args)
        except BaseException as e:
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{getattr(fn, '__name__', fn)} still reading after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def _bad(path: Path, kind: str) -> None:
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_fifo_or_a_device_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    p = tmp_path / "run.json"
    _bad(p, kind)
    with pytest.raises(safeopen.UnsafeFile, match="FIFO" if kind == "fifo" else "device"):
        _within(5, safeopen.read_bytes, p)
    with pytest.raises(OSError):
        _within(5, read_json, str(p))


def test_a_regular_file_reads_through_a_link_and_a_big_one_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_bytes(b'{"a": 1}')
    (tmp_path / "link.json").symlink_to(real)
    assert orjson.loads(safeopen.read_bytes(tmp_path / "link.json")) == {"a": 1}
    with pytest.raises(safeopen.UnsafeFile, match="more than the 4"):
        safeopen.read_bytes(real, max_bytes=4)
    with pytest.raises(safeopen.UnsafeFile, match="directory"):
        safeopen.read_bytes(tmp_path)
    with pytest.raises(FileNotFoundError):
        safeopen.read_bytes(tmp_path / "absent")


def test_a_read_that_outlasts_its_deadline_is_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "big.jsonl"
    p.write_bytes(b"x" * (3 << 20))  # three chunks
    clock = iter([0.0, 0.0, 10.0, 20.0, 30.0])
    monkeypatch.setattr(safeopen.time, "monotonic", lambda: next(clock))
    with pytest.raises(safeopen.UnsafeFile, match="not read within 5 s"):
        safeopen.read_bytes(p, deadline_s=5)


@pytest.mark.parametrize("name", ["run.json", "records.jsonl", "server_samples.jsonl", "streamed.jsonl"])
@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_run_directory_file_that_is_no_regular_file_is_left_out(
    tmp_path: Path, name: str, kind: str
) -> None:
    d = tmp_path / "run"
    shutil.copytree(FIX / "specload", d)
    good = load_run(d, keep=False)
    _bad(d / name, kind)
    run = _within(20, load_run, d, None, 1, False, False)
    said = "\n".join(run.notices)
    if name in ("run.json", "records.jsonl", "server_samples.jsonl"):
        assert ("FIFO" if kind == "fifo" else "device") in said, said
    if name == "records.jsonl":
        assert all(lv.ok == 0 for lv in run.levels)
    elif name == "streamed.jsonl":
        assert [lv.agg_tok_s for lv in run.levels] == [lv.agg_tok_s for lv in good.levels]


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_genai_bench_folder_with_a_fifo_or_a_device_is_refused(tmp_path: Path, kind: str) -> None:
    folder = tmp_path / "genai"
    shutil.copytree(FIX / "genai-bench", folder)
    _bad(folder / "zz.json", kind)
    with pytest.raises(CompareError, match="FIFO" if kind == "fifo" else "device"):
        _within(20, lambda: run_compare([FIX / "specload", folder], out=tmp_path, plot=False))


def test_a_dataset_that_is_a_fifo_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "prompts.jsonl"
    os.mkfifo(p)
    with pytest.raises(DatasetError, match="FIFO"):
        _within(5, lambda: list(jsonl_pairs(p)))


def test_the_runs_list_skips_a_run_whose_run_json_is_a_fifo(tmp_path: Path) -> None:
    shutil.copytree(FIX / "specload", tmp_path / "good-20261201T000000Z")
    for name, kind in (("fifo-20261204T000000Z", "fifo"), ("zero-20261204T000000Z", "zero")):
        (tmp_path / name).mkdir()
        _bad(tmp_path / name / "run.json", kind)
    assert [r["name"] for r in _within(10, list_runs, tmp_path)] == ["good-20261201T000000Z"]
    with pytest.raises(OSError):
        _within(5, read_run_meta, tmp_path / "fifo-20261204T000000Z")


def test_off_hub_keeps_the_hub_running_and_gives_up_at_its_deadline() -> None:
    from specload.locust.offhub import off_hub

    r, w = os.pipe()  # a read that blocks in the kernel until written to, as a FIFO's does
    ticks = []

    def tick() -> None:
        while True:
            ticks.append(time.monotonic())
            gevent.sleep(0.01)

    ticker = gevent.spawn(tick)
    try:
        with pytest.raises(gevent.Timeout):
            off_hub(os.read, r, 1, timeout=0.5)
        # the hub kept going while the thread was blocked (a read on the hub would let it tick once at
        # most; a loaded machine may starve it for a while, so not the 50 of a quiet one)
        assert len(ticks) >= 3, ticks
        os.write(w, b"x")  # lets the blocked thread end
        assert off_hub(lambda: 42, timeout=5) == 42
    finally:
        ticker.kill()
        os.close(r)
        os.close(w)


# ------------------------------------------------------------------ the web UI while a sweep runs


def _run_json(run_dir: Path) -> dict[str, Any]:
    """run.json, or a running one's stand-in before the sweep first writes it."""
    try:
        return json.loads((run_dir / "run.json").read_bytes())  # type: ignore[no-any-return]
    except FileNotFoundError:
        return {"status": "running"}


def _get(url: str, timeout: float = 15) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def _post(url: str, form: dict[str, str]) -> bytes:
    import urllib.parse
    import urllib.request

    data = urllib.parse.urlencode(form).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as resp:
        return bytes(resp.read())


def test_a_fifo_in_the_results_folder_does_not_freeze_a_running_sweep(
    sim: Any, procs: Procs, tmp_path: Path
) -> None:
    """The review's M13 in the UI: the Runs tab read a FIFO's run.json on the hub, and the sweep
    running in the same process froze (loop lag max 5.9 s, 28 % less Agg tok/s)."""
    server = sim("--ttft-ms", "10", "--itl-ms", "5")
    results = tmp_path / "results"
    results.mkdir()
    (results / "x-20261204T000000Z").mkdir()
    os.mkfifo(results / "x-20261204T000000Z" / "run.json")
    port = free_port()
    ui = procs.popen(
        specload_cmd(
            "ui",
            "--no-web-auth",
            "--host",
            server.url,
            "--web-host",
            "127.0.0.1",
            "--web-port",
            str(port),
            "--out",
            str(results),
        ),
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: _get(base + "/specload/live", 2)[0] == 200, 30, "the web UI")
    form = {
        "host": server.url,
        "levels": "2",
        "input_tokens": "8",
        "output_tokens": "200",
        "requests_per_level": "8",
        "user_count": "1",
        "spawn_rate": "1",
    }
    assert orjson.loads(_post(base + "/swarm", form))["success"]
    run_dir = wait_until(
        lambda: next((p for p in results.iterdir() if p.name != "x-20261204T000000Z"), None),
        60,
        "the sweep's run directory",
    )
    wait_until(lambda: (run_dir / "records.jsonl").exists(), 30, "the first record")
    # Before, the runs list opened the FIFO on the sweep's loop and blocked there for good (nobody
    # writes to it): no answer, and no record either. The bounds below are that, with room for a
    # loaded machine, not the quick answer it gives on a quiet one (tens of ms).
    status, body = _get(base + "/specload/runs", 30)
    assert status == 200, body
    assert "x-20261204T000000Z" not in [r["name"] for r in json.loads(body)["runs"]]
    meta = wait_until(
        lambda: (m := _run_json(run_dir))["status"] != "running" and m,
        90,
        "the sweep to end",
    )
    assert meta["status"] == "completed", procs.log(ui)
    lag = meta["levels"][0]["client"]["loop_lag_max_ms"]
    assert lag < 5000, lag


# ------------------------------------------------------------------ foreign files that cannot be true (L4)


def _vllm(tmp_path: Path, **changes: Any) -> Path:
    doc = json.loads((FIX / "vllm.json").read_text().splitlines()[0])
    doc.update(changes)
    p = tmp_path / "vllm-x.json"
    p.write_text(json.dumps(doc))
    return p


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"output_throughput": float("nan")}, "output|agg_tok_s = nan \\(not finite\\)"),
        ({"output_throughput": float("inf")}, "not finite"),
        ({"output_throughput": -100.0}, "agg_tok_s = -100.0 \\(negative\\)"),
        ({"output_throughput": 1e308}, "implausibly large"),
        ({"median_ttft_ms": -1000.0, "ttfts": None}, "ttft_p50_ms = -1000.0 \\(negative\\)"),
        ({"errors": [""] * 40}, "per-request lists differ in length"),
    ],
)
def test_a_foreign_figure_that_cannot_be_a_measurement_is_refused_by_name(
    tmp_path: Path, changes: dict[str, Any], said: str
) -> None:
    with pytest.raises(CompareError, match=said):
        run_compare([FIX / "specload", _vllm(tmp_path, **changes)], out=tmp_path, plot=False)


def test_a_foreign_file_nested_too_deep_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "deep.json"
    p.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(CompareError, match="nested too deep"):
        run_compare([FIX / "specload", p], out=tmp_path, plot=False)
