"""A big run's figures kept for the next report and compare (specload/analysis/figcache.py): used exactly
when nothing they were made from changed, never when they could be stale or came from elsewhere."""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

from specload.analysis import columns, figcache, run
from specload.core.slo import parse_slo
from specload.present.report import main as report_main
from tests.test_scale import exact, write_odd_run


@pytest.fixture
def big(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The odd run of test_scale, counted as big; the key file in this test's own cache home."""
    monkeypatch.setattr(figcache, "MIN_BYTES", 1000)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return write_odd_run(tmp_path / "run", 5)


def figures(r: run.Run) -> list[object]:
    return [exact(asdict(s)) for s in r.levels] + [r.notices, r.crosscheck, exact(r.info.to_json())]


def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each read of a records.jsonl, as it happens."""
    seen: list[str] = []
    real = columns.read_columns_and_tallies

    def spy(path: str, *args: object, **kwargs: object) -> object:
        seen.append(path)
        return real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(run, "read_columns_and_tallies", spy)
    return seen


def test_kept_figures_are_the_figures_and_spare_the_reading(
    big: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = run.load_run(big, keep=True)
    assert (big / figcache.CACHE_FILE).exists()
    seen = reads(monkeypatch)
    again = run.load_run(big)
    assert seen == [] and figures(again) == figures(first) and again.run_dir == big
    moved = big.parent / "moved"
    shutil.move(big, moved)  # a moved directory keeps its files' identity: still valid, at its new path
    assert run.load_run(moved).run_dir == moved and seen == []


@pytest.mark.parametrize(
    "change",
    ["append a record", "touch records", "edit run.json", "add server samples", "other slo", "other code"],
)
def test_any_change_reads_the_records_again(big: Path, change: str, monkeypatch: pytest.MonkeyPatch) -> None:
    run.load_run(big, keep=True)
    slo = None
    records = big / "records.jsonl"
    if change == "append a record":
        with records.open("ab") as f:
            f.write(records.read_bytes().splitlines()[5] + b"\n")
    elif change == "touch records":
        st = records.stat()
        import os

        os.utime(records, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    elif change == "edit run.json":
        (big / "run.json").write_text((big / "run.json").read_text().replace('"odd"', '"odd2"'))
    elif change == "add server samples":
        (big / "server_samples.jsonl").write_text("")
    elif change == "other slo":
        slo = parse_slo("ttft_p99=1s")
    else:
        monkeypatch.setattr(figcache, "code_hash", lambda: b"another specload")
    seen = reads(monkeypatch)
    fresh = run.load_run(big, slo if slo is not None else run.RUN_SLO)
    assert len(seen) == 1
    shutil.move(big / figcache.CACHE_FILE, big.parent / "kept")
    assert figures(run.load_run(big, slo if slo is not None else run.RUN_SLO)) == figures(fresh)


@pytest.mark.parametrize("how", ["flipped byte", "another machine's key", "truncated", "not ours"])
def test_a_cache_that_cannot_be_trusted_is_ignored(
    big: Path, how: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Unpickling runs code: a cache whose MAC this machine's key does not give is never unpickled."""
    want = figures(run.load_run(big, keep=True))
    path = big / figcache.CACHE_FILE
    data = bytearray(path.read_bytes())
    if how == "flipped byte":
        data[-10] ^= 1
    elif how == "truncated":
        del data[len(data) // 2 :]
    elif how == "not ours":
        data = bytearray(b"\x80\x04K\x01.")  # a bare pickle
    path.write_bytes(bytes(data))
    if how == "another machine's key":
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "elsewhere"))
    unpickled: list[bytes] = []
    real_loads = figcache.pickle.loads
    monkeypatch.setattr(figcache.pickle, "loads", lambda b: unpickled.append(b) or real_loads(b))
    seen = reads(monkeypatch)
    assert figures(run.load_run(big)) == want and len(seen) == 1 and unpickled == []


def test_small_runs_and_no_write_keep_nothing(
    big: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert report_main([str(big), "--no-write", "--format", "json"]) == 0
    assert not (big / figcache.CACHE_FILE).exists() and not (big / "report.md").exists()
    assert report_main([str(big), "--format", "json"]) == 0
    assert (big / figcache.CACHE_FILE).exists() and (big / "report.md").exists()
    (big / figcache.CACHE_FILE).unlink()
    monkeypatch.setattr(figcache, "MIN_BYTES", 1 << 40)
    assert report_main([str(big), "--format", "json"]) == 0
    assert not (big / figcache.CACHE_FILE).exists()
    capsys.readouterr()


def test_the_key_file_is_private(big: Path, tmp_path: Path) -> None:
    run.load_run(big, keep=True)
    key = tmp_path / "cache" / "specload" / "figures.key"
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_bytes()) == 32
