"""Decide, once per run, what prompts are made of: ids or words from the model's own vocabulary.

Order of sources: ``--token-id-range`` (the user's word), ``--tokenizer`` (a local tokenizer), the
server's ``/tokenize``, and only then the reference method's fixed range, with a warning that it is
unverified. Then one probe request through the real streaming client measures the tokens the
server adds around a prompt (BOS, a chat template), so that every later prompt is sized to land
on the length asked for; a server that rejects the probe stops the run before any load.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from specload.client.backends import Backend
from specload.client.http import base_headers, endpoint, make_client, redact_host
from specload.client.probe import NoCompleteAnswer, pre_sweep_deadline, within
from specload.client.stream import RequestSpec, stream_request
from specload.core.records import FAILED
from specload.workload.config import LEGACY_RANGE_DEFAULT, REAL, Scenario
from specload.workload.prompts import IDS, TEXT, PromptSource, make_prompt, range_source
from specload.workload.vocab import (
    MIN_WORDS,
    LocalTokenizer,
    ServerTokenizer,
    Tokenizer,
    VocabError,
    id_pool_from_text,
    invalid_prompt_hint,
    single_token_words,
)

logger = logging.getLogger("specload")

PROBE_TOKENS = 64  # the probe prompt's length in units; the overhead is what the server counts beyond it


class PromptProbeFailed(RuntimeError):
    """The server rejected a prompt built this way; the message quotes it and names the fixes."""


def choose_source(
    sc: Scenario, backend: Backend, host: str, model: str | None, insecure: bool, send_key: bool = True
) -> PromptSource:
    """The prompt material, without the probe's overhead yet."""
    tok: Tokenizer | None = None
    if sc.tokenizer:
        tok = LocalTokenizer(sc.tokenizer)  # a bad --tokenizer is the user's error: VocabError ends the run
    if backend.takes_token_ids:
        if sc.token_id_range is not None:
            return range_source(*sc.token_id_range, origin="--token-id-range")
        if isinstance(tok, LocalTokenizer):
            return PromptSource(IDS, f"tokenizer {tok.name}", ids=tok.id_pool())
        try:
            pool = id_pool_from_text(ServerTokenizer(host, model, sc.connect_timeout_s, insecure, send_key))
            return PromptSource(IDS, "server /tokenize", ids=pool)
        except VocabError as e:
            logger.warning(
                "prompt token ids: the server cannot tokenize (%s); using ids %d..%d, which may be "
                "outside this model's vocabulary (pass --tokenizer or --token-id-range)",
                e,
                *LEGACY_RANGE_DEFAULT,
            )
            return range_source(*LEGACY_RANGE_DEFAULT, origin="default range (unverified)")
    try:
        tok = tok or ServerTokenizer(host, model, sc.connect_timeout_s, insecure, send_key)
        words = single_token_words(tok)
    except VocabError as e:
        logger.warning("text prompts: cannot tokenize (%s); prompt lengths are approximate", e)
        return PromptSource(TEXT, "common words (untokenized)", exact=False)
    if len(words) < MIN_WORDS:
        logger.warning(
            "text prompts: only %d one-token words in this vocabulary; lengths are approximate", len(words)
        )
        return PromptSource(TEXT, f"common words ({tok.name})", exact=False)
    origin = f"tokenizer {tok.name}" if isinstance(tok, LocalTokenizer) else "server /tokenize"
    return PromptSource(TEXT, f"one-token words ({origin})", words=tuple(words))


def measure_overhead(
    src: PromptSource,
    sc: Scenario,
    backend: Backend,
    host: str,
    model: str | None,
    insecure: bool,
    send_key: bool = True,
) -> PromptSource:
    """Send one short prompt and read the server's own prompt count; the excess is the overhead."""
    prompt = make_prompt(src, sc.seed, -1, PROBE_TOKENS)
    body = backend.body(prompt, 1, model, sc.temperature, sc.extra_body)
    spec = RequestSpec(
        level=-1,
        concurrency=0,
        phase="probe",
        seq=0,
        repeat=0,
        requested_output_tokens=1,
        requested_prompt_tokens=PROBE_TOKENS,
    )
    client = make_client(host, sc.read_timeout_s, sc.connect_timeout_s, insecure)
    deadline = pre_sweep_deadline(sc.read_timeout_s, sc.connect_timeout_s)
    try:
        rec = within(
            deadline,
            f"the probe request to {redact_host(host)}",
            lambda: stream_request(
                client,
                endpoint(host, backend.path),
                body,
                base_headers(True, send_key),
                backend,
                spec,
                "probe",
                sc.read_timeout_s,
                sc.connect_timeout_s,
            ),
        )
    except NoCompleteAnswer as e:
        raise PromptProbeFailed(f"{e} (a stream that never ends?)") from None
    finally:
        client.close()
    if rec.status == FAILED:
        hint = invalid_prompt_hint(rec.reason, src.origin)
        raise PromptProbeFailed(
            f"the server rejected a probe prompt ({src.origin}): {rec.reason}" + (f"; {hint}" if hint else "")
        )
    if rec.prompt_tokens is None:
        logger.info("prompts: the server does not count prompt tokens; no overhead correction")
        return src
    sent = len(prompt) if isinstance(prompt, list) else PROBE_TOKENS
    overhead = rec.prompt_tokens - sent
    if overhead < 0:
        logger.warning(
            "prompts: the server counted %d tokens for %d sent; lengths are approximate",
            rec.prompt_tokens,
            sent,
        )
        return replace(src, exact=False)
    return replace(src, overhead=overhead)


def discover_prompts(
    sc: Scenario, backend: Backend, host: str, model: str | None, insecure: bool, send_key: bool = True
) -> PromptSource:
    src = choose_source(sc, backend, host, model, insecure, send_key)
    src = measure_overhead(src, sc, backend, host, model, insecure, send_key)
    if sc.prompt_method == REAL:  # the real text is sized later; this source only measured the overhead
        logger.info("prompts: real text; the server adds %d token(s) to each", src.overhead)
        return src
    logger.info(
        "prompts: %s from %s%s; the server adds %d token(s) to each",
        "token ids" if src.kind == IDS else "text",
        src.origin,
        f" ({src.ids.size} distinct ids)" if src.ids is not None else "",
        src.overhead,
    )
    return src
