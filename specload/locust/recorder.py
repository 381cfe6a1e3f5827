"""The run recorder: everything a run leaves in its directory while Locust drives it: the directory
itself, records.jsonl, run.json (rewritten as the run goes, so a run stopped any way still says
what it did), capacity.json, the server's /metrics samples and Locust's own counts (locust.json).

A write that fails (a full disk) ends the sweep cleanly, once: what is on disk stays, and a little
space held from the start leaves room for the final run.json.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import locust

from specload import __version__
from specload.analysis.capacity import CAPACITY_JSON
from specload.analysis.live import LiveRun
from specload.analysis.metrics import ServerSample
from specload.analysis.streamed import STREAMED, StreamTally
from specload.client.http import redact_host
from specload.core.records import RequestRecord, record_line
from specload.core.rundir import (
    LOCUST_PREFIX,
    RUN_RUNNING,
    LevelMeta,
    RecordWriter,
    RunMeta,
    ServerInfo,
    claim_run_dir,
    new_run_dir,
    write_json_atomic,
    write_run_meta,
)
from specload.locust.resolve import CannotStart, ResolvedRun
from specload.locust.sampler import MetricsSampler
from specload.sweep.capacity import CapacityRun

logger = logging.getLogger("specload")


class RunRecorder:
    """The run directory of each run of one Locust process.

    ``on_write_error``: the reason, when a write failed (the owner stops the sweep with it).
    """

    _RESERVE = ".space-reserve"
    _RESERVE_BYTES = 32 * 1024

    def __init__(self, environment: Any, on_write_error: Callable[[str], None]) -> None:
        self.env = environment
        self.on_write_error = on_write_error
        self.run_dir: str | None = None
        self.writer: RecordWriter | None = None
        self.meta = RunMeta()
        self.write_error: str | None = None  # the first failed write to the run directory
        self.sampler: MetricsSampler | None = None
        self._run_dir_used = False
        self.streams = StreamTally()  # the tokens the streams read, per level (streamed.jsonl)
        self._streamed: Any = None  # streamed.jsonl, open from the run's first sample

    def open(self, label: str) -> str:
        """A new run directory, records.jsonl in it open; CannotStart when it cannot be made."""
        self.run_dir = self._open_run_dir(label)
        self.writer = RecordWriter(self.run_dir)
        self.streams = StreamTally()
        if self._streamed is not None:
            with contextlib.suppress(OSError):
                self._streamed.close()
            self._streamed = None
        self.write_error = None
        self._reserve_space()
        return self.run_dir

    def _open_run_dir(self, label: str) -> str:
        """``--run-dir`` for the first run of this process (``specload sweep`` made it), else a new one."""
        opts = self.env.parsed_options
        try:
            if opts.run_dir and not self._run_dir_used:
                self._run_dir_used = True
                return claim_run_dir(opts.run_dir)
            return new_run_dir(opts.results_dir or "results", label)
        except OSError as e:
            raise CannotStart(f"cannot create the run directory: {e}") from None

    def new_meta(self, run: ResolvedRun, levels: list[LevelMeta]) -> RunMeta:
        sc, opts = run.scenario, self.env.parsed_options
        self.meta = RunMeta(
            specload_version=__version__,
            locust_version=locust.__version__,
            label=run.label,
            host=redact_host(run.config.host),
            backend=sc.backend,
            model=run.config.model,
            model_source=run.model_source,
            scenario_file=getattr(opts, "scenario", "") or None,
            scenario=sc.to_dict(),
            prompts=run.config.prompts.describe(),
            started_at=time.time(),
            status=RUN_RUNNING,
            mode=type(self.env.runner).__name__.replace("Runner", "").lower(),
            levels=levels,
            server=ServerInfo(run.server),
            simulated=bool(run.server.get("simulated", False)),
            server_metrics="off",
            trace=run.trace_meta(),
        )
        return self.meta

    def start_sampler(
        self, run: ResolvedRun, level_index: Callable[[], int | None], live: LiveRun | None
    ) -> str:
        """Sample the server's /metrics through the run; what run.json says about it."""
        sc = run.scenario
        if sc.metrics_interval_s <= 0:
            return "off"
        assert self.run_dir is not None
        self.sampler = MetricsSampler(
            run.config.host,
            self.run_dir,
            level_index,
            sc.metrics_interval_s,
            run.config.insecure,
            run.config.send_key,
            on_sample=None if live is None else lambda d: _add_sample(live, d),
        )
        return "sampled" if self.sampler.start() else "unavailable"

    def sample_level_close(self, index: int) -> None:
        """The server's counters as level ``index`` ends (MetricsSampler.sample_close)."""
        if self.sampler is not None:
            self.sampler.sample_close(index)

    def stop_sampler(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None

    # writes -----------------------------------------------------------------------------------
    def write_record(self, rec: RequestRecord | dict[str, Any]) -> None:
        """One line of records.jsonl: the record, or its dict as a worker shipped it. Nothing more
        once a write failed."""
        if self.writer is not None and self.write_error is None:
            try:
                self.writer.write(record_line(rec))
            except OSError as e:
                self.cannot_write("records.jsonl", e)

    def sample_streamed(self, level: int | None, t: float) -> None:
        """The streamed-token totals at ``t`` (the owner's tick) of the level streaming now (None:
        none) and of ended levels whose count still grew, kept and appended to streamed.jsonl
        (specload.analysis.streamed): the report's tok/s over time."""
        samples = self.streams.sample(level, t)
        if self.run_dir is None or self.write_error is not None or not samples:
            return
        try:
            if self._streamed is None:
                self._streamed = open(os.path.join(self.run_dir, STREAMED), "ab")  # noqa: SIM115 - the run's
            self._streamed.write(b"".join(s.to_json() + b"\n" for s in samples))
            self._streamed.flush()
        except OSError as e:
            self.cannot_write(STREAMED, e)

    def write_meta(self, levels: list[LevelMeta] | None = None) -> None:
        """run.json as it stands, with ``levels`` (the controller's, client figures in) if given."""
        if self.run_dir is None:
            return
        if levels is not None:
            self.meta.levels = levels
        try:
            write_run_meta(self.run_dir, self.meta)
        except OSError as e:
            self.cannot_write("run.json", e)

    def write_capacity(self, capacity: CapacityRun | None) -> None:
        if capacity is None or self.run_dir is None:
            return
        try:
            write_json_atomic(os.path.join(self.run_dir, CAPACITY_JSON), capacity.to_json())
        except OSError as e:
            self.cannot_write(CAPACITY_JSON, e)

    def write_locust_stats(self) -> None:
        """Locust's per-row counts into the run directory (locust.json), for the report's cross-check,
        unless the run was started with ``--json-file RUN/locust`` (Locust writes that one itself,
        later, at shutdown). Locust clears its statistics when the next run starts, so each run's
        are its own."""
        opts, runner = self.env.parsed_options, self.env.runner
        assert self.run_dir is not None
        target = os.path.join(self.run_dir, LOCUST_PREFIX)
        if opts is None or getattr(opts, "json_file", None) == target or runner is None:
            return
        entries = [e.serialize() for e in runner.stats.entries.values() if e.num_requests or e.num_failures]
        try:
            with open(target + ".json.tmp", "w") as f:
                json.dump(entries, f)  # (json: Locust's histograms have integer keys)
            os.replace(target + ".json.tmp", target + ".json")
        except OSError as e:
            logger.warning("could not write %s.json: %s", target, e.strerror or e)

    def cannot_write(self, what: str, e: OSError) -> None:
        """A full disk (or any write error) ends the sweep cleanly, once: what is on disk stays."""
        if self.write_error is not None:
            return
        self.write_error = f"cannot write {what} in {self.run_dir}: {e.strerror or e}"
        logger.error("%s; stopping the sweep (what was written so far is kept)", self.write_error)
        self.release_reserve()  # room for the final run.json, report and Locust's files
        self.on_write_error(self.write_error)

    def _reserve_space(self) -> None:
        """Hold a little disk space for the end of the run: a full disk must not also keep run.json
        saying "running" (the final write is the one that matters most)."""
        assert self.run_dir is not None
        try:
            with open(os.path.join(self.run_dir, self._RESERVE), "wb") as f:
                f.write(b"\0" * self._RESERVE_BYTES)
        except OSError:
            pass

    def release_reserve(self) -> None:
        if self.run_dir is not None:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(self.run_dir, self._RESERVE))


def _add_sample(live: LiveRun, line: dict[str, Any]) -> None:
    sample = ServerSample.from_dict(line)
    if sample is not None:
        live.add_sample(sample)
