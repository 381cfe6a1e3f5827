"""The owner's roles at their edges: the messages' schema version, the options the owner reads (never
``sys.argv``), and report.md, which a child process writes at a run's end, never the Locust process.

Checks that import the owner (which imports Locust, which monkey-patches the whole process) run in
a child Python; the message checks need no Locust and run here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specload.core.rundir import REPORT_MD, RUN_JSON
from specload.locust.protocol import (
    WIRE_VERSION,
    ClientLoadMsg,
    ClockPing,
    ClockPong,
    OtherVersion,
    RecordMsg,
    RunConfig,
    StateMsg,
    TicketReply,
    TicketRequest,
    TicketReturn,
    WireError,
    decode,
)
from specload.sweep.levels import Grant, SweepState
from specload.workload.config import Scenario
from specload.workload.prompts import PromptSource
from tests.conftest import Procs, specload_cmd

REPO = Path(__file__).resolve().parent.parent
SIM_ARGS = ("--ttft-ms", "20", "--itl-ms", "2", "--model", "m")


def child(check: str, tmp_path: Path) -> str:
    code = f"from pathlib import Path; from tests.test_owner_roles import check_{check}; check_{check}(Path({str(tmp_path)!r})); print('ok')"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr
    return out.stdout + out.stderr


# the messages' schema version ------------------------------------------------------------------------


def _messages() -> list[Any]:
    from specload.analysis.clientcheck import ProcessLoad

    cfg = RunConfig(Scenario(levels=[1, 2]), "m", "http://h:1", PromptSource("text", "test"))
    state = StateMsg(SweepState(), "run", cfg.to_wire())
    grant = Grant(1, 16, 0, "measure", 7, 100, 0.25, 2.0)
    load = ProcessLoad.from_json({"cpu": 0.5, "wall_s": 1.0, "lag_p99_ms": 2.0, "lag_max_ms": 3.0})
    msgs = [
        state,
        TicketRequest("u"),
        TicketReply("u", grant, None, "t"),
        TicketReturn(1, "measure", 7, "t"),
        RecordMsg({"seq": 1}, "t"),
        ClockPing(1.5),
        ClockPong(1.5, 2.5),
    ]
    if load is not None:
        msgs.append(ClientLoadMsg("run", 0, load, 3))
    return msgs


def test_every_message_says_its_version_and_reads_back() -> None:
    for m in _messages():
        wire = m.to_wire()
        assert wire["v"] == WIRE_VERSION, type(m)
        assert decode(type(m).from_wire, wire).to_wire() == wire, type(m)


def test_another_version_is_refused_with_a_reason() -> None:
    """Master and workers run one specload version: an older message (one without a version is
    version 1) or a newer one is refused, saying so."""
    for m in _messages():
        wire = m.to_wire()
        for other, said in (
            (WIRE_VERSION + 1, WIRE_VERSION + 1),
            (WIRE_VERSION - 1, WIRE_VERSION - 1),
            (None, 1),
        ):
            sent = {k: v for k, v in wire.items() if k != "v"} | ({} if other is None else {"v": other})
            with pytest.raises(OtherVersion) as e:
                decode(type(m).from_wire, sent)
            assert f"wire version {said}, but this specload" in str(e.value)
            assert "same specload version on the master and every worker" in str(e.value)
    with pytest.raises(WireError, match="not a wire version"):
        decode(TicketRequest.from_wire, {"v": "2", "uid": "u"})


def test_a_malformed_message_is_a_wire_error_naming_the_message_and_field() -> None:
    v = {"v": WIRE_VERSION}
    for bad, said in (
        ({}, None),
        (None, "TicketReply: expected an object, got NoneType"),
        ([], "TicketReply: expected an object, got list"),
        (
            v | {"uid": "u", "grant": {"level": 1}},
            "TicketReply: Object missing required field `concurrency` - at `$.grant`",
        ),
        (v | {"uid": 5, "grant": None}, "TicketReply: Expected `str`, got `int` - at `$.uid`"),
        (
            v
            | {
                "uid": "u",
                "grant": None,
                "item": {"prompt": "p", "prompt_tokens": 1, "output_tokens": 1, "turns": ["a"]},
            },
            "turn_tokens must match its turns",
        ),
    ):
        with pytest.raises(WireError) as e:
            decode(TicketReply.from_wire, bad)
        assert said is None or said in str(e.value), str(e.value)
    with pytest.raises(WireError, match="StateMsg: .*state"):
        decode(StateMsg.from_wire, v | {"state": {"phase": "nowhere"}, "config_id": None, "config": None})
    with pytest.raises(WireError, match="streamed"):
        decode(ClientLoadMsg.from_wire, _messages()[-1].to_wire() | {"streamed": -1})


def test_the_run_config_is_checked_again_by_the_field_table() -> None:
    cfg = RunConfig(
        Scenario(levels=[1, 2], token_id_range=(5, 100)), "m", "http://h:1", PromptSource("text", "t")
    )
    wire = cfg.to_wire()
    wire["scenario"]["token_id_range"] = [5, 100]  # as msgpack delivers a tuple
    assert RunConfig.from_wire(wire) == cfg
    for field, value, said in (
        ("levels", [0], "field 'levels'"),
        ("input_tokens", -1, "field 'input_tokens'"),
        ("backend", "nope", "field 'backend'"),
        ("no_such_field", 1, "unknown field 'no_such_field'"),
    ):
        bad = {**wire, "scenario": {**wire["scenario"], field: value}}
        with pytest.raises(WireError, match=re.escape(said)):
            decode(RunConfig.from_wire, bad)


def test_the_owner_refuses_newer_and_malformed_messages_without_a_crash(tmp_path: Path) -> None:
    child("versions", tmp_path)


def check_versions(tmp_path: Path) -> None:
    import io
    import logging

    from tests.test_owner import msg, record, running_owner

    log = io.StringIO()
    logging.getLogger("specload").addHandler(logging.StreamHandler(log))
    env, owner = running_owner(tmp_path)
    owner.on_ticket_req(env, msg({"v": WIRE_VERSION + 1, "uid": "u"}, "worker-a"))
    owner.on_ticket_req(env, msg({"v": WIRE_VERSION + 1, "uid": "u"}, "worker-a"))
    assert env.runner.sent == []  # no ticket for a request it cannot read
    owner.on_ticket_req(env, msg({"v": WIRE_VERSION, "uid": "u"}, "worker-a"))  # our version: answered
    reply = TicketReply.from_wire(env.runner.sent[-1][1])
    assert reply.grant is not None
    newer = RecordMsg(record(0), reply.ticket).to_wire()
    owner.on_record(env, msg({**newer, "v": WIRE_VERSION + 1}, "worker-b"))
    owner.on_ticket_req(
        env, msg({"v": WIRE_VERSION, "nothing": 1}, "worker-a")
    )  # malformed: ignored, not raised
    owner.on_ticket_return(env, msg(["not", "a", "dict"], "worker-a"))
    text = log.getvalue()
    assert (
        text.count(f"refused a ticket request message from worker-a: wire version {WIRE_VERSION + 1}") == 1
    ), text
    assert f"refused a record message from worker-b: wire version {WIRE_VERSION + 1}" in text, text
    assert "ignored a malformed ticket request message" in text, text
    assert "ignored a malformed ticket return message" in text, text
    assert owner.ctrl.levels[0].received == 0 and owner.rejected == 2
    owner.on_record(env, msg(RecordMsg(record(0), reply.ticket).to_wire(), "worker-a"))  # the genuine one
    assert owner.ctrl.levels[0].received == 1


def test_a_worker_refuses_a_newer_masters_messages_and_a_bad_config(tmp_path: Path) -> None:
    child("worker", tmp_path)


def check_worker(tmp_path: Path) -> None:
    import io
    import logging
    from types import SimpleNamespace

    from specload.locust.user import UserSide
    from tests.test_owner import Runner

    log = io.StringIO()
    logging.getLogger("specload").addHandler(logging.StreamHandler(log))
    side = UserSide(Runner())
    cfg = RunConfig(Scenario(levels=[1]), "m", "http://h:1", PromptSource("text", "test")).to_wire()
    state = StateMsg(SweepState(level=0, open=True), "run-1", cfg).to_wire()
    for _ in range(2):
        side.on_state(None, SimpleNamespace(data={**state, "v": WIRE_VERSION + 1}, node_id="master"))
    assert side.config is None and not side.open.is_set()
    bad = StateMsg(SweepState(level=0, open=True), "run-1", {**cfg, "scenario": {"levels": [0]}}).to_wire()
    side.on_state(None, SimpleNamespace(data=bad, node_id="master"))
    assert side.config is None and not side.open.is_set()  # no request under a config it cannot trust
    side.on_ticket(None, SimpleNamespace(data={"v": WIRE_VERSION + 1}, node_id="master"))
    text = log.getvalue()
    assert text.count(f"refused the owner's state message: wire version {WIRE_VERSION + 1}") == 1, text
    assert "refused the owner's run config run-1: the owner's run config: field 'levels'" in text, text
    assert f"refused the owner's ticket reply: wire version {WIRE_VERSION + 1}" in text, text
    side.on_state(None, SimpleNamespace(data=state, node_id="master"))  # a master of our version
    assert side.config is not None and side.open.is_set()


# the options the owner reads ---------------------------------------------------------------------


def test_the_owner_takes_the_explicit_options_from_the_parse_not_sys_argv(tmp_path: Path) -> None:
    child("explicit", tmp_path)


def check_explicit(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from specload.locust.options import scenario_from_options
    from specload.locust.owner import SweepOwner
    from tests.test_locust_options import SMOKE, parser

    opts = parser().parse_args(["--scenario", SMOKE, "--input-tokens", "512"])  # 512: the default
    sys.argv = ["locust", "--levels", "3"]  # what a stray read of sys.argv would find
    owner = SweepOwner(SimpleNamespace(parsed_options=opts, runner=None, host="http://h:1"))
    assert owner.explicit == {"scenario", "input_tokens"}
    from specload.workload.config import load_scenario

    sc = scenario_from_options(opts, owner.explicit, owner.launch)
    smoke = load_scenario(SMOKE)
    assert (
        smoke.input_tokens != 512 and sc.input_tokens == 512
    )  # given, at its default: it overrides the file
    assert sc.levels == smoke.levels != [3]


# report.md at the end of a run -------------------------------------------------------------------


POISON = """\
# The report builder and the run reader must never load in the Locust process: with these entries
# any import of them fails there (and the run would end without report.md).
import sys

