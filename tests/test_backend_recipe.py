"""CONTRIBUTING.md's "Add a backend", followed with a test-only API: a Backend class and its parser,
registered, then taken by the scenario config (``--backend NAME``), listed in the help, and used
for one streamed request against the script server of tests/test_stream.py.

The "tiny" API: POST /tiny/generate {"prompt", "max_tokens", "stream": true}; one event per token,
``{"token": "..."}``, then ``{"usage": {...}}`` and ``[DONE]``. A real backend lives in
specload/client/backends/ and is listed in ``MODULES`` there; here the test registers it itself.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from specload.client.backends import Backend, StreamParser, backend_classes, base, get_backend, register
from specload.client.backends.base import Prompt, as_text
from specload.core.records import OK, SRC_USAGE
from tests import test_stream
from tests.test_stream import DONE, END, HEAD_SSE, chunk, run, sse

REPO = Path(__file__).resolve().parent.parent
serve = test_stream.serve  # fixtures: the raw-socket script server, the clients a test made
clients = test_stream.clients


# the recipe's step 1: the module (here, inside the test) ----------------------------------------


class TinyParser(StreamParser):
    __slots__ = ()

    def read(self, ev: dict[str, Any]) -> int:
        if "usage" in ev:
            self.take_usage(ev["usage"])
            return 0
        token = ev["token"]
        if not isinstance(token, str):
            raise TypeError(f"token is {token!r}, not text")
        if self.text is not None:
            self.text.append(token)
        return 1


class TinyGenerate(Backend):
    name = "tiny"
    path = "/tiny/generate"
    token_source = SRC_USAGE  # usage.completion_tokens, as OpenAI's
    takes_token_ids = False
    needs_model = False

    def body(
        self, prompt: Prompt, max_tokens: int, model: str | None, temperature: float, extra: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "prompt": as_text(prompt),
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": True,
            **extra,
        }

    def parser(self) -> StreamParser:
        return TinyParser()


# step 2: its registration; step 3: the tests ------------------------------------------------------


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Backend]]:
    """TinyGenerate registered for one test (the registry is restored afterwards)."""
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    yield register(TinyGenerate)


def test_a_registered_backend_streams_one_request(
    serve: Any, clients: list[Any], tiny: type[Backend]
) -> None:
    assert tiny in backend_classes() and isinstance(get_backend("tiny"), TinyGenerate)
    events = (
        sse({"token": "a"})
        + sse({"token": "b"})
        + sse({"usage": {"prompt_tokens": 4, "completion_tokens": 2}})
    )
    srv = serve([HEAD_SSE, chunk(events + DONE) + END])
    rec = run(srv, clients, "tiny", requested=2)
    assert rec.status == OK, rec.reason
    assert (rec.backend, rec.output_tokens, rec.output_tokens_source, rec.prompt_tokens) == (
        "tiny",
        2,
        SRC_USAGE,
        4,
    )
    assert rec.chunks == 2 and rec.itl_unit == "event"
    head, body = srv.requests[0]
    assert head.startswith(b"POST /tiny/generate HTTP/1.1\r\n")
    prompt = [1001, 1002, 1003, 1004]  # test_stream.run's
    assert orjson.loads(body) == {"prompt": prompt, "max_tokens": 2, "temperature": 0.0, "stream": True}


def test_a_malformed_event_of_the_new_api_is_named(
    serve: Any, clients: list[Any], tiny: type[Backend]
) -> None:
    srv = serve([HEAD_SSE, chunk(sse({"token": "a"}) + sse({"token": 3}) + DONE) + END])
    rec = run(srv, clients, "tiny", requested=2)
    assert rec.status == "failed" and rec.reason is not None
    assert rec.reason.startswith("malformed event after 1 tokens: TypeError: token is 3, not text")


# The field table (choices, help) is made when specload.workload.config is imported, from the backends
# registered then: a fresh interpreter registers TinyGenerate first, as specload.client.backends'
# MODULES does for a real one, then asks the config, the command line and Locust's options.
CONFIG_CHECK = """
import contextlib, io, sys
assert "specload.workload.config" not in sys.modules, "imported before the registration"
from specload.client.backends import register
from tests.test_backend_recipe import TinyGenerate
register(TinyGenerate)

from specload.cli import build_parser, settings
from specload.workload.config import FIELDS, Scenario, ScenarioError, apply_overrides, scenario_from_dict

spec = FIELDS["backend"]
assert spec.choices == ("openai", "sglang", "chat", "tiny"), spec.choices
assert spec.help.endswith(", tiny (/tiny/generate)"), spec.help
assert scenario_from_dict({"backend": "tiny"}).backend == "tiny"
args = build_parser().parse_args(["sweep", "--host", "http://127.0.0.1:9", "--backend", "tiny"])
assert apply_overrides(Scenario(), settings(args).overrides).backend == "tiny"
try:
    scenario_from_dict({"backend": "tinny"}, source="here")
except ScenarioError as e:
    assert str(e) == "here: field 'backend': expected one of openai, sglang, chat, tiny, got 'tinny'", e
else:
    raise AssertionError("an unknown backend was accepted")
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
    build_parser().parse_args(["sweep", "--help"])
assert "tiny (/tiny/generate)" in " ".join(out.getvalue().split()), out.getvalue()

from tests.test_locust_options import resolve
assert resolve(["--backend", "tiny"]).backend == "tiny"
print("accepted")
"""


def test_the_scenario_config_and_the_help_take_a_registered_backend() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CONFIG_CHECK], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "accepted", done.stderr[-3000:]


def test_register_refuses_a_backend_that_could_not_serve(tiny: type[Backend]) -> None:
    class NoPath(TinyGenerate):
        name = "nopath"
        path = "tiny"

    class Taken(TinyGenerate):
        pass

    class Abstract(Backend):
        name = "abstract"
        path = "/x"
        token_source = SRC_USAGE

    with pytest.raises(TypeError, match=r"NoPath.path must be the request's path"):
        register(NoPath)
    with pytest.raises(
        ValueError, match=r"backend name 'tiny' is taken by tests.test_backend_recipe.TinyGenerate"
    ):
        register(Taken)
    with pytest.raises(TypeError, match=r"Abstract leaves body, parser abstract"):
        register(Abstract)
    assert register(TinyGenerate) is TinyGenerate  # the same class again: no change


def test_the_model_requirement_is_the_backends() -> None:
    """Whether a run without --model may start when /v1/models lists none (specload.locust.owner)."""
    assert {b.name: b.needs_model for b in backend_classes()} == {
        "openai": True,
        "sglang": False,
        "chat": True,
    }
    assert TinyGenerate.needs_model is False
