"""The stepped-concurrency load shape: Locust asks it every second how many users to run.

All decisions are the sweep owner's (specload.locust.owner); the shape only translates them into
Locust's (user_count, spawn_rate) answer, and ``None`` when the sweep is over. It ticks only in
the process that owns the sweep (local runner or master), as Locust shapes do.
"""

from __future__ import annotations

import gevent
import locust.runners
from locust import LoadTestShape
from locust.runners import MasterRunner

from specload.locust.owner import sweep_owner


class SteppedConcurrencyShape(LoadTestShape):
    """Walks the scenario's concurrency levels, each a closed loop of C users."""

    def tick(self) -> tuple[int, float] | None:
        runner = self.runner
        assert runner is not None
        owner = sweep_owner(runner.environment)
        if owner.stopping:  # a stop signal: every ticket out comes back (or is written off) first
            owner.drain()
            return None
        if not owner.active and not owner.start():
            return None
        desired = owner.tick(self.get_current_user_count())
        if desired is None:
            owner.finish()
            if isinstance(runner, MasterRunner):
                # Let the workers' last Locust statistics reach the master before it quits.
                gevent.sleep(locust.runners.WORKER_REPORT_INTERVAL + 0.5)
            return None
        return desired, owner.spawn_rate()
