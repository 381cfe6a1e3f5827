"""A second core for report and compare: work done in a forked copy of this process.

Why it stays: decoding records.jsonl is most of a report's time (msgspec; every figure after it
takes ~1 µs a record with numpy). ``compare`` of the bench's two 5M-record runs takes 74-84 s of
CPU (docs/bench.md): in one process, over the 60 s goal; over two cores, 44-51 s read cold.
``columns.read_columns(processes=2)`` reads the second half of a big file in a child made here, at
the same time as the first half.

``Child(fn)`` forks; the child computes ``fn()``, sends the value back pickled through a pipe and
exits; ``result()`` waits for it. The child starts with the parent's memory as it was at the fork
(shared, copy-on-write), so nothing is pickled on the way in and nothing is imported again: the
columns of a run already read are there for it to use. Only the result travels.

Clean by construction: the child never returns into the caller's code (it leaves with
``os._exit``, after its value or after any exception, a KeyboardInterrupt included), and the parent
reaps it in every case (``result()``, or ``stop()`` on the way out of a ``with`` block, which kills
it first when its result was not taken). Only for single-threaded processes without an event loop
(the ``specload report`` and ``specload compare`` commands), since a fork copies only the calling
thread; ``available()`` is False where there is no fork.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import IO, Any, Generic, TypeVar

T = TypeVar("T")


class ChildFailed(Exception):
    """The child died or raised before sending its result (its traceback went to stderr)."""


def available() -> bool:
    return hasattr(os, "fork")


class Child(Generic[T]):
    """``fn()`` computed in a forked child process (see the module's docstring). ``send(value, f)``
    writes the value into the pipe and ``receive(f)`` reads it back, in parts where the value is too
    big to be pickled whole (a pickler keeps what it wrote until it is done)."""

    def __init__(
        self, fn: Callable[[], Any], send: Callable[[Any, IO[bytes]], None], receive: Callable[[IO[bytes]], T]
    ) -> None:
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                os.close(read_fd)
                value = fn()
                with os.fdopen(write_fd, "wb") as f:
                    send(value, f)
                code = 0
            except BrokenPipeError:  # the parent stopped listening: it did not want the rest
                code = 0
            except BaseException:  # noqa: BLE001 - whatever happens, the child must not run the caller's code
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(write_fd)
        self.pid: int | None = pid
        self._read_fd = read_fd
        self._receive = receive

    def result(self) -> T:
        """The child's value; raises ChildFailed when it did not send one."""
        try:
            with os.fdopen(self._read_fd, "rb") as f:
                value = self._receive(f)
        except (EOFError, pickle.UnpicklingError):
            raise ChildFailed(f"process {self.pid} exited without a result") from None
        finally:
            self._reap()
        return value

    def stop(self) -> None:
        """Kill the child if it still runs, and reap it (the result is lost)."""
        if self.pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.close(self._read_fd)
        with contextlib.suppress(ChildFailed):  # it failed before it was killed: nothing more to say
            self._reap()

    def _reap(self) -> None:
        if self.pid is not None:
            pid, self.pid = self.pid, None
            _, status = os.waitpid(pid, 0)
            if status and not os.WIFSIGNALED(status):
                raise ChildFailed(f"process {pid} exited with status {os.waitstatus_to_exitcode(status)}")

    def __enter__(self) -> Child[T]:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
