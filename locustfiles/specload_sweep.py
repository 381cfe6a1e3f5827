"""specload's locustfile: the stepped concurrency sweep against one LLM server.

    locust -f locustfiles/specload_sweep.py --host http://127.0.0.1:30000 --headless \
        --scenario scenarios/smoke.toml --csv results/x/locust

Everything lives in the ``specload`` package; this file only wires it into Locust.
"""

from specload import plugin
from specload.shape import SteppedConcurrencyShape
from specload.user import SpecloadUser

plugin.install()

__all__ = ["SpecloadUser", "SteppedConcurrencyShape"]
