"""specload's locustfile: the stepped concurrency sweep against one LLM server.

    locust -f locustfiles/specload_sweep.py --host http://127.0.0.1:30000 --headless \
        --scenario scenarios/smoke.toml --csv results/x/locust

Everything lives in the ``specload`` package; this file only wires it into Locust.
"""

import specload.locust.plugin  # noqa: F401 - registers specload's Locust event listeners
from specload.locust.shape import SteppedConcurrencyShape
from specload.locust.user import SpecloadUser

__all__ = ["SpecloadUser", "SteppedConcurrencyShape"]
