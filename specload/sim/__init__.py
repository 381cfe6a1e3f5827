"""The built-in simulated LLM server (``specload sim``).

A separate process with exactly known timing, so integration tests and the demo can check measured
figures against configured ones. ``timing`` and ``batch`` hold the replaceable timing models,
``faults`` the fault switches, ``httpd`` the HTTP/1.1 server, ``protocol`` / ``render`` / ``info`` /
``app`` the application on it, ``sendall`` its one-syscall writes, ``cli`` the command line and
``process`` the simulator as a child process (docs/simulator.md, "Module layout"). Self-contained:
it imports nothing else of specload, so it measures the client without sharing its code.
"""

from specload.sim.faults import FaultInjector, Faults, RequestFaults
from specload.sim.timing import ADMITTED, Chunk, Engine, FifoSlots, FixedEngine

__all__ = [
    "ADMITTED",
    "Chunk",
    "Engine",
    "FaultInjector",
    "Faults",
    "FifoSlots",
    "FixedEngine",
    "RequestFaults",
]
