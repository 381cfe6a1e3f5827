"""Samples the server's ``/metrics`` into server_samples.jsonl through a run.

The sweep owner's process also generates load (its users, or with workers the level control and
the clock), so nothing of a sample runs on its hub: the page is fetched and parsed
(``specload.client.introspect.parse_metrics``) in the sampler's own native thread, with its own
gevent hub and HTTP client. A page is read up to MAX_PAGE_BYTES (real ones are about 100 KB) and
within a deadline (min(interval, SAMPLE_DEADLINE_S), at least 1 s) for the whole sample, connect
to parse; a page over the cap, or late, is a missed sample: written as a ``missed`` line that the
report counts per level (analysis.run.missed_sample_notes), never a stall of the load or a hang
before level 1.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any, cast

import gevent
import gevent.threadpool
import orjson

from specload.client.http import base_headers, endpoint, make_client
from specload.client.introspect import parse_metrics
from specload.core.records import now
from specload.core.rundir import SERVER_SAMPLES

logger = logging.getLogger("specload")

MAX_PAGE_BYTES = 8 << 20  # a /metrics page read at most (vLLM's and SGLang's are about 100 KB)
SAMPLE_DEADLINE_S = 5.0  # one sample, connect to parse, at the longest (shorter at a short interval)
_BLOCK = 64 << 10
_IDLE_S = 10.0  # the sampler's thread ends after this long without a sample to take (the run ended)


class MissedSample(Exception):
    """A sample not taken: the page too big, too slow, or not there (the message says which)."""


Fetched = tuple[dict[str, float | None] | None, str | None]  # (values, why missed)


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
        self.insecure = insecure
        self.deadline = max(1.0, min(interval, SAMPLE_DEADLINE_S))
        self.max_bytes = MAX_PAGE_BYTES
        # One native thread: the client is made, used and closed there alone (its own hub).
        # (an idle thread ends by itself after IDLE_S: nothing to kill at the end of a run)
        self._thread = gevent.threadpool.ThreadPool(1, idle_task_timeout=max(_IDLE_S, 3 * interval))
        self._client: Any = None
        self._client_hub: Any = None
        self.greenlet: gevent.Greenlet | None = None
        self.samples = 0
        self.missed: dict[int | None, int] = {}  # per level index: samples not taken
        self.status = "starting"

    # in the sampler's thread ------------------------------------------------------------------
    def _read_page(self) -> bytes:
        if self._client is None or self._client_hub is not gevent.get_hub():
            # (a client belongs to the hub of the thread that made it: a new thread, after the idle
            # one ended, makes its own; thread ids are reused, hubs are not)
            self._client = make_client(self.host, self.deadline, self.deadline, self.insecure)
            self._client_hub = gevent.get_hub()
        resp = self._client.get(endpoint(self.host, "/metrics"), headers=self.headers)
        whole = False
        try:
            if resp.status_code != 200:
                raise MissedSample(f"HTTP {resp.status_code}")
            length = resp.content_length
            if length is not None and length > self.max_bytes:
                raise MissedSample(f"a page of {length} bytes, over the {self.max_bytes} read")
            parts: list[bytes] = []
            got = 0
            while chunk := resp.read(_BLOCK):
                parts.append(chunk)
                got += len(chunk)
                if got > self.max_bytes:
                    raise MissedSample(f"a page over the {self.max_bytes} bytes read")
            whole = True
            return b"".join(parts)
        finally:
            resp.release()
            if not whole:
                self._drop_client()  # its connection holds the unread rest of the page

    def _drop_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _fetch_here(self) -> Fetched:
        """One sample, in the sampler's thread, within the deadline; never raises (a failure is
        returned, not reported by the pool on stderr)."""
        try:
            with gevent.Timeout(self.deadline, MissedSample(f"no whole page within {self.deadline:g} s")):
                return parse_metrics(self._read_page().decode("utf-8", "replace")), None
        except MissedSample as e:
            return None, str(e)
        except gevent.Timeout:
            return None, f"no whole page within {self.deadline:g} s"
        except Exception as e:  # noqa: BLE001 - a missed sample is not worth a failed sweep
            self._drop_client()
            return None, f"{type(e).__name__}: {e}"

    # on the hub: waits for the thread cooperatively --------------------------------------------
    def fetch_or_why(self) -> Fetched:
        """The page's values, or why the sample was missed; the hub waits, never works."""
        try:
            return cast(Fetched, self._thread.spawn(self._fetch_here).get(timeout=self.deadline + 2.0))
        except gevent.Timeout:  # the thread itself is stuck (its deadline did not fire): skip
            return None, f"the sampler's thread did not answer within {self.deadline + 2.0:g} s"

    def fetch(self) -> dict[str, float | None] | None:
        return self.fetch_or_why()[0]

    def _miss(self, why: str | None, closes: int | None = None) -> None:
        level = self.level_of() if closes is None else closes
        first = level not in self.missed
        self.missed[level] = self.missed.get(level, 0) + 1
        if first:
            logger.warning("server metrics: a sample missed (%s); the report counts them per level", why)
        self._append({"t": now(), "level": level, "missed": why or "no values"})

    def start(self) -> bool:
        """False (and no sampling) when the server has no usable /metrics."""
        first, why = self.fetch_or_why()
        if why is not None:
            logger.info("no server metrics (%s)", why)
        if first is None or all(v is None for v in first.values()):
            self.status = "unavailable"
            self._close()
            return False
        self.status = "sampling"
        self._write(first)
        self.greenlet = gevent.spawn(self._loop)
        return True

    def _append(self, line: dict[str, Any]) -> None:
        try:
            with open(self.path, "ab") as f:
                f.write(orjson.dumps(line) + b"\n")
        except OSError as e:  # a full disk: the sweep's owner reports it; sampling just stops
            logger.warning("server samples stopped: %s", e)
            self.greenlet = None  # (the loop ends with this greenlet)
            raise gevent.GreenletExit from None

    def _write(self, values: dict[str, float | None], closes: int | None = None) -> None:
        level = self.level_of() if closes is None else closes
        line = {"t": now(), "level": level, **values, **({"closes": closes} if closes is not None else {})}
        self._append(line)
        self.samples += 1
        if self.on_sample is not None:
            self.on_sample(line)

    def _take(self, closes: int | None = None) -> None:
        values, why = self.fetch_or_why()
        if values is not None:
            self._write(values, closes)
        else:
            self._miss(why, closes)

    def _loop(self) -> None:
        while True:
            gevent.sleep(self.interval)
            self._take()

    def sample_close(self, index: int) -> None:
        """One sample now, marked as closing run.json level ``index``: taken once every request of
        that level is back and before the next begins, so a counter's delta over the level can end
        at it (metrics.counter_window_end) instead of at the last periodic sample inside the level,
        up to an interval before its end (vLLM ngram at C=1, 0.2 s samples: 11 % of the drafts)."""
        if self.status != "sampling" or self.greenlet is None:
            return

        gevent.spawn(self._take, index)

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
        self._close()

    def _close(self) -> None:
        """The client closed in its own thread (which then ends once idle for _IDLE_S)."""
        with contextlib.suppress(Exception, gevent.Timeout):  # a stuck thread is left to the process's exit
            self._thread.spawn(self._drop_client).get(timeout=self.deadline + 2.0)
