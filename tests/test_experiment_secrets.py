"""``specload experiment`` writes and prints no secret (review 3a7af2e, M19, M20): not the ones a server
prints to its log, not specload's API key (which no server inherits), not a url arm's user:password.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

from specload.experiment.plan import plan_from_dict
from specload.experiment.record import known_secrets
from specload.experiment.servers import PASSED_ENV, server_environment, start_server
from tests.conftest import Procs, free_port, specload_cmd, wait_until

KEY = "sk-USER-888"  # specload's API key
HF = "hf_SECRET123"  # an arm's secret environment value
ARM_KEY = "ak-ARMSECRET-5"  # the value of an arm's --api-key


def _everything(tmp_path: Path, log: str) -> str:
    """specload's output and every file it wrote under --out."""
    files = [p.read_text(errors="replace") for p in (tmp_path / "out").rglob("*") if p.is_file()]
    return "\n".join([log, *files])


def test_a_servers_log_reaches_no_message_or_file_with_its_secrets(tmp_path: Path, procs: Procs) -> None:
    # the server prints its secrets, its command line and what it knows of specload's keys, then exits
    shout = (
        'echo "port $0: hf_token=$HF_TOKEN, args $*, client key ${SPECLOAD_API_KEY:-none}, '
        'openai ${OPENAI_API_KEY:-none}, master ${SPECLOAD_MASTER_TOKEN:-none}"; exit 1'
    )
    plan = tmp_path / "exp.toml"
    plan.write_text(
        textwrap.dedent(
            f"""
            [[arms]]
            label = "a"
            command = {json.dumps(["bash", "-c", shout, "{port}", "--api-key", ARM_KEY])}
            env = {{ HF_TOKEN = "{HF}" }}
            [[arms]]
            label = "b"
            url = "http://127.0.0.1:9"
            """
        )
    )
    env = {
        **os.environ,
        "SPECLOAD_API_KEY": KEY,
        "OPENAI_API_KEY": "sk-OPENAI-7",
        "SPECLOAD_MASTER_TOKEN": "mt-9",
    }
    proc = procs.popen(
        specload_cmd("experiment", str(plan), "--out", str(tmp_path / "out"), "--no-plot"), env=env
    )
    assert proc.wait(timeout=60) == 3
    seen = _everything(tmp_path, procs.log(proc))
    assert "exited (code 1) before it became healthy" in seen and "<redacted>" in seen, seen
    for secret in (KEY, HF, ARM_KEY):
        assert secret not in seen, seen
    # the server had none of specload's keys: they are not redacted, they are absent
    assert "client key none, openai none, master none" in seen, seen


def test_the_log_of_a_healthy_server_is_scrubbed_when_it_stops(tmp_path: Path) -> None:
    # SGLang, for one, prints its parsed arguments, --api-key included
    said = "import sys, time; print('ServerArgs(api_key=%r, port=%s)' % (sys.argv[2], sys.argv[3]), flush=True); time.sleep(600)"
    arm = plan_from_dict(
        {
            "arms": [
                {"label": "a", "command": [sys.executable, "-c", said, "--api-key", ARM_KEY, "{port}"]},
                {"label": "b", "url": "http://127.0.0.1:9"},
            ]
        },
        str(tmp_path / "x.toml"),
    ).arms[0]
    assert ARM_KEY in known_secrets(arm)
    log = tmp_path / "server.log"
    server = start_server(arm, 9, log, known_secrets(arm))
    try:
        wait_until(lambda: "ServerArgs" in log.read_text(), 10, "the server to print its arguments")
        assert ARM_KEY not in server.log_tail()
    finally:
        server.stop(1)
    text = log.read_text()
    assert "ServerArgs(api_key='<redacted>', port=9)" in text and ARM_KEY not in text, text


def test_a_server_gets_the_arms_environment_and_only_the_listed_part_of_specloads() -> None:
    ours = {
        "PATH": "/bin",
        "HOME": "/h",
        "LC_ALL": "C",
        "CUDA_VISIBLE_DEVICES": "1",
        "SPECLOAD_API_KEY": KEY,
        "OPENAI_API_KEY": "sk-o",
        "SPECLOAD_MASTER_TOKEN": "mt",
        "HF_TOKEN": HF,
        "HTTPS_PROXY": "http://u:p@proxy:3128",
    }
    env = server_environment({"HF_TOKEN": "mine", "PATH": "/arm/bin"}, ours)
    assert env == {
        "PATH": "/arm/bin",
        "HOME": "/h",
        "LC_ALL": "C",
        "CUDA_VISIBLE_DEVICES": "1",
        "HF_TOKEN": "mine",
    }
    assert "PATH" in PASSED_ENV


def test_a_url_arms_password_is_dropped_before_it_is_printed_or_written(tmp_path: Path, procs: Procs) -> None:
    port = free_port()  # nothing listens there: the arm is not ready within its second
    plan = tmp_path / "exp.toml"
    plan.write_text(
        textwrap.dedent(
            f"""
            [[arms]]
            label = "base"
            url = "http://alice:pw-URLSECRET@127.0.0.1:{port}"
            ready_timeout_s = 1
            [[arms]]
            label = "spec"
            url = "http://bob:pw-URLSECRET2@127.0.0.1:{port}/"
            """
        )
    )
    proc = procs.popen(specload_cmd("experiment", str(plan), "--out", str(tmp_path / "out"), "--no-plot"))
    assert proc.wait(timeout=60) == 3
    log = procs.log(proc)
    seen = _everything(tmp_path, log)
    assert f"waiting for http://127.0.0.1:{port}/health" in log, log
    assert "the user:password in its url is not sent to the server and is dropped" in log, log
    assert "pw-URLSECRET" not in seen and "alice" not in seen, seen
    doc = json.loads(next((tmp_path / "out").rglob("experiment.json")).read_text())
    assert doc["runs"][0]["url"] == f"http://127.0.0.1:{port}" and doc["runs"][0]["status"] == "not-ready"
