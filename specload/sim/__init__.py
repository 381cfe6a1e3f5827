"""The built-in simulated LLM server (``specload sim``).

A separate process with exactly known timing, so integration tests and the demo can check measured
figures against configured ones. ``timing`` holds the replaceable timing model, ``faults`` the fault
switches and ``server`` the HTTP layer and CLI.
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
