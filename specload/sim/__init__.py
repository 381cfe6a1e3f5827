"""The built-in simulated LLM server (``specload sim``).

A separate process with exactly known timing, so integration tests and the demo can check measured
figures against configured ones. ``timing`` and ``batch`` hold the replaceable timing models,
``faults`` the fault switches, ``httpd`` the HTTP/1.1 server, ``protocol`` / ``render`` / ``info`` /
``app`` the application on it, and ``cli`` the command line (docs/simulator.md, "Module layout").
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
