"""Sleeps that end on time: a timerfd-backed sleeper for gevent hubs.

A package of its own because two sides need it and neither may import the other: the simulator,
whose inter-token times are the reference other measurements are checked against, and the load
generator, which sends a replayed trace's or a rate level's request at its due time. It imports
nothing of specload (checked by tests/test_structure.py), only the standard library and gevent.
"""
