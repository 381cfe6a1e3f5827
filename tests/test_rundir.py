"""specload.core.rundir: run directories are never reused, records land on disk as they come, and run.json
reads back typed whatever version wrote it."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import orjson
import pytest

from specload.core import rundir
from specload.core.records import read_records
from specload.core.rundir import (
    RECORDS,
    RUN_JSON,
    SCHEMA_VERSION,
    LevelMeta,
    RecordWriter,
    RunMeta,
    ServerInfo,
    claim_run_dir,
    new_run_dir,
    read_json,
    read_jsonl,
    read_run_meta,
    safe_name,
    write_json_atomic,
    write_run_meta,
)

FIXTURES = Path(__file__).parent / "fixtures"


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
        w.write(b'{"level":0,"seq":0}')
        lines = (tmp_path / RECORDS).read_bytes().splitlines()  # read while the writer is still open
        assert [orjson.loads(x) for x in lines] == [{"level": 0, "seq": 0}]
        w.write(b'{"level":0,"seq":1}')
        lines = (tmp_path / RECORDS).read_bytes().splitlines()
        assert [orjson.loads(x)["seq"] for x in lines] == [0, 1]
        assert w.count == 2
        assert (tmp_path / RECORDS).read_bytes().endswith(b"\n")
    finally:
        w.close()
    w.close()  # closing twice is harmless


def test_record_writer_appends_never_truncates(tmp_path: Path) -> None:
    w1 = RecordWriter(str(tmp_path))
    w1.write(b'{"seq":0}')
    w1.close()
    w2 = RecordWriter(str(tmp_path))
    w2.write(b'{"seq":1}')
    w2.close()
    lines = (tmp_path / RECORDS).read_bytes().splitlines()
    assert [orjson.loads(x)["seq"] for x in lines] == [0, 1]
    assert w2.count == 1


def test_record_writer_output_reads_back_as_records(tmp_path: Path) -> None:
    from specload.core.records import OK, SRC_USAGE, RequestRecord

    r = RequestRecord(
        level=0,
        concurrency=1,
        phase="measure",
        seq=0,
        backend="openai",
        status=OK,
        reason=None,
        http_status=200,
        t_send=1.0,
        t_first=1.1,
        t_last=2.0,
        t_end=2.1,
        ttft_s=0.1,
        e2e_s=1.1,
        output_tokens=10,
        output_tokens_source=SRC_USAGE,
        prompt_tokens=8,
        requested_output_tokens=10,
        requested_prompt_tokens=8,
        chunks=10,
        tpot_s=0.1,
        itl_max_s=0.12,
        per_request_tok_s=9.09,
        decode_tok_s=10.0,
        spec_verify_ct=None,
        worker="local",
    )
    w = RecordWriter(str(tmp_path))
    w.write(r.to_json())
    w.close()
    assert b"null" not in (tmp_path / RECORDS).read_bytes()  # spec_verify_ct and reason left out
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


def test_safe_name() -> None:
    assert (
        safe_name("my run/1") == "my-run-1"
        and safe_name("///") == "run"
        and safe_name("a.b_c-d") == "a.b_c-d"
    )


def test_read_jsonl_skips_blank_torn_and_malformed_lines(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"t": 1}\n\nnot json\n[2]\n{"t": 3, "runn')
    assert list(read_jsonl(path)) == [{"t": 1}, [2]]
    with pytest.raises(OSError):
        list(read_jsonl(tmp_path / "missing.jsonl"))


# ---------------------------------------------------------------- run.json schema


def level_as_written(index: int = 0, **over: object) -> dict[str, object]:
    """A level entry with every key the sweep's owner writes (levels.LevelState.meta)."""
    return {
        "index": index,
        "concurrency": 16,
        "repeat": 0,
        "budget": 32,
        "warmup": 1,
        "duration_s": None,
        "t_start": 1764475200.5,
        "t_measure_start": 1764475201.0,
        "t_end": 1764475230.0,
        "status": "completed",
        "granted": 32,
        "received": 32,
        "granted_warmup": 1,
        "received_warmup": 1,
        "lost": 0,
        "note": None,
    } | over


