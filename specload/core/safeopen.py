"""Opening a file that specload did not write itself this minute: a run directory's files, another
tool's result, a dataset.

Such a directory may come from anywhere (an archive unpacked into results/ keeps FIFOs and symlinks),
and a plain ``open()`` of a FIFO blocks until someone writes to it, while a link to ``/dev/zero``
reads without end. Every such read goes through ``open_regular``: the path is checked before it is
opened (a link is followed only to a regular file, so no device is ever opened), the open cannot
block, the file is checked again after the open, and its size must be under a cap. ``read_bytes``
also gives the whole read a deadline (checked between chunks: one read of a regular file returns, a
network file system that trickles is cut off). A refusal is an ``UnsafeFile``, an ``OSError``,
so every caller that already copes with an unreadable file copes with it.
"""

from __future__ import annotations

import io
import os
import stat
import time
from pathlib import Path

# A JSON document specload reads whole (run.json, a foreign result, a dataset file): far above any
# real one (a 100,000-request vLLM result is about 100 MB), far below what would exhaust memory.
MAX_DOCUMENT_BYTES = 1 << 30
# The whole read of one file: minutes of local disk at the cap, never "forever".
READ_DEADLINE_S = 120.0
_CHUNK = 1 << 20


class UnsafeFile(OSError):
    """A path that is not a regular file, or too big, or too slow to read: left out, with this message."""


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def open_regular(path: str | Path, max_bytes: int | None = MAX_DOCUMENT_BYTES) -> io.BufferedReader:
    """``path`` opened for binary reading, if it is a regular file (a link to one is fine) of at most
    ``max_bytes`` (None: any size). Raises UnsafeFile (an OSError) otherwise, and the OSErrors of
    ``open`` (no such file, no permission)."""
    st = os.stat(path)  # follows a link: what would be opened, checked before it is
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(f"{path}: {_kind(st.st_mode)}, not read (only regular files are)")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)  # what was opened (the path may have changed since the check)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{path}: {_kind(st.st_mode)}, not read (only regular files are)")
        if max_bytes is not None and st.st_size > max_bytes:
            raise UnsafeFile(f"{path}: {st.st_size} bytes, more than the {max_bytes} read from such a file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(
    path: str | Path, max_bytes: int | None = MAX_DOCUMENT_BYTES, deadline_s: float = READ_DEADLINE_S
) -> bytes:
    """The whole of the regular file ``path`` (``open_regular``), read within ``deadline_s``; a file
    that grew past ``max_bytes`` while it was read is refused too."""
    end = time.monotonic() + deadline_s
    parts: list[bytes] = []
    got = 0
    with open_regular(path, max_bytes) as f:
        while chunk := f.read(_CHUNK):
            parts.append(chunk)
            got += len(chunk)
            if max_bytes is not None and got > max_bytes:
                raise UnsafeFile(f"{path}: grew past the {max_bytes} bytes read from such a file")
            if time.monotonic() > end:
                raise UnsafeFile(f"{path}: not read within {deadline_s:g} s")
    return b"".join(parts)


def read_text(
    path: str | Path, max_bytes: int | None = MAX_DOCUMENT_BYTES, deadline_s: float = READ_DEADLINE_S
) -> str:
    """``read_bytes`` decoded as UTF-8 (raises UnicodeDecodeError, a ValueError, on other bytes)."""
    return read_bytes(path, max_bytes, deadline_s).decode("utf-8")
