"""figures.msgpack: a big run's figures kept beside it are the figures its records give, used only
while nothing they came from has changed, and never trusted as more than figures."""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec
import pytest

from specload.analysis import savedfigures
from specload.analysis.metrics import LevelStats
from specload.analysis.run import load_run
from specload.core.records import (
    OK,
    PHASE_MEASURE,
    SPEC_VLLM,
    SRC_USAGE,
    RequestRecord,
    make_record,
    read_records,
)
from specload.core.rundir import RECORDS, RUN_JSON
from specload.core.slo import parse_slo
from specload.present.compare import build_comparison, render_text, to_dict
from specload.present.report import main as report_main
from specload.present.report import render_report
from tests.fixtures.by_records import summarize_level
from tests.fixtures.make_compare_runs import write_reference_pair

SLO = "ttft_p99=2s,tpot_p50=50ms"


@pytest.fixture
def kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep figures for records files of any size (the fixtures are a few KB)."""
    monkeypatch.setattr(savedfigures, "MIN_RECORDS_BYTES", 0)


def _rich_pair(root: Path) -> tuple[Path, Path]:
    """The reference pair with categories, and acceptance as vLLM's per-request metrics give it."""
    base, mtp = write_reference_pair(root)
    for d, spec in ((base, False), (mtp, True)):
        recs = read_records(str(d / RECORDS))
        for r in recs:
            r.category = ("coding", "writing")[r.seq % 2]
            if spec:
                r.spec_drafted, r.spec_accepted, r.spec_hist = 1500, 900, [100, 200, 200]
                r.spec_along, r.spec_source = [[0, 60, 40], [1, 440, 860]], SPEC_VLLM
        (d / RECORDS).write_bytes(b"".join(RequestRecord.to_json(r) + b"\n" for r in recs))
    return base, mtp


def _reasoning_level() -> LevelStats:
    t0 = 1_764_475_200.0
    recs = [
        make_record(
            t_send=t0 + i,
            t_first=t0 + i + 0.1,
            t_last=t0 + i + 1.0,
            t_end=t0 + i + 1.0,
            output_tokens=91,
            level=0,
            concurrency=1,
            phase=PHASE_MEASURE,
            seq=i,
            backend="chat",
            status=OK,
            reason=None,
            http_status=200,
            output_tokens_source=SRC_USAGE,
            prompt_tokens=8,
            requested_output_tokens=91,
            requested_prompt_tokens=8,
            chunks=91,
            itl_max_s=0.01,
            spec_verify_ct=None,
            worker="w",
            t_first_answer=t0 + i + 0.5,
            reasoning_tokens=40,
            reasoning_tokens_source=SRC_USAGE,
        )
        for i in range(4)
    ]
    return summarize_level(recs, 1, slo=parse_slo("ttft_p99=200ms"))


def test_every_figure_comes_back_as_it_was_kept(tmp_path: Path) -> None:
    base, mtp = _rich_pair(tmp_path)
    levels = [*load_run(base, parse_slo(SLO)).levels, *load_run(mtp, parse_slo(SLO)).levels]
    levels.append(_reasoning_level())
    assert all(s.mix is not None and s.mix.categories for s in levels[:-1])
    assert any(s.acceptance is not None for s in levels) and levels[-1].reasoning is not None
    assert all(s.slo is not None for s in levels)
    saved = savedfigures.Saved(savedfigures.FORMAT, "k", levels, ["a note"])
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(saved), type=savedfigures.Saved)
    assert back.levels == levels  # floats, dict keys, tuples and nested figures all as they were


