"""Run directory -> figures: the columns of each level, every figure's one definition (``metrics``),
the capacity answer, the comparison of runs and the client's own load verdict. Pure: reads files,
writes none.

Layer 3: imports ``specload.core``, ``specload.client`` and ``specload.workload``.
"""
