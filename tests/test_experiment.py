"""``specload experiment``: the plan's checks, and the whole loop against real simulators on free ports.

Each run test starts ``specload experiment`` as a process (stopped at teardown whatever happens) and,
after it ends, checks that no server it started is left, that experiment.json says what happened, and
that the runs it made are kept and readable by ``specload report``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from specload.analysis.run import load_run
from specload.experiment.plan import ExperimentError, load_plan, plan_from_dict, scenario_toml
from specload.experiment.pooled import pooled
from specload.experiment.record import scrub_argv, scrub_env
from specload.experiment.smoke import smoke_check, speculation_problem
from specload.present.report import main as report_main
from specload.workload.config import Scenario, load_scenario
from tests.conftest import REPO, ExperimentRun, Procs, specload_cmd, wait_until

EXAMPLE = REPO / "scenarios" / "experiment-sim.toml"
TINY = ["--levels", "1,4", "--requests-per-level", "4", "--output-tokens", "16", "--input-tokens", "64"]
ONE_LEVEL = ["--levels", "1", "--requests-per-level", "4", "--output-tokens", "16", "--input-tokens", "64"]
SIM = ["{python}", "-m", "specload.sim", "--port", "{port}", "--model", "m"]
FAST_BATCH = [*SIM, "--engine", "batch", "--time-scale", "0.1"]


# ---------------------------------------------------------------- the plan


def _plan(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(text))
    return path


def _arms(*arms: dict[str, Any]) -> dict[str, Any]:
    return {"arms": list(arms)}


A = {"label": "a", "command": ["srv", "--port", "{port}"]}
B = {"label": "b", "url": "http://127.0.0.1:9"}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "'arms': expected at least two [[arms]] tables"),
        (_arms(A), "expected at least two [[arms]] tables (the first is the baseline), got 1"),
        (_arms(A, {**A}), "arms[1]: label 'a' is used by an earlier arm"),
        (_arms(A, {"label": "b"}), "arms[1] ('b'): give either 'command'"),
        (
            _arms(A, {**B, "command": ["x", "{port}"]}),
            "give either 'command' (a server specload starts) or 'url'",
        ),
        (_arms(A, {**B, "colour": 1}), "arms[1] ('b'): unknown key 'colour'"),
        (_arms(A, {"label": "b", "command": ["srv"]}), "no {port} in the command line"),
        (_arms(A, {"label": "b", "command": []}), "key 'command': the command line is empty"),
        (_arms(A, {**B, "url": "ftp://x"}), "key 'url': host 'ftp://x' is not an http:// or https:// URL"),
        (_arms(A, {**B, "ready_timeout_s": 0}), "key 'ready_timeout_s': expected a number of seconds > 0"),
        (_arms(A, {**B, "health": "health"}), "key 'health': expected a path starting with '/'"),
        (_arms(A, {**B, "speculative": "yes"}), "key 'speculative': expected true or false"),
        (_arms(A, {**A, "label": "b", "env": {"X": 1}}), "key 'env': expected a table of strings"),
        (_arms(A, {**B, "label": "-x"}), "key 'label': expected 1..100 characters not starting with '-'"),
        ({**_arms(A, B), "sweep": {"levles": [1]}}, "exp.toml [sweep]: unknown field 'levles'"),
        ({**_arms(A, B), "sweep": {"levels": "x"}}, "exp.toml [sweep]: field 'levels'"),
        (
            {**_arms(A, B), "sweep": {"scenario": "no-such"}},
            "key 'scenario': no-such: scenario file not found",
        ),
        ({**_arms(A, B), "arm": []}, "exp.toml: unknown key 'arm'"),
    ],
)
def test_a_malformed_plan_is_an_error_naming_the_file_and_key(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ExperimentError) as e:
        plan_from_dict(data, "exp.toml")
    assert message in str(e.value)


def test_the_sweep_is_the_scenario_file_with_the_tables_fields_over_it(tmp_path: Path) -> None:
    (tmp_path / "base.toml").write_text('backend = "sglang"\noutput_tokens = 99\nlevels = [2]\n')
    path = _plan(
        tmp_path,
        """
        [sweep]
        scenario = "base.toml"
        levels = [1, 4]
        [[arms]]
        label = "a"
        command = "srv --port {port} --host {host}"
        [[arms]]
        label = "b"
        url = "http://127.0.0.1:9/"
        speculative = true
        """,
    )
    plan = load_plan(str(path))
    assert (plan.scenario.backend, plan.scenario.output_tokens, plan.scenario.levels) == (
        "sglang",
        99,
        [1, 4],
    )
    a, b = plan.arms
    assert a.argv(1234) == ["srv", "--port", "1234", "--host", "127.0.0.1"] and not a.speculative
    assert (b.url, b.speculative, b.ready_timeout_s) == ("http://127.0.0.1:9", True, 10.0)


def test_the_written_sweep_reads_back_as_the_same_scenario(tmp_path: Path) -> None:
    sc = load_scenario(str(REPO / "scenarios" / "chat-mix.toml"))
    for s in (sc, Scenario(), load_scenario("demo")):
        path = tmp_path / "sweep.toml"
        path.write_text(scenario_toml(s))
        assert load_scenario(str(path)) == s


def test_secrets_in_a_command_line_or_environment_are_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECLOAD_API_KEY", "sk-live")
    argv = ["srv", "--api-key", "k1", "--admin-token=k2", "--max-tokens", "8", "--x=Bearer sk-live", "k3"]
    assert scrub_argv(argv, ["k3"]) == [
        "srv",
        "--api-key",
        "<redacted>",
        "--admin-token=<redacted>",
        "--max-tokens",
        "8",
        "--x=Bearer <redacted>",
        "<redacted>",
    ]
    assert scrub_env({"HF_TOKEN": "hf1", "MODE": "fast"}) == {"HF_TOKEN": "<redacted>", "MODE": "fast"}


def test_a_malformed_file_exits_2_with_one_line(tmp_path: Path, procs: Procs) -> None:
    path = _plan(tmp_path, "[[arms]]\nlabel = 'a'\nurl = 'http://127.0.0.1:9'\n")
    proc = procs.popen(specload_cmd("experiment", str(path), "--out", str(tmp_path)))
    assert proc.wait(timeout=30) == 2
    log = procs.log(proc)
    assert "expected at least two [[arms]] tables" in log and "Traceback" not in log
    assert not list(tmp_path.glob("experiment-*")), "nothing is made before the plan is checked"


# ---------------------------------------------------------------- the smoke check


def test_speculation_that_the_endpoint_does_not_show_is_named(sim: Any) -> None:
    s = sim("--model", "m")
    r = smoke_check(s.url, Scenario(backend="openai", output_tokens=16))
    assert r.ok and r.accept_length is None
    assert "speculation on mtp cannot be seen on this endpoint" in (speculation_problem("mtp", r) or "")
    # the same server's acceptance, seen through vLLM-style /metrics counters
    m = sim("--engine", "batch", "--preset", "mtp", "--time-scale", "0.1", "--metrics-style", "vllm")
    r = smoke_check(m.url, Scenario(backend="openai"))
    assert r.active and r.source == "/metrics spec_decode counters" and (r.accept_length or 0) > 1.5
    assert speculation_problem("mtp", r) is None


# ---------------------------------------------------------------- whole experiments


def _run(procs: Procs, tmp_path: Path, plan: Path, *flags: str, timeout: float = 120) -> tuple[int, str]:
    proc = procs.popen(
        specload_cmd("experiment", str(plan), "--out", str(tmp_path / "out"), "--no-plot", *flags)
    )
    code = proc.wait(timeout=timeout)
    return code, procs.log(proc)


def _doc(tmp_path: Path) -> dict[str, Any]:
    (directory,) = (tmp_path / "out").glob("experiment-*")
    return dict(json.loads((directory / "experiment.json").read_text()))


def _gone(pid: int) -> bool:
    """Neither the process nor anything of its process group is left (a zombie counts as gone)."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state == "Z"