def test_report_and_compare_read_kept_figures_and_say_the_same(
    tmp_path: Path, kept: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, mtp = _rich_pair(tmp_path)
    slo = parse_slo(SLO)
    first = [load_run(base, slo), load_run(mtp, slo)]
    assert (base / savedfigures.FIGURES_FILE).is_file() and (mtp / savedfigures.FIGURES_FILE).is_file()

    def no_decoding(*_: object) -> None:
        raise AssertionError("records decoded although their figures were kept")

    monkeypatch.setattr("specload.analysis.run._read_columns", no_decoding)
    again = [load_run(base, slo), load_run(mtp, slo)]
    assert [r.levels for r in again] == [r.levels for r in first]
    assert [r.notices for r in again] == [r.notices for r in first]
    assert render_report(again[1]) == render_report(first[1])
    comp_again, comp_first = build_comparison(again), build_comparison(first)
    assert render_text(comp_again) == render_text(comp_first) and to_dict(comp_again) == to_dict(comp_first)


def test_any_change_to_what_they_came_from_reads_the_records_again(
    tmp_path: Path, kept: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, mtp = write_reference_pair(tmp_path)
    before = load_run(mtp)
    recs = read_records(str(mtp / RECORDS))
    extra = recs[-1]
    extra.seq += 10_000
    with (mtp / RECORDS).open("ab") as f:
        f.write(RequestRecord.to_json(extra) + b"\n")
    after = load_run(mtp)
    assert sum(s.sent for s in after.levels) == sum(s.sent for s in before.levels) + 1
    assert load_run(mtp).levels == after.levels  # and kept anew

    judged = load_run(mtp, parse_slo("ttft_p99=1ms"))  # another SLO: another key
    assert all(s.slo is not None and not s.slo.met for s in judged.levels if s.ok)

    strict = parse_slo("ttft_p99=1ms")
    key = savedfigures.key_of(mtp, strict)
    assert savedfigures.load(mtp, key) is not None
    monkeypatch.setattr(savedfigures, "code_digest", lambda: "the figure code of another specload")
    assert savedfigures.key_of(mtp, strict) != key
    assert savedfigures.load(mtp, savedfigures.key_of(mtp, strict)) is None


def test_reread_decodes_the_records(tmp_path: Path, kept: None, monkeypatch: pytest.MonkeyPatch) -> None:
    _, mtp = write_reference_pair(tmp_path)
    load_run(mtp)
    decoded: list[Path] = []
    real = savedfigures.load

    def counting(run_dir: Path, key: str) -> savedfigures.Saved | None:
        decoded.append(run_dir)
        return real(run_dir, key)

    monkeypatch.setattr(savedfigures, "load", counting)
    assert report_main([str(mtp), "--no-write", "--format", "json", "--reread"]) == 0
    assert decoded == []
    assert report_main([str(mtp), "--no-write", "--format", "json"]) == 0
    assert decoded == [mtp]


def test_a_running_or_small_run_keeps_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, mtp = write_reference_pair(tmp_path)
    load_run(mtp)
    assert not (mtp / savedfigures.FIGURES_FILE).exists()  # a few KB of records: not worth a file
    monkeypatch.setattr(savedfigures, "MIN_RECORDS_BYTES", 0)
    meta = json.loads((mtp / RUN_JSON).read_text())
    meta["status"] = "running"
    (mtp / RUN_JSON).write_text(json.dumps(meta))
    load_run(mtp)
    assert not (mtp / savedfigures.FIGURES_FILE).exists()  # its records still grow


@pytest.mark.parametrize("kind", ["garbage", "other key", "fifo", "link to /dev/zero", "too big"])
def test_a_file_that_is_not_our_figures_is_ignored(tmp_path: Path, kept: None, kind: str) -> None:
    _, mtp = write_reference_pair(tmp_path)
    truth = load_run(mtp).levels
    path = mtp / savedfigures.FIGURES_FILE
    path.unlink()
    if kind == "garbage":
        path.write_bytes(b"\x93\x01\xa1k")
    elif kind == "other key":
        forged = [LevelStats(concurrency=1, repeat=0, label="c001", ok=999)]
        path.write_bytes(
            msgspec.msgpack.encode(savedfigures.Saved(savedfigures.FORMAT, "x" * 64, forged, []))
        )
    elif kind == "fifo":
        os.mkfifo(path)  # opened without blocking, refused as no regular file: no hang
    elif kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    else:
        path.write_bytes(b"\0" * (savedfigures.MAX_BYTES + 1))
    assert load_run(mtp).levels == truth


@pytest.mark.parametrize("step", ["mkstemp", "replace"])
def test_a_directory_that_cannot_take_the_file_goes_without(
    tmp_path: Path, kept: None, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    _, mtp = write_reference_pair(tmp_path)
    truth = load_run(mtp, reread=True)
    (mtp / savedfigures.FIGURES_FILE).unlink()

    def full(*_: object, **__: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(savedfigures.tempfile if step == "mkstemp" else savedfigures.os, step, full)
    assert load_run(mtp).levels == truth.levels
    assert [p.name for p in mtp.iterdir() if "figures" in p.name] == []  # no half-written file left
