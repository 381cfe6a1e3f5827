"""Acceptance by prompt kind: the simulator tells a category's prompt by its opening sentence, token
ids by the prompt's shape, and gives each the acceptance its preset holds (docs/simulator.md,
"Acceptance by prompt"). The counts the server reports are checked against the preset's p within
sampling tolerance, computed from the distribution the model draws from."""

from __future__ import annotations

import json
import math
import random
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from specload.sim.batch import BatchRequest, BatchScheduler, accept_length, load_preset
from specload.sim.process import SimProcess
from specload.sim.promptkind import TOKEN_IDS, prompt_kind, reads_as_decoded_ids
from specload.workload.prompts import prompt_text

NGRAM = load_preset("ngram")
OPENINGS, MULTI = NGRAM.openings, NGRAM.multi_turn
PROSE = (
    "The river ran past the mill and under the old bridge, and the children who lived in the village "
    "would sit on its stones in the evening to watch the boats come in from the sea. It was a quiet "
    "place, and most of them never thought of leaving it."
)


def _gibberish(n: int, seed: int = 0) -> str:
    """What random ids decoded to text look like: sub-word pieces, glued, and no function words."""
    rng = random.Random(seed)
    pieces = [
        "ometric",
        "Dol",
        "inger",
        "capac",
        "Lab",
        "ormod",
        "pist",
        "onset",
        "tomat",
        "ramework",
        "ghan",
        "VR",
    ]
    return " ".join("".join(rng.choice(pieces) for _ in range(rng.randint(1, 2))) for _ in range(n))


# -- what kind a prompt is ----------------------------------------------------------------------------


@pytest.mark.parametrize("category", sorted(OPENINGS))
def test_a_categorys_opening_names_it_in_every_api(category: str) -> None:
    text = f"{OPENINGS[category]}\n\n{PROSE}"
    assert prompt_kind(None, [{"role": "user", "content": text}], OPENINGS, MULTI) == category
    parts = [{"type": "text", "text": text}]
    assert (
        prompt_kind(
            None,
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": parts}],
            OPENINGS,
            MULTI,
        )
        == category
    )
    assert prompt_kind(text, None, OPENINGS, MULTI) == category  # /v1/completions or /generate text
    assert prompt_kind([text], None, OPENINGS, MULTI) == category
    assert prompt_kind(PROSE + " " + OPENINGS[category], None, OPENINGS, MULTI) is None  # an opening opens


def test_token_ids_by_shape_and_plain_text_by_default() -> None:
    assert prompt_kind([5, 17, 900], None, OPENINGS, MULTI) == TOKEN_IDS
    assert prompt_kind([[5, 17], [3]], None, OPENINGS, MULTI) == TOKEN_IDS  # a batch of id prompts
    gib = _gibberish(64)
    assert reads_as_decoded_ids(gib) and not reads_as_decoded_ids(_gibberish(16))  # too short to tell
    assert prompt_kind(gib, None, OPENINGS, MULTI) == TOKEN_IDS
    assert prompt_kind(None, [{"role": "user", "content": gib}], OPENINGS, MULTI) == TOKEN_IDS
    # Real prose, and specload's random one-token words (a real model accepts them as it does real text)
    assert prompt_kind(PROSE * 3, None, OPENINGS, MULTI) is None
    words = prompt_text(1, 0, 200)
    assert (
        not reads_as_decoded_ids(words)
        and prompt_kind(None, [{"role": "user", "content": words}], OPENINGS, MULTI) is None
    )
    assert prompt_kind(None, None, OPENINGS, MULTI) is None and prompt_kind(7, None, OPENINGS, MULTI) is None


def test_a_conversation_without_an_opening_is_the_multi_turn_category() -> None:
    turns = [{"role": "user", "content": "Hello there."}, {"role": "assistant", "content": "Hi."}]
    turns += [{"role": "user", "content": "And then?"}]
    assert MULTI == "writing" and prompt_kind(None, turns, OPENINGS, MULTI) == "writing"
    assert prompt_kind(None, turns, OPENINGS, None) is None  # a preset without one: plain text
    coded = [{"role": "user", "content": OPENINGS["code"] + " def f():"}, *turns[1:]]
    assert prompt_kind(None, coded, OPENINGS, MULTI) == "code"  # an opening still wins


# -- the preset holds what was measured ----------------------------------------------------------------

# The real model's acceptance length (1 + accepted / drafting steps) per kind, k = 3
# (shared research: SmolLM2-135M-Instruct, vLLM ngram): what the ngram preset's p must give.
MEASURED = {"code": 2.57, "summarize": 1.90, "qa": 1.49, "writing": 1.61, TOKEN_IDS: 3.68, None: 1.88}


@pytest.mark.parametrize("kind", list(MEASURED), ids=str)
def test_the_ngram_preset_gives_each_kind_its_measured_accept_length(kind: str | None) -> None:
    p, decay = NGRAM.acceptance(kind)
    assert decay == 0.0 and accept_length(p, NGRAM.spec_num_steps) == pytest.approx(MEASURED[kind], abs=0.005)


