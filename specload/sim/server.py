"""Former home of the simulator's request parsing, renderers, app and CLI; now only re-exports.

``specload.cli`` runs ``specload sim`` through ``from specload.sim.server import main``, and older
code may import the other names from here. New code imports from where each one lives:

- ``specload.sim.protocol``: ``GenRequest``, ``parse_*``, ``HTTPError``, ``error_body``
- ``specload.sim.render``: the renderers and the event constants
- ``specload.sim.info``: ``/get_server_info`` and ``/metrics`` (``METRICS_STYLES``)
- ``specload.sim.app``: ``SimApp``, ``require_api_key``, ``DIE_EXIT_CODE``
- ``specload.sim.cli``: ``main``, ``build_parser``, ``build_engine``, ``build_faults``, ``make_server``
"""

from specload.sim.app import DIE_EXIT_CODE, SimApp, require_api_key
from specload.sim.cli import build_engine, build_faults, build_parser, main, make_server, tls_context
from specload.sim.info import METRICS_STYLES
from specload.sim.protocol import (
    GenRequest,
    HTTPError,
    error_body,
    parse_chat,
    parse_completion,
    parse_generate,
)
from specload.sim.render import (
    DONE_EVENT,
    MALFORMED_EVENT,
    TOKEN_TEXT,
    ChatRenderer,
    CompletionRenderer,
    GenerateRenderer,
    Renderer,
)

__all__ = [
    "DIE_EXIT_CODE",
    "DONE_EVENT",
    "MALFORMED_EVENT",
    "METRICS_STYLES",
    "TOKEN_TEXT",
    "ChatRenderer",
    "CompletionRenderer",
    "GenRequest",
    "GenerateRenderer",
    "HTTPError",
    "Renderer",
    "SimApp",
    "build_engine",
    "build_faults",
    "build_parser",
    "error_body",
    "main",
    "make_server",
    "parse_chat",
    "parse_completion",
    "parse_generate",
    "require_api_key",
    "tls_context",
]
