"""Server APIs specload can load: one small module each, its Backend class marked ``@register``.

Adding one (CONTRIBUTING.md, "Add a backend"): a module here, its name in ``MODULES`` below, a
test. The ``--backend`` choices and help, and whether a run needs a model name, come from the
registered classes' attributes (``Backend``).
"""

from __future__ import annotations

import importlib

from specload.client.backends.base import (
    Backend,
    MalformedEvent,
    StreamParser,
    backend_classes,
    get_backend,
    register,
)

# One entry per backend module, each imported for its @register: this order is the --backend list's.
MODULES = ("openai", "sglang", "chat")
for _module in MODULES:
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["Backend", "MalformedEvent", "StreamParser", "backend_classes", "get_backend", "register"]
