"""Build (once) and find llama.cpp's ``llama-server`` for the real-server tests.

The source is a pinned release from the package registry: the ``llama-cpp-python`` sdist vendors the
llama.cpp tree (``vendor/llama.cpp``). Only the ``llama-server`` target is built (CMake, Release,
static libraries, no OpenSSL/curl, no web UI download, no tests or examples). The binary is cached
outside the clone::

    $SPECLOAD_CACHE                      (if set), else
    $XDG_CACHE_HOME/specload             (if set), else
    ~/.cache/specload
        downloads/llama_cpp_python-<ver>.tar.gz    the sdist (sha256-checked, kept for rebuilds)
        llama-server-<ver>/bin/llama-server        the binary
        llama-server-<ver>/build.json              how and how long it was built

A build runs in a temporary directory inside the cache and is renamed into place only when it is
complete, so an interrupted build never leaves a half-made cache entry; a file lock keeps two
concurrent builds (two pytest sessions) from racing. A second call returns the cached path at once.

Usage::

    python -m tests.real.llamacpp build     # build if needed, print the binary's path and timing
    python -m tests.real.llamacpp path      # print the cached binary's path (exit 1 if not built)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

# The pinned source: llama-cpp-python's sdist and the sha256 PyPI serves for it.
LCP_VERSION = "0.3.36"
LCP_SDIST = f"llama_cpp_python-{LCP_VERSION}.tar.gz"
LCP_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
VENDOR_PREFIX = f"llama_cpp_python-{LCP_VERSION}/vendor/llama.cpp/"

CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",  # the server lives under tools/; only its target is built
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_OPENSSL=OFF",  # no HTTPS (and this version has no curl at all)
    "-DLLAMA_BUILD_UI=OFF",  # no npm
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # no download of the web UI at build time
    "-DGGML_NATIVE=ON",  # the cache is per machine; a binary that no longer runs is rebuilt
]
TARGET = "llama-server"


class BuildError(RuntimeError):
    """The binary cannot be built here (missing tool, download or compile failure)."""


def cache_root() -> Path:
    if os.environ.get("SPECLOAD_CACHE"):
        return Path(os.environ["SPECLOAD_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "specload"


def install_dir() -> Path:
    return cache_root() / f"llama-server-{LCP_VERSION}"


def binary_path() -> Path:
    return install_dir() / "bin" / TARGET


def _log(msg: str) -> None:
    print(f"[llamacpp] {msg}", file=sys.stderr, flush=True)


def _runs(binary: Path) -> bool:
    """True when the cached binary starts on this machine (``--version`` exits 0)."""
    try:
        r = subprocess.run([str(binary), "--version"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def cpu_signature() -> str:
    """What a -march=native binary depends on: the machine and the CPU's feature flags."""
    flags = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = " ".join(sorted(line.split(":", 1)[1].split()))
                break
    return hashlib.sha256(f"{platform.machine()}|{flags}".encode()).hexdigest()[:16]


def cached_binary() -> Path | None:
    """The cached binary if it exists, was built for this CPU and runs, else None (never builds)."""
    b = binary_path()
    if not (b.is_file() and os.access(b, os.X_OK)):
        return None
    with contextlib.suppress(OSError, ValueError):
        info = json.loads((install_dir() / "build.json").read_text())
        if info.get("cpu_signature") not in (None, cpu_signature()):
            return None  # GGML_NATIVE: built on another CPU (a copied cache); rebuild here
    return b if _runs(b) else None


def _remove_stale(root: Path, prefix: str) -> None:
    """Remove leftovers of builds that were killed (only call with the build lock held)."""
    for p in root.glob(prefix + "*"):
        _log(f"removing the leftovers of an interrupted build: {p}")
        shutil.rmtree(p, ignore_errors=True)