def _assert_no_server_left(doc: dict[str, Any]) -> None:
    pids = [r["pid"] for r in doc["runs"] if r["pid"] is not None]
    assert pids, doc["runs"]
    for pid in pids:
        wait_until(lambda pid=pid: _gone(pid), 5, f"server {pid} to be gone")


def _reportable(run_dir: str) -> None:
    assert report_main([run_dir, "--no-write"]) == 0


def test_two_arms_interleaved_twice_then_compared(example_experiment: ExperimentRun) -> None:
    code, log = example_experiment.code, example_experiment.log
    assert code == 0, log
    doc = _doc(example_experiment.out.parent)
    assert doc["status"] == "completed" and doc["baseline"] == "baseline"
    assert doc["order"] == ["baseline#1", "mtp#1", "baseline#2", "mtp#2"]
    runs = doc["runs"]
    assert [r["status"] for r in runs] == ["completed"] * 4
    starts = [load_run(r["run_dir"]).info.started_at for r in runs]
    assert starts == sorted(starts) and len(set(starts)) == 4, starts
    assert [load_run(r["run_dir"]).label for r in runs] == ["baseline", "mtp", "baseline", "mtp"]
    for r in runs:
        assert Path(r["run_dir"], "server.log").exists() and r["server_log"].endswith("server.log")
        assert r["command"][:3] == [sys.executable, "-m", "specload.sim"] and str(r["port"]) in r["command"]
    mtp = [r for r in runs if r["arm"] == "mtp"]
    assert all(r["smoke"]["active"] and r["smoke"]["source"] == "meta_info.spec_verify_ct" for r in mtp)
    arms = {a["label"]: a for a in doc["arms"]}
    assert arms["mtp"]["runs"] == [r["run_dir"] for r in mtp] and arms["mtp"]["speculative"]
    assert arms["mtp"]["server_config"]["speculative_algorithm"] == "NEXTN"
    assert "{port}" in arms["baseline"]["command"]
    _assert_no_server_left(doc)
    # the comparison pools each arm's two runs as two repeats of each level
    assert doc["comparison"]["sentences"] and Path(doc["comparison"]["markdown"]).exists()
    notes = doc["comparison"]["notes"]
    assert any("repeats per run (baseline/mtp): C=1 2/2, C=4 2/2" in n for n in notes), notes
    assert any(n.startswith("mtp: 2 runs pooled as repeats of each level (runs 2: ") for n in notes), notes
    assert "# specload comparison: baseline vs mtp" in log
    base = pooled([load_run(r["run_dir"]) for r in runs if r["arm"] == "baseline"])
    assert sorted((s.concurrency, s.repeat) for s in base.levels) == [(1, 0), (1, 1), (4, 0), (4, 1)]


