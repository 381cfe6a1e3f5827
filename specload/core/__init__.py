"""The vocabulary every layer shares: the request record, the run directory's schema and writer, the
SLO, the latency histogram, counters over a window, Student's t, clocks, text helpers and the files
specload ships.

Layer 0: imports nothing else of specload; of third-party packages only orjson, msgspec and numpy
(tests/test_structure.py, THIRD_PARTY).
"""
