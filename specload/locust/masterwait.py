"""A worker whose master does not answer says so within seconds, naming the address.

Locust's worker logs nothing for its first 30 s of connection attempts (the retries are at debug
level) and then retries every 5 s for about 5 minutes: a mistyped host or a master that is not
started looks like a worker that hangs. The watch runs only while the worker runner is being
created (Locust blocks there until the master acknowledges), in the process that connects: with
``--processes N`` the forked children, not the parent that waits for them.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import gevent

logger = logging.getLogger("specload")

FIRST_SAY_S = 5.0  # the master answers a worker on the same network in milliseconds
SAY_EVERY_S = 30.0
# Locust's worker gives up after CONNECT_RETRY_COUNT attempts of CONNECT_TIMEOUT s (locust.runners):
# 60 x 5 s. Not imported here, so that this module loads without Locust's monkey-patching.
GIVE_UP_S = 300.0


def unanswered_message(master_host: str, master_port: int, waited_s: float) -> str:
    """Why a worker may hear nothing, most likely first; the address checked by a name lookup."""
    where = f"{master_host}:{master_port}"
    try:
        socket.getaddrinfo(master_host, master_port, type=socket.SOCK_STREAM)
    except OSError as e:
        return (
            f"no master at {where}: the name {master_host!r} does not resolve ({e}); "
            "check --master-host. Still trying"
        )
    return (
        f"the master at {where} has not answered in {waited_s:.0f} s: is `specload sweep --workers N "
        f"--master-bind-host ... --master-bind-port {master_port}` running there, with the same "
        f"SPECLOAD_MASTER_TOKEN, and is the port open to this machine? Still trying (Locust gives up "
        f"after about {GIVE_UP_S / 60:.0f} min)"
    )


def _say_while_unanswered(master_host: str, master_port: int) -> None:
    waited = FIRST_SAY_S
    gevent.sleep(FIRST_SAY_S)
    while True:
        logger.warning("%s", unanswered_message(master_host, master_port, waited))
        gevent.sleep(SAY_EVERY_S)
        waited += SAY_EVERY_S


def install() -> None:
    """Wrap ``Environment.create_worker_runner`` (once) with the watch."""
    from locust.env import Environment

    original = Environment.create_worker_runner
    if getattr(original, "specload_watch", False):
        return

    def create_worker_runner(self: Any, master_host: str, master_port: int) -> Any:
        watch = gevent.spawn(_say_while_unanswered, master_host, master_port)
        try:
            return original(self, master_host, master_port)
        finally:
            watch.kill(block=False)

    create_worker_runner.specload_watch = True  # type: ignore[attr-defined]
    Environment.create_worker_runner = create_worker_runner  # type: ignore[method-assign]