# A server that never answers, ignores SIGTERM and has started a child of its own.
STUCK = (
    "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
)


def test_a_server_that_never_becomes_healthy_is_stopped_at_the_time_limit(
    tmp_path: Path, procs: Procs
) -> None:
    plan = _plan(
        tmp_path,
        f"""
        [[arms]]
        label = "stuck"
        command = {json.dumps(["{python}", "-c", STUCK, "{port}"])}
        ready_timeout_s = 1
        stop_grace_s = 1
        [[arms]]
        label = "other"
        command = {json.dumps(SIM)}
        """,
    )
    code, log = _run(procs, tmp_path, plan, *ONE_LEVEL)
    assert code == 3, log
    assert "the server of stuck did not become healthy within 1 s" in log
    doc = _doc(tmp_path)
    assert doc["status"] == "failed" and [r["status"] for r in doc["runs"]] == ["not-ready", "pending"]
    assert doc["runs"][0]["server_log"].endswith("01-stuck.server.log")
    _assert_no_server_left(doc)  # its whole process group, by SIGKILL after the grace period


def test_flags_are_checked_before_anything_starts(tmp_path: Path) -> None:
    from specload.experiment.run import ExperimentSettings, run_experiment

    out = str(tmp_path / "out")
    for settings in (
        ExperimentSettings(str(EXAMPLE), repeat=0, out=out),
        ExperimentSettings(str(EXAMPLE), out=out, overrides={"levels": "0"}),
        ExperimentSettings(str(EXAMPLE), out=out, report_format="yaml"),
        ExperimentSettings(str(tmp_path / "missing.toml"), out=out),
    ):
        assert run_experiment(settings) == 2
    assert not (tmp_path / "out").exists()


def test_a_server_that_dies_mid_arm_ends_it_and_keeps_its_partial_run(tmp_path: Path, procs: Procs) -> None:
    plan = _plan(
        tmp_path,
        f"""
        [[arms]]
        label = "dies"
        command = {json.dumps([*FAST_BATCH, "--fault-die-after", "5"])}
        [[arms]]
        label = "other"
        command = {json.dumps(FAST_BATCH)}
        """,
    )
    code, log = _run(procs, tmp_path, plan, *ONE_LEVEL)
    assert code == 1, log
    doc = _doc(tmp_path)
    first = doc["runs"][0]
    assert first["status"] == "server-died" and "the server of dies exited (code" in first["message"]
    assert doc["runs"][1]["status"] == "pending"
    _assert_no_server_left(doc)
    assert first["run_dir"] and Path(first["run_dir"], "server.log").exists()
    assert first["message"].endswith(
        f"its log: {Path(first['run_dir'], 'server.log')}"
    )  # where it is now (L5)
    _reportable(first["run_dir"])


