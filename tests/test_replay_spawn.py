"""A worker handles the master's spawn messages without holding its hub for seconds.

With ``--processes 2`` and the 512-user pool of a trace replay (or any rate level), a loaded machine
(load 10 on 2 cores) ended the sweep "interrupted" about 5 s into the level, nothing sent: both
workers missed the master's heartbeat liveness (3 s) while Locust's ``WorkerRunner.handle_message``
built and parsed Locust's whole argument parser once per option of each of the six spawn messages
(specload.locust.spawnargs). The test runs Locust's own spawn handling, as a worker process that
loaded specload's plugin has it, and counts the parsers it builds. Locust monkey-patches the
process it is imported in, so that part runs in a child (this file as a script).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _child(*args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_spawn_messages_build_locusts_default_parser_once() -> None:
    got = _child("spawn")
    assert got["options"] > 100  # (specload's options and Locust's: the count that made it slow)
    # Unfixed: one parser per option per message (6 x 116 = 696, ~0.9 s of CPU); now the first call's, once.
    assert got["built"] <= 1, got
    assert got["cpu_s"] < 0.3, got
    # The master's own options still reach the worker, Locust's defaults do not.
    assert got["kept_trace_format"] and not got["has_num_users"]


def test_the_defaults_are_locusts_own() -> None:
    assert _child("defaults") == {"same": True}


# ---------------------------------------------------------------- the child


class _Spawned:
    def link_exception(self, _: Any) -> None:
        pass

    def kill(self, block: bool = True) -> None:
        pass


class _Greenlets:
    """The runner's greenlet group: the spawn job is left unstarted (no users are the point here)."""

    def spawn(self, _: Any) -> _Spawned:
        return _Spawned()

    def __len__(self) -> int:
        return 0


def _worker() -> Any:
    """Locust's WorkerRunner with only what its spawn handling touches (no master, no greenlets)."""
    from locust.runners import WorkerRunner

    w = object.__new__(WorkerRunner)
    env = SimpleNamespace(
        host=None,
        stop_timeout=None,
        parsed_options=SimpleNamespace(),
        events=SimpleNamespace(test_start=SimpleNamespace(fire=lambda **_: None)),
        _filter_tasks_by_tags=lambda: None,
        stats=SimpleNamespace(clear_all=lambda: None),
    )
    w.__dict__.update(
        environment=env,
        client=SimpleNamespace(send=lambda _: None),
        client_id="w",
        last_received_spawn_timestamp=0,
        worker_state="ready",
        spawning_greenlet=None,
        greenlet=_Greenlets(),
    )
    return w


def _spawn() -> dict[str, Any]:
    from locust import argument_parser
    from locust.rpc import Message

    import specload.locust.plugin  # noqa: F401  (what a worker process loads: it installs the fix)

    # What a master sends in every spawn message: every option, Locust's and specload's (added by
    # the plugin's init_command_line_parser listener, which get_parser fires).
    options = vars(argument_parser.get_parser().parse_args([]))
    built = 0
    make = argument_parser.get_empty_argument_parser

    def counted(*a: Any, **kw: Any) -> Any:
        nonlocal built
        built += 1
        return make(*a, **kw)

    argument_parser.get_empty_argument_parser = counted
    w = _worker()
    cpu = time.process_time()
    for i in range(6):  # 512 users at 100/s: six spawn messages per worker
        job = {"timestamp": 1.0 + i, "host": "h", "stop_timeout": 5, "parsed_options": options}
        w.handle_message(Message("spawn", {**job, "user_classes_count": {"U": 100 * i}}, "w"))
    got = w.environment.parsed_options
    return {
        "options": len(options),
        "built": built,
        "cpu_s": time.process_time() - cpu,
        "kept_trace_format": getattr(got, "trace_format", "absent") == options["trace_format"],
        "has_num_users": hasattr(got, "num_users"),
    }


def _defaults() -> dict[str, Any]:
    from locust import argument_parser

    from specload.locust import spawnargs

    spawnargs.install()
    spawnargs.install()  # (idempotent)
    got = argument_parser.default_args_dict()
    got["num_users"] = -1  # a caller's copy
    parser = argument_parser.get_empty_argument_parser()
    argument_parser.setup_parser_arguments(parser)
    parser._default_config_files = {}
    return {"same": argument_parser.default_args_dict() == vars(parser.parse([]))}


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    print(json.dumps(_spawn() if sys.argv[1] == "spawn" else _defaults()))