@contextlib.contextmanager
def cache_lock(root: Path, name: str, what: str) -> Iterator[None]:
    """The cache's lock ``name``: one process builds ``what`` while the others wait for it."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log(f"another process is building {what}; waiting for it")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def staged(root: Path, prefix: str, final: Path) -> Iterator[Path]:
    """A fresh folder to build ``final`` in (with the lock held): the leftovers of killed builds are
    removed first; once the block ends it replaces ``final`` (atomic: the same file system), and
    on any failure it is removed."""
    _remove_stale(root, prefix)
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    os.chmod(work, 0o755)
    try:
        yield work
        if final.exists():
            shutil.rmtree(final)
        os.replace(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _run(cmd: list[str], log: Path, cwd: Path | None = None) -> None:
    _log("$ " + " ".join(cmd))
    with open(log, "ab") as out:
        out.write(("\n$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        r = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-40:]
        raise BuildError(f"command failed ({r.returncode}): {' '.join(cmd)}\n" + "\n".join(tail))


def obtain_sdist(work: Path, log: Path) -> Path:
    """The pinned sdist, from the cache or downloaded with pip (no deps, source only), sha256-checked."""
    downloads = cache_root() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    cached = downloads / LCP_SDIST
    if cached.is_file() and _sha256(cached) == LCP_SHA256:
        return cached
    dl = work / "dl"
    dl.mkdir()
    t0 = time.monotonic()
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--disable-pip-version-check",
            "-d",
            str(dl),
            f"llama-cpp-python=={LCP_VERSION}",
        ],
        log,
    )
    got = dl / LCP_SDIST
    if not got.is_file():
        raise BuildError(f"pip download did not produce {LCP_SDIST}: {sorted(p.name for p in dl.iterdir())}")
    digest = _sha256(got)
    if digest != LCP_SHA256:
        raise BuildError(f"{LCP_SDIST}: sha256 {digest}, expected {LCP_SHA256}")
    tmp = downloads / (LCP_SDIST + ".part")
    shutil.copyfile(got, tmp)
    os.replace(tmp, cached)
    _log(f"downloaded {LCP_SDIST} ({got.stat().st_size / 1e6:.0f} MB) in {time.monotonic() - t0:.0f} s")
    return cached


def extract_llama_cpp(sdist: Path, dest: Path) -> Path:
    """Extract only vendor/llama.cpp from the sdist into dest; return the source root."""
    with tarfile.open(sdist, "r:gz") as tf:
        members = []
        for m in tf.getmembers():
            if not m.name.startswith(VENDOR_PREFIX):
                continue
            m.name = m.name[len(VENDOR_PREFIX) :]
            if not m.name:
                continue
            members.append(m)
        if not members:
            raise BuildError(f"{sdist.name} has no {VENDOR_PREFIX}")
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tf.extractall(dest, members=members, **kwargs)
    return dest


def _check_tools() -> None:
    missing = [t for t in ("cmake", "c++", "cc") if shutil.which(t) is None]
    if missing:
        raise BuildError(f"missing build tools: {', '.join(missing)} (need cmake and a C/C++ compiler)")


def build(jobs: int | None = None, force: bool = False) -> Path:
    """Return the path of a working llama-server, building it first if the cache has none."""
    if not force:
        b = cached_binary()
        if b is not None:
            return b
    _check_tools()
    root = cache_root()
    with cache_lock(root, "llama-server", "llama-server"):
        if not force:  # another process may have built it while we waited for the lock
            b = cached_binary()
            if b is not None:
                return b
        _remove_stale(root, ".build-llama-server-")
        _remove_stale(root, ".old-llama-server-")
        jobs = jobs or int(os.environ.get("SPECLOAD_BUILD_JOBS", "0")) or (os.cpu_count() or 2)
        t_start = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=".build-llama-server-", dir=root))
        log = work / "build.log"
        try:
            sdist = obtain_sdist(work, log)
            t_dl = time.monotonic()
            src = extract_llama_cpp(sdist, work / "src")
            bdir = work / "build"
            _run(["cmake", "-S", str(src), "-B", str(bdir), *CMAKE_FLAGS], log)
            t_cfg = time.monotonic()
            _log(f"compiling {TARGET} with {jobs} jobs (about 10-20 minutes on 2 cores); log: {log}")
            _run(["cmake", "--build", str(bdir), "--target", TARGET, "-j", str(jobs)], log)
            t_built = time.monotonic()
            built = bdir / "bin" / TARGET
            if not built.is_file() or not _runs(built):
                raise BuildError(f"{built} missing or does not run")
            version = subprocess.run([str(built), "--version"], capture_output=True, text=True).stderr.strip()
            stage = work / "out"
            (stage / "bin").mkdir(parents=True)
            shutil.copy2(built, stage / "bin" / TARGET)
            shutil.copy2(log, stage / "build.log")
            info = {
                "llama_cpp_python": LCP_VERSION,
                "sdist_sha256": LCP_SHA256,
                "llama_server_version": version,
                "cmake_flags": CMAKE_FLAGS,
                "jobs": jobs,
                "machine": platform.machine(),
                "cpu_signature": cpu_signature(),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "seconds": {
                    "download": round(t_dl - t_start, 1),
                    "configure": round(t_cfg - t_dl, 1),
                    "compile": round(t_built - t_cfg, 1),
                    "total": round(t_built - t_start, 1),
                },
            }
            (stage / "build.json").write_text(json.dumps(info, indent=2) + "\n")
            final = install_dir()
            if final.exists():  # a stale entry (forced rebuild, or a binary that no longer runs)
                old = root / f".old-{final.name}-{os.getpid()}"  # matches ".old-llama-server-"
                os.replace(final, old)
                shutil.rmtree(old, ignore_errors=True)
            os.replace(stage, final)  # atomic: same filesystem
            _log(
                f"built {final / 'bin' / TARGET} in {info['seconds']['total']:.0f} s "
                f"(download {info['seconds']['download']:.0f} s, configure {info['seconds']['configure']:.0f} s, "
                f"compile {info['seconds']['compile']:.0f} s)"
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return binary_path()


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m tests.real.llamacpp", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build llama-server unless cached; print its path")
    b.add_argument("-j", "--jobs", type=int, default=None)
    b.add_argument("--force", action="store_true", help="rebuild even if cached")
    sub.add_parser("path", help="print the cached binary's path (exit 1 if there is none)")
    args = p.parse_args(argv)
    if args.cmd == "path":
        b = cached_binary()
        if b is None:
            print(f"not built: {binary_path()}", file=sys.stderr)
            return 1
        print(b)
        return 0
    t0 = time.monotonic()
    try:
        path = build(jobs=args.jobs, force=args.force)
    except BuildError as e:
        print(f"llama-server build failed: {e}", file=sys.stderr)
        return 1
    print(path)
    _log(f"ready in {time.monotonic() - t0:.1f} s (cache: {install_dir()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