def run_json_as_written() -> dict[str, object]:
    """Every key the sweep's owner wrote into run.json before the schema had a version."""
    return {
        "specload_version": "0.1.0",
        "locust_version": "2.47.0",
        "label": "mtp",
        "host": "http://h:30000",
        "backend": "sglang",
        "model": "m",
        "model_source": "/v1/models",
        "scenario_file": "scenarios/x.toml",
        "scenario": {"name": "x", "input_tokens": 1000, "levels": [1, 16]},
        "started_at": 1764475200.0,
        "ended_at": None,
        "status": "running",
        "reason": None,
        "mode": "local",
        "levels": [level_as_written(0), level_as_written(1, concurrency=32, status="running", t_end=None)],
        "server": {
            "engine": "sglang",
            "speculative_algorithm": None,
            "max_running_requests": 64,
            "max_running_requests_effective": 48,
            "raw": {"x": 1},
        },
        "simulated": True,
        "server_metrics": "sampled",
    }


def test_run_meta_reads_unversioned_files_as_version_1_and_writes_them_back_unchanged() -> None:
    d = run_json_as_written()
    meta = RunMeta.from_json(d)
    assert meta.schema_version == 1 == SCHEMA_VERSION
    assert (meta.label, meta.backend, meta.status, meta.mode, meta.simulated) == (
        "mtp",
        "sglang",
        "running",
        "local",
        True,
    )
    assert meta.started_at == 1764475200.0 and meta.ended_at is None
    assert [(lv.index, lv.concurrency, lv.status, lv.budget) for lv in meta.levels] == [
        (0, 16, "completed", 32),
        (1, 32, "running", 32),
    ]
    assert meta.server.max_running == 48 and meta.server.max_running_requests == 64
    assert meta.server.engine == "sglang" and meta.server.speculative_algorithm is None
    # Nothing lost, nothing renamed; fields added since come with their defaults.
    added = {"refused": 0, "outage_s": 0.0, "client": None, "rate": None}
    assert meta.to_json() == d | {"schema_version": 1, "levels": [lv | added for lv in d["levels"]]}


def test_run_meta_ignores_unknown_keys_and_survives_bad_values() -> None:
    d = run_json_as_written() | {"schema_version": 7, "future": {"a": 1}, "started_at": "yesterday"}
    d["levels"] = [
        level_as_written(0, extra_field=5, budget="lots"),
        {"index": 1},  # no concurrency: not a level
        "garbage",
        level_as_written(2, concurrency="8", repeat=None),
    ]
    d["server"] = ["not", "an", "object"]
    d["scenario"] = None
    meta = RunMeta.from_json(d)
    assert meta.schema_version == 7
    assert meta.started_at is None and meta.scenario == {} and meta.server == ServerInfo()
    assert [(lv.index, lv.concurrency, lv.repeat, lv.budget) for lv in meta.levels] == [
        (0, 16, 0, None),
        (2, 8, 0, 32),
    ]
    out = meta.to_json()
    assert "future" not in out and "extra_field" not in out["levels"][0]
    assert LevelMeta.from_json({"concurrency": 4, "rate": -1.0}) == LevelMeta(
        concurrency=4
    )  # no rate below 0
    for not_a_run in (None, [], "x", 3):
        assert RunMeta.from_json(not_a_run) == RunMeta()
    assert LevelMeta.from_json(None) is None and LevelMeta.from_json({"concurrency": True}) is None


def test_sample_fixture_run_json_reads() -> None:
    meta = RunMeta.from_json(read_json(str(FIXTURES / "sample_run" / RUN_JSON)))
    assert meta.label == "sample" and meta.status == "completed" and meta.simulated
    assert [lv.concurrency for lv in meta.levels] == [1, 4, 8]
    assert meta.levels[0].granted_warmup is None  # older files lack it: None, not an error