def test_the_mtp_preset_keeps_the_reference_acceptance_for_every_kind() -> None:
    mtp = load_preset("mtp")
    assert mtp.openings == {} and mtp.multi_turn is None and mtp.prompt_categories == ()
    assert mtp.acceptance(None) == mtp.acceptance(TOKEN_IDS) == (1.0, 0.0)
    # so a what-if on the acceptance moves the token-id prompts of the demo and the experiments too
    assert load_preset("mtp", ["spec_accept_prob=0.0"]).acceptance(TOKEN_IDS) == (0.0, 0.0)
    assert accept_length(1.0, mtp.spec_num_steps) == 2.0


def test_categories_are_checked_and_overridable() -> None:
    with pytest.raises(ValueError, match="unknown key"):
        load_preset("ngram", ["prompt_categories={x={opening='A.', p=0.2}}"])
    with pytest.raises(ValueError, match=r"spec_accept_prob must be in \[0, 1\]"):
        load_preset("ngram", ["prompt_categories={x={spec_accept_prob=2.0}}"])
    with pytest.raises(ValueError, match="at most one"):
        load_preset("ngram", ["prompt_categories={a={multi_turn=true}, b={multi_turn=true}}"])
    one = load_preset("ngram", ["prompt_categories={x={opening='A.', spec_accept_decay=100.0}}"])
    assert one.openings == {"x": "A."} and one.acceptance("x") == (0.502, 100.0)  # p: the preset's
    assert one.acceptance("code") == (0.502, 0.0)  # the table was replaced whole


# -- the counts the engine produces --------------------------------------------------------------------


def _per_step(p: float, k: int) -> tuple[float, float]:
    """Mean and variance of the draft tokens one verify step accepts (in sequence, p each, up to k)."""
    probs = [p**j * (1 - p) for j in range(k)] + [p**k]
    mean = sum(j * q for j, q in enumerate(probs))
    return mean, sum((j - mean) ** 2 * q for j, q in enumerate(probs))


def _within(accepted: int, steps: int, p: float, k: int) -> tuple[bool, str]:
    """``accepted`` over ``steps`` verify steps against p, within 4.5 standard errors, plus k for
    a last step cut to the tokens the request still needed."""
    mean, var = _per_step(p, k)
    slack = 4.5 * math.sqrt(var * steps) + k
    return abs(accepted - mean * steps) <= slack, f"{accepted} vs {mean * steps:.1f} +- {slack:.1f}"


@pytest.mark.parametrize("kind", list(MEASURED), ids=str)
def test_the_scheduler_accepts_what_the_kind_gives(kind: str | None) -> None:
    sched = BatchScheduler(NGRAM)
    accept = NGRAM.acceptance(kind)
    reqs = [BatchRequest(16, 400, 0.0, accept=accept) for _ in range(8)]
    for r in reqs:
        sched.submit(r)
    t = 0.0
    while (step := sched.begin_step(t)) is not None:
        sched.end_step()
        t = step.end
    assert all(r.generated == 400 for r in reqs)
    ok, why = _within(sched.num_accepted_tokens, sched.num_drafts, accept[0], 3)
    assert ok, why


def _post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        out: dict[str, Any] = json.loads(r.read())
    return out


def test_each_kinds_prompt_gets_its_acceptance_from_the_server(sim: Callable[..., SimProcess]) -> None:
    s = sim(
        "--engine",
        "batch",
        "--preset",
        "ngram",
        "--time-scale",
        "0.02",
        "--model",
        "m",
        "--metrics-style",
        "vllm",
        "--per-request-spec-decode-metrics",
        "summary",
    )
    n = 600
    cases: list[tuple[str | None, str, dict[str, Any]]] = [
        (c, "/v1/chat/completions", {"messages": [{"role": "user", "content": f"{o} {PROSE}"}]})
        for c, o in OPENINGS.items()
    ]
    cases += [
        (None, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROSE}]}),
        (TOKEN_IDS, "/v1/completions", {"prompt": list(range(100, 164))}),
        (TOKEN_IDS, "/v1/chat/completions", {"messages": [{"role": "user", "content": _gibberish(64)}]}),
        ("code", "/v1/completions", {"prompt": OPENINGS["code"] + "\ndef add(a, b):"}),
    ]
    for kind, path, body in cases:
        out = _post(s.url, path, {"model": "m", "max_tokens": n, **body})
        spec = out["metrics"]["speculative_decoding"]
        assert out["usage"]["completion_tokens"] == n
        ok, why = _within(
            spec["num_accepted_draft_tokens"], spec["num_spec_steps"], NGRAM.acceptance(kind)[0], 3
        )
        assert ok, (kind, path, why)
    # /generate: token ids and text, and SGLang's own counts of the same
    meta = _post(
        s.url, "/generate", {"input_ids": list(range(5, 69)), "sampling_params": {"max_new_tokens": n}}
    )
    info = meta["meta_info"]
    steps = info["spec_verify_ct"] - 1  # (the prefill's pass drafts nothing)
    ok, why = _within(info["spec_num_correct_drafts"], steps, NGRAM.acceptance(TOKEN_IDS)[0], 3)
    assert ok, why
