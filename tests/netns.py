"""Separate hosts on one machine: Linux network namespaces joined by veth links to a bridge.

Each host has its own network stack and address, so a master, its workers and a server talk over
real (virtual) links exactly as separate machines would, with nothing on 127.0.0.1 to fall back to.
The bridge lives in a namespace of its own: the machine's own network is never touched. Needs root
(CAP_NET_ADMIN); ``unavailable()`` says why not otherwise.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field

SUBNET = "10.200.0"


def _ip(*args: str) -> str:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def unavailable() -> str | None:
    """Why network namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and veth links need CAP_NET_ADMIN)"
    probe = f"slprobe{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", probe)
        _ip("netns", "del", probe)
    except (RuntimeError, FileNotFoundError) as e:
        return f"cannot create a network namespace: {e}"
    return None


@dataclass
class Network:
    """Hosts on one /24; ``host(name)`` gives each the next address."""

    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    hosts: dict[str, str] = field(default_factory=dict)  # name -> address
    _made: list[str] = field(default_factory=list)  # namespaces, to delete

    def __post_init__(self) -> None:
        self.hub = self._ns("hub")
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")

    def _ns(self, name: str) -> str:
        ns = f"sl{self.tag}-{name}"
        _ip("netns", "add", ns)
        self._made.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        return ns

    def host(self, name: str) -> str:
        """A new host joined to the bridge; returns its address."""
        ns = self._ns(name)
        n = len(self.hosts) + 1
        addr = f"{SUBNET}.{n}"
        here, there = f"sl{self.tag}h{n}", f"sl{self.tag}b{n}"  # interface names: 15 bytes at most
        _ip("link", "add", here, "netns", ns, "type", "veth", "peer", "name", there, "netns", self.hub)
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", here)
        _ip("-n", ns, "link", "set", here, "up")
        _ip("-n", self.hub, "link", "set", there, "master", "br0")
        _ip("-n", self.hub, "link", "set", there, "up")
        self.hosts[name] = addr
        return addr

    def ns(self, name: str) -> str:
        return f"sl{self.tag}-{name}"

    def run_in(self, name: str, cmd: list[str]) -> list[str]:
        """``cmd`` as run on host ``name``, with ``name`` as its host name (Locust names workers
        after it). Each step execs the next, so the PID is the command's own."""
        return [
            "ip",
            "netns",
            "exec",
            self.ns(name),
            "unshare",
            "--uts",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            name,
            *cmd,
        ]

    def pids(self, name: str) -> list[int]:
        return [int(p) for p in _ip("netns", "pids", self.ns(name)).split()]

    def kill_host(self, name: str) -> list[int]:
        """Every process of the host killed at once (SIGKILL): the machine died."""
        pids = self.pids(name)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def close(self) -> None:
        """Stop whatever still runs in the hosts, then delete every namespace (links go with them)."""
        for ns in self._made:
            try:
                pids = [int(p) for p in _ip("netns", "pids", ns).split()]
            except RuntimeError:
                continue
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
        for ns in reversed(self._made):
            with contextlib.suppress(RuntimeError):
                _ip("netns", "del", ns)
        self._made.clear()
