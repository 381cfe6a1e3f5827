"""The experiment's smoke check: one acceptance definition with the report, any registered backend,
and a speculative server whose drafter found nothing to propose warned about rather than refused."""

from __future__ import annotations

from typing import Any

import pytest

from specload.analysis.acceptance import acceptance
from specload.analysis.columns import LevelColumns
from specload.client.backends import base, get_backend, register
from specload.core.records import OK, PHASE_MEASURE, SRC_USAGE, RequestRecord, make_record
from specload.experiment import smoke
from specload.experiment.smoke import (
    SmokeResult,
    configured_by,
    smoke_check,
    speculation_problem,
    speculation_warning,
)
from specload.workload.config import Scenario
from tests.test_backend_recipe import TinyGenerate

NOWHERE = "http://127.0.0.1:9"  # nothing listens: no /metrics, so only the response counts


def _record(backend: str, **kw: Any) -> RequestRecord:
    fields: dict[str, Any] = dict(
        t_send=0.0, t_first=0.1, t_last=0.5, t_end=0.5, output_tokens=32, level=-1, concurrency=0,
        phase="smoke", seq=0, backend=backend, status=OK, reason=None, http_status=200,
        output_tokens_source=SRC_USAGE, prompt_tokens=10, requested_output_tokens=32,
        requested_prompt_tokens=10, chunks=32, itl_max_s=None, spec_verify_ct=None, worker="w", repeat=0,
    )  # fmt: skip
    fields.update(kw)
    return make_record(**fields)


def _answering(monkeypatch: pytest.MonkeyPatch, **kw: Any) -> None:
    def fake(
        client: Any, path: str, body: Any, headers: Any, backend: Any, *a: Any, **k: Any
    ) -> RequestRecord:
        return _record(backend.name, **kw)

    monkeypatch.setattr(smoke, "stream_request", fake)


def test_a_backend_added_by_the_recipe_is_smoke_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review snippet 1: the label came from a table keyed by backend name (KeyError for a new one)."""
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))  # registered for this test only
    register(TinyGenerate)
    _answering(monkeypatch)
    r = smoke_check(NOWHERE, Scenario(backend="tiny", model="m", connect_timeout_s=0.2))
    assert r.ok and r.accept_length is None and r.backend == "tiny"
    assert get_backend("tiny").spec_fields is None
    assert "cannot be seen on this endpoint" in (speculation_problem("x", r) or "")


def test_the_smoke_check_and_the_report_give_one_acceptance_length(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review snippet 2: a vLLM record of 32 tokens, 10 drafting steps, 21 accepted drafts: 1 + 21/10
    = 3.1 in the report; the smoke check said 32/10 = 3.2."""
    kw = dict(spec_verify_ct=10, spec_accepted=21, spec_drafted=30, spec_source="vllm_metrics")
    _answering(monkeypatch, **kw)
    r = smoke_check(NOWHERE, Scenario(backend="openai", model="m", connect_timeout_s=0.2))
    level = acceptance(LevelColumns.of([_record("openai", phase=PHASE_MEASURE, **kw)]), (), 0.0, 0.0)
    assert level is not None and level.length == pytest.approx(3.1)
    assert r.accept_length == pytest.approx(3.1) and r.source == "metrics.speculative_decoding"
    assert r.tokens_per_pass == pytest.approx(32 / 11) and r.active


def test_llamacpp_timings_alone_show_speculation_by_its_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without /metrics a llama.cpp response says how many drafts it accepted, not over how many steps."""
    _answering(monkeypatch, spec_accepted=12, spec_drafted=16, spec_source="timings")
    r = smoke_check(NOWHERE, Scenario(backend="chat", model="m", connect_timeout_s=0.2))
    assert r.accept_length is None and r.accept_rate == pytest.approx(0.75) and r.active
    assert speculation_problem("ngram", r) is None and r.seen() == "accept rate 75% from llama.cpp timings"


@pytest.mark.parametrize(
    ("argv", "page", "why"),
    [
        (
            ["llama-server", "--spec-type", "ngram-simple"],
            None,
            "--spec-type ngram-simple on its command line",
        ),
        (["llama-server", "--spec-type=ngram-mod"], None, "--spec-type ngram-mod on its command line"),
        (["llama-server", "--spec-type", "none"], None, None),
        (["llama-server", "-md", "d.gguf"], None, None),  # a draft model alone: --spec-type none
        (["llama-server", "--spec-default"], None, "--spec-default on its command line"),
        (
            ["python", "-m", "vllm", "--speculative-config", "{}"],
            None,
            "--speculative-config on its command line",
        ),
        ([], "vllm:spec_decode_num_drafts_total 0\n", "vLLM's spec_decode counters"),
        ([], "llamacpp:spec_decode_num_drafts_total 0\n", None),  # llama.cpp exports them always
        ([], None, None),
    ],
)
def test_what_says_a_server_speculates(argv: list[str], page: str | None, why: str | None) -> None:
    assert configured_by(argv, page) == why


def _no_draft(configured: str | None) -> SmokeResult:
    return SmokeResult(True, None, 64, 1.0, smoke.FROM_COUNTERS, "m", "chat", False, configured)


def test_an_ngram_server_that_drafted_nothing_is_warned_about_not_refused() -> None:
    r = _no_draft("--spec-type ngram-simple on its command line")
    assert speculation_problem("ngram", r) is None
    assert "proposed no draft token for the smoke request" in (speculation_warning("ngram", r) or "")
    # Nothing says it speculates: a baseline under a speculative label, refused as before.
    plain = _no_draft(None)
    assert "no draft token proposed" in (speculation_problem("ngram", plain) or "")
    assert speculation_warning("ngram", plain) is None


def test_the_smoke_prompt_repeats_itself_for_an_ngram_drafter() -> None:
    """Prompt lookup drafts only from n-grams seen before, and llama.cpp's ngram-simple (n = 12 by
    default) only when the repeat is longer than 2n tokens: the passage repeats, 30+ words long."""
    words = smoke.SMOKE_PROMPT.split()
    grams = [tuple(words[i : i + 8]) for i in range(len(words) - 8)]
    assert len(set(grams)) < len(grams) / 2 and smoke.SMOKE_OUTPUT_TOKENS >= 64
    assert len(smoke.SMOKE_PASSAGE.split()) >= 30 and smoke.SMOKE_PROMPT.count(smoke.SMOKE_PASSAGE) >= 3