def test_write_run_meta_round_trip(tmp_path: Path) -> None:
    meta = RunMeta(
        label="baseline",
        host="http://h",
        backend="openai",
        status="running",
        levels=[LevelMeta(index=0, concurrency=1, budget=4)],
        server=ServerInfo({"engine": "vllm", "max_model_len": 8192}),
    )
    path = write_run_meta(tmp_path, meta)
    assert path == tmp_path / RUN_JSON and sorted(os.listdir(tmp_path)) == [RUN_JSON]
    raw = read_json(str(path))
    assert raw["schema_version"] == SCHEMA_VERSION and raw["server"] == {
        "engine": "vllm",
        "max_model_len": 8192,
    }
    assert read_run_meta(tmp_path) == meta
    meta.status = "completed"
    write_run_meta(str(tmp_path), meta)  # rewritten in place, atomically
    assert read_run_meta(tmp_path).status == "completed"


def test_server_info() -> None:
    s = ServerInfo(
        {
            "engine": "sglang",
            "speculative_algorithm": "NEXTN",
            "max_running_requests": 64,
            "max_running_requests_effective": 48,
            "tp_size": 4,
            "simulated": True,
        }
    )
    assert s.max_running == 48 and s.simulated and s.get("tp_size") == 4 and s.get("nope") is None
    assert (
        s.summary() == "engine sglang, speculative_algorithm NEXTN, max_running_requests 48 (configured 64)"
    )
    assert (
        ServerInfo({"engine": "vllm"}).summary() == "engine vllm"
    )  # no speculative_algorithm: not mentioned
    assert ServerInfo({"speculative_algorithm": None}).summary() == "speculative_algorithm none"


def test_report_survives_any_value_in_a_record_and_names_what_it_skipped(tmp_path: Path) -> None:
    import shutil
    import subprocess
    import sys

    src = Path(__file__).resolve().parent / "fixtures" / "sample_run"
    run_dir = tmp_path / "run"
    shutil.copytree(src, run_dir)
    lines = (run_dir / "records.jsonl").read_text().splitlines()
    first = orjson.loads(lines[0])
    first["spec_verify_ct"] = "lots"  # an optional number of the wrong type: dropped, record kept
    second = orjson.loads(lines[1])
    second["t_end"] = "later"  # a required one: the record is skipped
    lines[0], lines[1] = orjson.dumps(first).decode(), orjson.dumps(second).decode()
    (run_dir / "records.jsonl").write_text(
        "\n".join(lines) + '\n{"level": 0, "phase": "meas'
    )  # a torn last line
    out = subprocess.run(
        [sys.executable, "-m", "specload", "report", str(run_dir), "--no-write"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    assert "1 unreadable line(s) skipped" in text
    assert "field 'spec_verify_ct' not a number in 1 record(s)" in text
    assert "1 record(s) without a usable required field skipped" in text


def test_client_clocks_round_trip_and_bad_entries_are_dropped() -> None:
    from specload.core.rundir import ClientClock

    d = run_json_as_written() | {
        "clients": [
            {"worker": "w1", "offset_ms": 250.2, "rtt_ms": 0.4, "samples": 5, "measured_at": 1764475200.5},
            {"worker": "w2", "offset_ms": "soon", "rtt_ms": 0.4},
            "junk",
        ]
    }
    meta = RunMeta.from_json(d)
    assert meta.clients == [ClientClock("w1", 250.2, 0.4, 5, 1764475200.5)]
    assert meta.to_json()["clients"] == [d["clients"][0]]
    assert "clients" not in RunMeta.from_json(run_json_as_written()).to_json()  # local runs have none


def test_recorded_scenario_is_typed_by_the_field_table() -> None:
    from specload.workload.config import Scenario
    from specload.workload.recorded import recorded_scenario

    written = Scenario(name="x", levels=[1, 8], token_id_range=(5, 900), slo="ttft_p99=2s")
    meta = RunMeta.from_json(orjson.loads(orjson.dumps(RunMeta(scenario=written.to_dict()).to_json())))
    assert recorded_scenario(meta) == written  # tuples come back as tuples, lists as lists
    # An unversioned file's partial scenario: what it lacks reads as the field's default, a key the
    # table no longer has is ignored, and a value of the wrong type takes the default.
    old = RunMeta.from_json(run_json_as_written() | {"scenario": {"name": "x", "gone": 1, "seed": "no"}})
    sc = recorded_scenario(old)
    assert sc is not None and (sc.name, sc.seed, sc.input_tokens, sc.slo) == ("x", 0, 1000, None)
    assert recorded_scenario(RunMeta()) is None  # no scenario recorded (another tool's run): None
