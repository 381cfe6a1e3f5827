"""Natural output lengths (``--output-mode natural``): the model ends its answers, --output-tokens caps them.

Against the simulator with ``--eos-length``: each request that does not ask for ``ignore_eos`` ends at
a length drawn in arrival order from a seeded RNG (specload.sim.eos.eos_lengths gives them), so the
records' counts and every figure built on them are known exactly.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from specload.analysis.comparison import build_comparison
from specload.analysis.run import load_run
from specload.analysis.validity import OK_COUNT, broken
from specload.client.backends import get_backend
from specload.client.http import make_client
from specload.client.stream import RequestSpec, stream_request
from specload.core.records import OK, PHASE_MEASURE, SHORT, make_record, read_records
from specload.present.compare import table_columns, table_rows
from specload.sim.eos import EosLength, eos_lengths, parse_eos_length
from specload.workload.config import FORCED, NATURAL, Scenario, ScenarioError, apply_overrides
from specload.workload.prompts import method_label
from tests.conftest import specload_cmd
from tests.fixtures.make_compare_runs import write_run

CAP = 40
EOS = (10, 60)  # drawn uniformly: 30 of the 51 lengths end before the cap of 40
SEED = 7
ITL_S = 0.005
SIM_ARGS = ("--ttft-ms", "50", "--itl-ms", "5", "--max-running", "64", "--model", "m")


def test_bodies_leave_out_ignore_eos_in_natural_mode() -> None:
    for name in ("openai", "chat"):
        forced = get_backend(name).body("a b", 8, "m", 0.0, {})
        natural = get_backend(name).body("a b", 8, "m", 0.0, {}, natural=True)
        assert forced["ignore_eos"] is True and forced["min_tokens"] == 8 and forced["max_tokens"] == 8
        assert "ignore_eos" not in natural and "min_tokens" not in natural and natural["max_tokens"] == 8
    sg = get_backend("sglang")
    assert sg.body([1], 8, None, 0.0, {})["sampling_params"]["ignore_eos"] is True
    assert sg.body([1], 8, None, 0.0, {}, natural=True)["sampling_params"] == {
        "max_new_tokens": 8,
        "temperature": 0.0,
    }


def test_scenario_field_flag_and_label() -> None:
    sc = Scenario()
    assert sc.output_mode == FORCED  # the reference method stays the default
    assert apply_overrides(sc, {"output_mode": NATURAL}).output_mode == NATURAL
    with pytest.raises(ScenarioError, match="output_mode"):
        apply_overrides(sc, {"output_mode": "eos"})
    assert "forced to the output length" in method_label({}, {})  # a run.json from before the field
    assert "forced" in method_label({}, {"output_mode": FORCED})
    assert "natural, ended by the model" in method_label({}, {"output_mode": NATURAL})


def test_sim_eos_draws() -> None:
    eos = EosLength(5, 9, seed=3)
    ends = [eos.end(8, True, 0) for _ in range(200)]
    assert {f for n, f in ends if n < 8} == {"stop"} and all(n == 8 for n, f in ends if f == "length")
    assert {n for n, _ in ends} == {5, 6, 7, 8}  # 8 and 9 are past the cap of 8
    assert EosLength(5, 9, seed=3).end(8, False, 0) == (8, "length")  # ignore_eos: to the cap
    assert EosLength(5, 5, seed=3).end(8, True, 7) == (7, "stop")  # min_tokens holds the end back
    assert [n for n, _ in ends] == [min(n, 8) for n in eos_lengths(5, 9, 3, 200)]  # the same draws, capped
    assert parse_eos_length("3:4") == (3, 4) and parse_eos_length("5") == (5, 5)
    with pytest.raises(ValueError):
        parse_eos_length("4:3")


def _record(tokens: int, status: str, finish: Any):  # type: ignore[no-untyped-def]
    return make_record(
        t_send=100.0,
        t_first=100.1,
        t_last=100.5,
        t_end=100.5,
        output_tokens=tokens,
        level=0,
        concurrency=1,
        phase=PHASE_MEASURE,
        seq=0,
        backend="openai",
        status=status,
        reason=None,
        http_status=200,
        output_tokens_source="usage",
        prompt_tokens=8,
        requested_output_tokens=CAP,
        requested_prompt_tokens=8,
        chunks=tokens,
        itl_max_s=None,
        spec_verify_ct=None,
        worker="local",
        finish_reason=finish,
    )


def test_validity_keeps_ok_records_the_model_stopped() -> None:
    verdict = broken(
        [
            _record(CAP, OK, "length"),
            _record(12, OK, "stop"),  # natural: ended by the model
            _record(12, OK, "length"),  # not stopped, yet ok with fewer: not the client's
            _record(12, OK, None),
            _record(12, SHORT, "length"),
            _record(CAP + 1, OK, "stop"),  # more than the cap is never ok
            _record(12, OK, ["stop"]),  # a hand-edited line: no finish reason, and no crash
        ]
    ).tolist()
    rule = ["ok" if v < 0 else ("count" if v == 0 else v) for v in verdict]
    assert rule == ["ok", "ok", "count", "count", "ok", "count", "count"], rule
    assert OK_COUNT.startswith("ok with")


def _stream(url: str, natural: bool, asked: int = 8, backend: str = "openai"):  # type: ignore[no-untyped-def]
    client = make_client(url, 10.0, 2.0)
    try:
        b = get_backend(backend)
        spec = RequestSpec(0, 1, PHASE_MEASURE, 0, 0, asked, 4, natural=natural)
        body = b.body("1 the of and" if backend == "chat" else [5, 6, 7, 8], asked, "m", 0.0, {}, natural)
        return stream_request(client, b.path, body, {"Content-Type": "application/json"}, b, spec, "w", 10.0)
    finally:
        client.close()


def test_a_natural_end_is_ok_and_a_missing_terminator_still_short(sim) -> None:  # type: ignore[no-untyped-def]
    server = sim(*SIM_ARGS, "--eos-length", "3", "--fault-omit-done", "--fault-every", "2")
    first = _stream(server.url, natural=True)  # request 1: ends at its EOS, with its terminator
    assert (first.status, first.output_tokens, first.finish_reason, first.reason) == (OK, 3, "stop", None)
    second = _stream(server.url, natural=True)  # request 2: the same end, no [DONE]
    assert second.status == SHORT and second.output_tokens == 3 and "terminator" in (second.reason or "")
    forced = _stream(server.url, natural=False)  # ignore_eos: the simulator runs it to the cap
    assert (forced.status, forced.output_tokens, forced.finish_reason) == (OK, 8, "length")


@pytest.mark.parametrize("backend", ["chat", "sglang"])
def test_each_api_says_stop_its_own_way(sim, backend: str) -> None:  # type: ignore[no-untyped-def]
    """chat: finish_reason "stop" in a delta event; SGLang /generate: meta_info.finish_reason {"type": "stop"}."""
    server = sim(*SIM_ARGS, "--eos-length", "3")
    rec = _stream(server.url, natural=True, backend=backend)
    assert (rec.status, rec.output_tokens, rec.finish_reason, rec.reason) == (OK, 3, "stop", None)
    forced = _stream(server.url, natural=False, backend=backend)
    assert (forced.status, forced.output_tokens, forced.finish_reason) == (OK, 8, "length")


def test_a_forced_request_the_server_ended_early_is_still_short(sim) -> None:  # type: ignore[no-untyped-def]
    server = sim(*SIM_ARGS, "--fault-short-by", "3")  # ends 3 tokens early with finish_reason "stop"
    forced = _stream(server.url, natural=False)
    assert forced.status == SHORT and forced.output_tokens == 5 and forced.finish_reason == "stop"
    assert forced.reason == "server counted 5 of 8 tokens asked for"
    natural = _stream(server.url, natural=True)
    assert natural.status == OK and natural.output_tokens == 5


def _sweep(sim, tmp_path: Path, *flags: str) -> Path:  # type: ignore[no-untyped-def]
    server = sim(*SIM_ARGS, "--eos-length", f"{EOS[0]}:{EOS[1]}", "--eos-seed", str(SEED))
    out = subprocess.run(
        specload_cmd(
            "sweep",
            "--host",
            server.url,
            "--levels",
            "1,4",
            "--requests-per-level",
            "8",
            "--input-tokens",
            "16",
            "--output-tokens",
            str(CAP),
            "--read-timeout",
            "30",
            "--out",
            str(tmp_path),
            *flags,
        ),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (run_dir,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    return run_dir


def test_natural_sweep_records_and_figures(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run_dir = _sweep(sim, tmp_path, "--output-mode", "natural")
    recs = sorted(read_records(str(run_dir / "records.jsonl")), key=lambda r: r.t_send)
    assert len(recs) == 16 and all(r.status == OK for r in recs), [r.reason for r in recs if r.status != OK]
    # The first level has one user: its requests reach the simulator in order, and get its draws in
    # order; the second level's four users get the next eight draws in some order.
    drawn = [min(n, CAP) for n in eos_lengths(*EOS, SEED, 16)]
    assert [r.output_tokens for r in recs[:8]] == drawn[:8]
    assert sorted(r.output_tokens for r in recs[8:]) == sorted(drawn[8:])
    assert 0 < sum(n < CAP for n in drawn) < 16  # the draws test both ends: stopped and capped
    for r in recs:
        assert r.requested_output_tokens == CAP and r.output_tokens_source == "usage"
        assert r.finish_reason == ("stop" if r.output_tokens < CAP else "length"), r
    run = load_run(run_dir)
    assert run.info.scenario["output_mode"] == NATURAL
    for lv in run.levels:
        mine = [r for r in recs if r.level == lv.index]
        assert (lv.sent, lv.ok, lv.short, lv.failed) == (8, 8, 0, 0)
        assert lv.output_tokens == sum(r.output_tokens for r in mine)
        assert lv.output_mismatch == 0  # a natural end is no mismatch with the cap
        wall = lv.wall_s
        assert wall is not None and lv.agg_tok_s == pytest.approx(lv.output_tokens / wall, rel=1e-9)
        # TPOT: each request's own tokens after the first over its own decode time: the simulator's ITL.
        assert lv.figure("tpot_p50") == pytest.approx(ITL_S * 1000, rel=0.1)
    for r in recs:
        assert r.tpot_s == pytest.approx((r.t_last - r.t_first) / (r.output_tokens - 1), rel=1e-9)
    report = (run_dir / "report.md").read_text()
    assert "answers: natural, ended by the model" in report
    assert "got an output token count different" not in report
    assert "output received" in report  # the answers' lengths: the Request lengths section


def test_forced_sweep_unchanged(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The same simulator, the default mode: ignore_eos runs every answer to the cap, and a server
    that stopped anyway would be short (tests/test_stream.py)."""
    run_dir = _sweep(sim, tmp_path)
    recs = read_records(str(run_dir / "records.jsonl"))
    assert len(recs) == 16 and all(
        r.status == OK and r.output_tokens == CAP and r.finish_reason == "length" for r in recs
    )
    meta = orjson.loads((run_dir / "run.json").read_bytes())
    assert meta["scenario"]["output_mode"] == FORCED
    report = (run_dir / "report.md").read_text()
    assert "answers: forced to the output length" in report and "output received" not in report


def test_runs_whose_answers_end_differently_are_not_compared(tmp_path: Path) -> None:
    """A forced run against a natural one: acceptance differs between the modes (issue 32: code
    editing 2.57 forced, 3.23 natural), so no delta is given."""
    base = write_run(tmp_path / "b", "baseline", {16: 1000.0, 32: 1500.0}, {16: 50.0, 32: 45.0})
    mtp = write_run(tmp_path / "m", "mtp", {16: 1300.0, 32: 1650.0}, {16: 65.0, 32: 55.0})
    cols = table_columns(comp := build_comparison([load_run(base), load_run(mtp)]))
    assert all(dict(zip(cols, r, strict=True))["Δ agg mtp"] != "n/c" for r in table_rows(comp))
    meta = orjson.loads((mtp / "run.json").read_bytes())
    meta.setdefault("scenario", {})["output_mode"] = NATURAL
    (mtp / "run.json").write_bytes(orjson.dumps(meta))
    comp = build_comparison([load_run(base), load_run(mtp)])
    assert all(dict(zip(cols, r, strict=True))["Δ agg mtp"] == "n/c" for r in table_rows(comp))
    assert any(
        "the answers end differently (baseline forced, mtp natural; --output-mode)" in n for n in comp.notes
    )
