"""specload's locustfile: the stepped concurrency sweep against one LLM server.

    locust -f locustfiles/specload_sweep.py --host http://127.0.0.1:30000 --headless \
        --scenario scenarios/smoke.toml --csv results/x/locust

Everything lives in the ``specload`` package; this file only wires it into Locust.
"""

import os
import sys

# Locust puts the current folder first on the path to import a locustfile, so a folder named
# specload there (the parent of a clone) would shadow the package (an editable install's finder comes
# after every path entry): specload is imported without it, and it is put back.
_here = os.path.realpath(os.getcwd())
_saved = list(sys.path)
sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != _here]
try:
    import specload.locust.plugin  # noqa: F401 - registers specload's Locust event listeners
    from specload.locust.shape import SteppedConcurrencyShape
    from specload.locust.user import SpecloadUser
finally:
    sys.path[:] = _saved

__all__ = ["SpecloadUser", "SteppedConcurrencyShape"]