sys.modules["specload.present.report"] = None
sys.modules["specload.analysis.run"] = None

import specload.locust.plugin  # noqa: E402,F401
from specload.locust.shape import SteppedConcurrencyShape  # noqa: E402
from specload.locust.user import SpecloadUser  # noqa: E402

__all__ = ["SpecloadUser", "SteppedConcurrencyShape"]
"""


def test_report_md_is_written_by_a_child_of_the_locust_process(
    sim: Any, procs: Procs, tmp_path: Path
) -> None:
    """A plain headless ``locust`` run: report.md appears, the report is printed once (by the
    child, on Locust's stdout), and the Locust process never loaded the report builder."""
    server = sim(*SIM_ARGS)
    locustfile = tmp_path / "poisoned.py"
    locustfile.write_text(POISON)
    run_dir = tmp_path / "run"
    flags = ["--levels", "1,2", "--input-tokens", "16", "--output-tokens", "8", "--read-timeout", "30"]
    cmd = [sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "--host", server.url]
    proc = procs.popen([*cmd, "--run-dir", str(run_dir), *flags])
    assert proc.wait(timeout=120) == 0, procs.log(proc)[-4000:]
    log = procs.log(proc)
    report = (run_dir / REPORT_MD).read_text()
    assert report.startswith("# specload report: ") and "\n| C " in report, report
    assert log.count(report.strip()) == 1, log[-4000:]  # printed once, as report.md has it
    pids = re.findall(r"being written by a child process \(pid (\d+)\)", log)
    assert len(pids) == 1 and int(pids[0]) != proc.pid, log[-4000:]
    assert "could not write report.md" not in log and "Traceback" not in log, log[-4000:]


def test_specload_sweep_prints_the_report_once(sim: Any, procs: Procs, tmp_path: Path) -> None:
    """``specload sweep``: the command reads the run once, prints the report and writes report.md; its
    Locust child starts no report child of its own (a second reading of the same run)."""
    server = sim(*SIM_ARGS)
    out_dir = tmp_path / "out"
    cmd = specload_cmd(
        "sweep",
        "--host",
        server.url,
        "--levels",
        "1",
        "--input-tokens",
        "16",
        "--output-tokens",
        "8",
        "--read-timeout",
        "30",
        "--out",
        str(out_dir),
    )
    proc = procs.popen(cmd)
    assert proc.wait(timeout=120) == 0, procs.log(proc)[-4000:]
    log = procs.log(proc)
    (run_dir,) = [d for d in out_dir.iterdir() if (d / RUN_JSON).exists()]
    report = (run_dir / REPORT_MD).read_text()
    table = next(line for line in report.splitlines() if line.startswith("| C"))
    assert log.count(table) == 1, log[-4000:]
    assert "being written by a child process" not in log, log[-4000:]


def test_the_report_child_has_a_time_limit_and_its_failure_is_said(tmp_path: Path) -> None:
    child("reportjob", tmp_path)


def check_reportjob(tmp_path: Path) -> None:
    import io
    import logging

    import specload.locust.owner  # noqa: F401 - Locust's monkey-patching, as in the Locust process
    from specload.locust.reportjob import ReportJob

    log = io.StringIO()
    logging.getLogger("specload").addHandler(logging.StreamHandler(log))
    logging.getLogger("specload").setLevel(logging.INFO)
    slow = ReportJob(str(tmp_path), timeout_s=0.0)
    assert slow.pid is not None and slow.wait(30) is False
    assert f"could not write report.md (not done within 0 s (stopped)); run `specload report {tmp_path}`" in (
        log.getvalue()
    ), log.getvalue()
    done: list[bool] = []
    bad = ReportJob(str(tmp_path / "nothing"), on_done=done.append)
    assert bad.wait(60) is False and done == [False] and bad.done
    assert "NotARunDir" in log.getvalue(), log.getvalue()
    assert not (tmp_path / REPORT_MD).exists()
