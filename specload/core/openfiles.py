"""Open files a level of C users needs, against this process's limit: the one check that both
``specload sweep`` (before Locust starts) and the web UI's start form make, so that the form refuses
the C=100000 the command line refuses instead of starting users that fail as if the server had
refused their connections."""

from __future__ import annotations

FD_HEADROOM = 64  # files a Locust process holds besides one connection per user (logs, CSV, ZMQ, ...)


def files_needed(max_concurrency: int, processes: int) -> int:
    """Files per Locust process for ``max_concurrency`` users spread over ``processes``."""
    return -(-max_concurrency // max(1, processes)) + FD_HEADROOM


def open_files_problem(max_concurrency: int, processes: int, raise_soft: bool = True) -> str | None:
    """Why a level of ``max_concurrency`` users over ``processes`` Locust processes cannot open its
    connections here, or None. ``raise_soft``: the processes are yet to start, so the soft limit is
    raised as far as the hard one allows (they inherit it) and only the hard one counts; without it
    (processes already running) the soft limit in force is the limit."""
    try:
        import resource
    except ImportError:  # not a POSIX system: nothing to ask
        return None
    need = files_needed(max_concurrency, processes)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = hard if raise_soft else soft
    if limit != resource.RLIM_INFINITY and limit < need:
        return (
            f"C={max_concurrency} needs about {need} open files per Locust process, and "
            f"this shell allows {limit} (ulimit -n): raise the limit, or spread the users "
            f"over processes (--processes N) or machines (--workers N)"
        )
    if raise_soft and soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY else min(hard, need), hard)
        )
    return None
