"""specload.rundir: run directories are never reused, records land on disk as they come."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import orjson
import pytest

from specload import rundir
from specload.records import read_records
from specload.rundir import (
    RECORDS,
    RUN_JSON,
    RecordWriter,
    claim_run_dir,
    new_run_dir,
    read_json,
    write_json_atomic,
)


@pytest.fixture
def frozen_time(monkeypatch: pytest.MonkeyPatch) -> time.struct_time:
    """Every call of new_run_dir sees the same second."""
    fixed = time.gmtime(1764475200)
    monkeypatch.setattr(rundir.time, "gmtime", lambda *_a: fixed)
    return fixed


def test_new_run_dir_name(tmp_path: Path, frozen_time: time.struct_time) -> None:
    path = new_run_dir(str(tmp_path / "results"), "baseline")
    assert path == str(tmp_path / "results" / "baseline-20251130T040000Z")
    assert os.path.isdir(path)
    assert os.listdir(path) == []


def test_new_run_dir_real_clock_format(tmp_path: Path) -> None:
    name = os.path.basename(new_run_dir(str(tmp_path), "x"))
    assert re.fullmatch(r"x-\d{8}T\d{6}Z", name), name


def test_new_run_dir_never_reuses_in_the_same_second(tmp_path: Path, frozen_time: time.struct_time) -> None:
    paths = [new_run_dir(str(tmp_path), "mtp") for _ in range(3)]
    assert len(set(paths)) == 3
    assert all(os.path.isdir(p) for p in paths)
    base = str(tmp_path / "mtp-20251130T040000Z")
    assert paths == [base, base + "-2", base + "-3"]


def test_new_run_dir_skips_existing_run(tmp_path: Path, frozen_time: time.struct_time) -> None:
    first = new_run_dir(str(tmp_path), "a")
    (Path(first) / RUN_JSON).write_text("{}")
    second = new_run_dir(str(tmp_path), "a")
    assert second != first
    assert (Path(first) / RUN_JSON).read_text() == "{}"


@pytest.mark.parametrize(
    ("label", "safe"),
    [
        ("my run/1", "my-run-1"),
        ("../../etc", "..-..-etc"),
        ("", "run"),
        ("///", "run"),
        ("a.b_c-d", "a.b_c-d"),
    ],
)
def test_new_run_dir_sanitizes_label(
    tmp_path: Path, frozen_time: time.struct_time, label: str, safe: str
) -> None:
    path = new_run_dir(str(tmp_path), label)
    assert os.path.basename(path) == f"{safe}-20251130T040000Z"
    assert os.path.dirname(path) == str(tmp_path)  # never escapes the results directory


def test_claim_run_dir_creates_and_accepts_empty(tmp_path: Path) -> None:
    target = tmp_path / "exact" / "run"
    assert claim_run_dir(str(target)) == str(target)
    assert target.is_dir()
    assert claim_run_dir(str(target)) == str(target)  # still empty: fine to use


@pytest.mark.parametrize("existing", [RUN_JSON, RECORDS])
def test_claim_run_dir_refuses_a_run(tmp_path: Path, existing: str) -> None:
    (tmp_path / existing).write_text('{"status": "completed"}')
    with pytest.raises(FileExistsError, match="already holds a run"):
        claim_run_dir(str(tmp_path))
    assert (tmp_path / existing).read_text() == '{"status": "completed"}'


def test_record_writer_flushes_each_record(tmp_path: Path) -> None:
    w = RecordWriter(str(tmp_path))
    try:
        w.write({"level": 0, "seq": 0})
        lines = (tmp_path / RECORDS).read_bytes().splitlines()  # read while the writer is still open
        assert [orjson.loads(x) for x in lines] == [{"level": 0, "seq": 0}]
        w.write({"level": 0, "seq": 1})
        lines = (tmp_path / RECORDS).read_bytes().splitlines()
        assert [orjson.loads(x)["seq"] for x in lines] == [0, 1]
        assert w.count == 2
        assert (tmp_path / RECORDS).read_bytes().endswith(b"\n")
    finally:
        w.close()
    w.close()  # closing twice is harmless


def test_record_writer_appends_never_truncates(tmp_path: Path) -> None:
    w1 = RecordWriter(str(tmp_path))
    w1.write({"seq": 0})
    w1.close()
    w2 = RecordWriter(str(tmp_path))
    w2.write({"seq": 1})
    w2.close()
    lines = (tmp_path / RECORDS).read_bytes().splitlines()
    assert [orjson.loads(x)["seq"] for x in lines] == [0, 1]
    assert w2.count == 1


def test_record_writer_output_reads_back_as_records(tmp_path: Path) -> None:
    from specload.records import OK, SRC_USAGE, RequestRecord

    r = RequestRecord(
        level=0, concurrency=1, phase="measure", seq=0, backend="openai", status=OK, reason=None,
        http_status=200, t_send=1.0, t_first=1.1, t_last=2.0, t_end=2.1, ttft_s=0.1, e2e_s=1.1,
        output_tokens=10, output_tokens_source=SRC_USAGE, prompt_tokens=8, requested_output_tokens=10,
        requested_prompt_tokens=8, chunks=10, tpot_s=0.1, itl_max_s=0.12, per_request_tok_s=9.09,
        decode_tok_s=10.0, spec_verify_ct=None, worker="local",
    )  # fmt: skip
    w = RecordWriter(str(tmp_path))
    w.write(orjson.loads(r.to_json()))
    w.close()
    assert read_records(str(tmp_path / RECORDS)) == [r]


def test_write_json_atomic(tmp_path: Path) -> None:
    path = str(tmp_path / RUN_JSON)
    write_json_atomic(path, {"status": "running", "levels": [{"index": 0}]})
    assert read_json(path) == {"status": "running", "levels": [{"index": 0}]}
    write_json_atomic(path, {"status": "completed", "b": 1, "a": 2})
    assert read_json(path) == {"status": "completed", "b": 1, "a": 2}
    assert sorted(os.listdir(tmp_path)) == [RUN_JSON]  # no .tmp left behind
    text = Path(path).read_text()
    assert text.index('"a"') < text.index('"b"') < text.index('"status"')  # sorted keys
    assert "\n  " in text  # indented for people to read


def test_write_json_atomic_keeps_old_file_on_failure(tmp_path: Path) -> None:
    path = str(tmp_path / RUN_JSON)
    write_json_atomic(path, {"status": "running"})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"status": {1, 2}})  # a set is not JSON
    assert read_json(path) == {"status": "running"}
