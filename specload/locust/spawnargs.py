"""A worker reads the master's spawn message in milliseconds, not seconds.

Locust's worker keeps only the master's options that are not Locust's own defaults, and finds
those defaults by calling ``argument_parser.default_args_dict()`` once per option of every spawn
message (``WorkerRunner.handle_message``): a new argument parser built and parsed about 116 times
per message with specload's options, ~0.17 s of CPU on a quiet core. A level of 512 users at
specload's spawn rate of 100/s is six spawn messages per worker, handled back to back on the
worker's hub; on a loaded 2-core machine (load 10) that holds it for seconds, no heartbeat reaches
the master within its liveness (3 missed 1 s beats), the master marks every worker missing and
stops the test, and the sweep ends "interrupted" about 5 s into the level with nothing sent.

The defaults are the same at every call in a process (Locust's own options, parsed with no
arguments, no config file, the process's environment), so they are computed once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def install() -> None:
    """Make ``locust.argument_parser.default_args_dict`` compute its dict once per process (each
    caller gets a copy). Idempotent."""
    from locust import argument_parser

    original: Callable[[], dict[str, Any]] = argument_parser.default_args_dict
    if getattr(original, "specload_once", False):
        return
    once = functools.cache(original)

    def default_args_dict() -> dict[str, Any]:
        return dict(once())

    default_args_dict.specload_once = True  # type: ignore[attr-defined]
    argument_parser.default_args_dict = default_args_dict