def test_a_disk_that_cannot_take_experiment_json_is_said_once_and_the_experiment_goes_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The review's L6: ENOSPC from experiment.json's save escaped as tracebacks mid-experiment."""
    import errno
    from types import SimpleNamespace

    from specload.experiment import record

    def full(path: str, data: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(record, "write_json_atomic", full)
    ex = SimpleNamespace(path=tmp_path / "experiment.json", to_json=lambda: {})
    record.Experiment.save(ex)  # type: ignore[arg-type]
    record.Experiment.save(ex)  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert err.count("cannot write") == 1 and "No space left on device" in err


def test_a_speculative_arm_without_acceptance_is_refused(tmp_path: Path, procs: Procs, sim: Any) -> None:
    """The baseline here is a url arm: a server specload neither starts nor stops."""
    running = sim("--engine", "batch", "--preset", "baseline", "--time-scale", "0.1")
    plan = _plan(
        tmp_path,
        f"""
        [sweep]
        backend = "sglang"
        [[arms]]
        label = "baseline"
        url = "{running.url}"
        [[arms]]
        label = "mtp"
        speculative = true
        command = {json.dumps([*FAST_BATCH, "--preset", "mtp", "--param", "spec_accept_prob=0.0"])}
        """,
    )
    code, log = _run(procs, tmp_path, plan, *ONE_LEVEL)
    assert code == 4, log
    assert "speculation is not active on mtp: accept length 1.00 from meta_info.spec_verify_ct" in log
    doc = _doc(tmp_path)
    assert [r["status"] for r in doc["runs"]] == ["completed", "refused"]
    assert doc["runs"][1]["run_dir"] is None  # refused before any load
    assert doc["runs"][0]["pid"] is None and doc["runs"][0]["url"] == running.url
    _assert_no_server_left(doc)
    assert running.proc.poll() is None, "a url arm's server is left running"
    _reportable(doc["runs"][0]["run_dir"])


def test_ctrl_c_during_an_arm_stops_its_sweep_and_its_server(tmp_path: Path, procs: Procs) -> None:
    plan = _plan(
        tmp_path,
        f"""
        [[arms]]
        label = "slow"
        command = {json.dumps([*SIM, "--itl-ms", "20"])}
        [[arms]]
        label = "other"
        command = {json.dumps(SIM)}
        """,
    )
    flags = [
        "--levels",
        "1,4",
        "--requests-per-level",
        "50",
        "--output-tokens",
        "100",
        "--input-tokens",
        "16",
    ]
    cmd = specload_cmd("experiment", str(plan), "--out", str(tmp_path / "out"), "--no-plot", *flags)
    proc = procs.popen(cmd)

    def sweeping() -> dict[str, Any] | None:
        assert proc.poll() is None, procs.log(proc)
        try:
            doc = _doc(tmp_path)
        except (ValueError, OSError):
            return None
        first = doc["runs"][0]
        run_dirs = list(Path(doc["directory"]).glob("slow-*/run.json"))
        return doc if first["status"] == "sweeping" and run_dirs else None

    wait_until(sweeping, 60, "the first arm's sweep", interval=0.2)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 1, procs.log(proc)
    doc = _doc(tmp_path)
    assert doc["status"] == "interrupted" and [r["status"] for r in doc["runs"]] == ["interrupted", "pending"]
    _assert_no_server_left(doc)
    run_dir = doc["runs"][0]["run_dir"]
    assert load_run(run_dir).info.status == "interrupted"
    _reportable(run_dir)


def test_no_server_outlives_a_sigkill_of_specload(tmp_path: Path, procs: Procs) -> None:
    """PR_SET_PDEATHSIG: the kernel stops the server when specload dies without a chance to."""
    plan = _plan(
        tmp_path,
        f"""
        [[arms]]
        label = "stuck"
        command = ["{{python}}", "-c", "import time; time.sleep(60)", "{{port}}"]
        ready_timeout_s = 60
        [[arms]]
        label = "other"
        command = {json.dumps(SIM)}
        """,
    )
    proc = procs.popen(specload_cmd("experiment", str(plan), "--out", str(tmp_path / "out"), *ONE_LEVEL))

    def started() -> int | None:
        assert proc.poll() is None, procs.log(proc)
        try:
            return int(_doc(tmp_path)["runs"][0]["pid"] or 0) or None
        except (ValueError, OSError):
            return None

    pid = wait_until(started, 30, "the server to start", interval=0.1)
    proc.kill()
    proc.wait(timeout=10)
    wait_until(lambda: _gone(pid), 5, f"server {pid} to be gone after specload's SIGKILL")
