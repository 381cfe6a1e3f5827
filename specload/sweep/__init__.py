"""Run control, as pure state machines the sweep's owner drives: the levels and their budgets
(``levels``) and the capacity search that picks each next level (``capacity``).

Layer 4: imports ``specload.core``, ``specload.client``, ``specload.workload`` and ``specload.analysis``.
"""
