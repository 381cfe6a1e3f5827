"""Samples the server's ``/metrics`` into server_samples.jsonl through a run, in its own greenlet.

Runs in the sweep owner's process; the page is parsed by ``specload.client.introspect.parse_metrics``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import gevent
import orjson

from specload.client.http import base_headers, endpoint, make_client
from specload.client.introspect import parse_metrics
from specload.core.records import now
from specload.core.rundir import SERVER_SAMPLES

logger = logging.getLogger("specload")


class MetricsSampler:
    """Samples ``/metrics`` every ``interval`` s into server_samples.jsonl until stopped."""

    def __init__(
        self,
        host: str,
        run_dir: str,
        level_of: Callable[[], int | None],
        interval: float = 1.0,
        insecure: bool = False,
        send_key: bool = True,
        on_sample: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.host, self.interval, self.level_of = host, interval, level_of
        self.on_sample = on_sample  # each sample as written (the web UI's live view)
        self.headers = base_headers(stream=False, send_key=send_key)
        self.path = os.path.join(run_dir, SERVER_SAMPLES)
        self.client = make_client(host, 10.0, 5.0, insecure)
        self.greenlet: gevent.Greenlet | None = None
        self.samples = 0
        self.status = "starting"

    def fetch(self) -> dict[str, float | None] | None:
        resp = self.client.get(endpoint(self.host, "/metrics"), headers=self.headers)
        body = resp.read()
        resp.release()
        if resp.status_code != 200:
            return None
        return parse_metrics(body.decode("utf-8", "replace"))

    def start(self) -> bool:
        """False (and no sampling) when the server has no usable /metrics."""
        try:
            first = self.fetch()
        except Exception as e:  # noqa: BLE001
            logger.info("no server metrics (%s)", e)
            first = None
        if first is None or all(v is None for v in first.values()):
            self.status = "unavailable"
            self.client.close()
            return False
        self.status = "sampling"
        self._write(first)
        self.greenlet = gevent.spawn(self._loop)
        return True

    def _write(self, values: dict[str, float | None], closes: int | None = None) -> None:
        level = self.level_of() if closes is None else closes
        line = {"t": now(), "level": level, **values, **({"closes": closes} if closes is not None else {})}
        try:
            with open(self.path, "ab") as f:
                f.write(orjson.dumps(line) + b"\n")
        except OSError as e:  # a full disk: the sweep's owner reports it; sampling just stops
            logger.warning("server samples stopped: %s", e)
            self.greenlet = None  # (the loop ends with this greenlet)
            raise gevent.GreenletExit from None
        self.samples += 1
        if self.on_sample is not None:
            self.on_sample(line)

    def _loop(self) -> None:
        while True:
            gevent.sleep(self.interval)
            try:
                values = self.fetch()
            except Exception:  # noqa: BLE001 - a missed sample is not worth a failed sweep
                continue
            if values is not None:
                self._write(values)

    def sample_close(self, index: int) -> None:
        """One sample now, marked as closing run.json level ``index``: taken once every request of
        that level is back and before the next begins, so a counter's delta over the level can end
        at it (metrics.counter_window_end) instead of at the last periodic sample inside the level,
        up to an interval before its end (vLLM ngram at C=1, 0.2 s samples: 11 % of the drafts)."""
        if self.status != "sampling" or self.greenlet is None:
            return

        def once() -> None:
            try:
                values = self.fetch()
            except Exception:  # noqa: BLE001 - the periodic samples still bound the level
                return
            if values is not None:
                self._write(values, closes=index)

        gevent.spawn(once)

    def stop(self) -> None:
        if self.greenlet is not None:
            self.greenlet.kill(block=False)
            self.greenlet = None
        if self.status == "sampling":
            try:
                values = self.fetch()
                if values is not None:
                    self._write(values)
            except Exception:  # noqa: BLE001
                pass
            self.status = "stopped"
        self.client.close()
