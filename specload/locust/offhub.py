"""Blocking work kept off the gevent hub of the process that drives a sweep.

A blocking call on the hub stops every greenlet: the sweep's users, its loop-lag probe, the web
page. Every read of a run directory is bounded (specload.core.safeopen), but a file system can
still hold a read in the kernel (a hung NFS mount, FUSE), and so the web UI's reads of the results
folder go through ``off_hub``. Imports gevent alone, not Locust.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import gevent

T = TypeVar("T")


def off_hub(fn: Callable[..., T], *args: Any, timeout: float) -> T:
    """``fn(*args)`` in a native thread of gevent's pool, waited for up to ``timeout`` s (gevent.Timeout
    after). A call that never returns keeps one pool thread, nothing else."""
    return cast(T, gevent.get_hub().threadpool.spawn(fn, *args).get(timeout=timeout))
