"""specload.client.backends: request bodies and stream parsers, fed the exact bytes vLLM/SGLang send."""

from __future__ import annotations

import pytest

from specload.client.backends import MalformedEvent, get_backend
from specload.client.backends.chat import ChatCompletions
from specload.client.backends.openai import OpenAICompletions
from specload.client.backends.sglang import SGLangGenerate
from specload.core.records import SRC_META, SRC_USAGE

# OpenAI /v1/completions, as vLLM streams it with stream_options.include_usage ----------------------

CMPL_CONTENT = (
    b'{"id":"cmpl-8f1","object":"text_completion","created":1764475200,"model":"m",'
    b'"choices":[{"index":0,"text":" the","logprobs":null,"finish_reason":null,"stop_reason":null}],'
    b'"usage":null}'
)
CMPL_EMPTY_TEXT = (
    b'{"id":"cmpl-8f1","object":"text_completion","created":1764475200,"model":"m",'
    b'"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":null,"stop_reason":null}],'
    b'"usage":null}'
)
CMPL_FINAL = (
    b'{"id":"cmpl-8f1","object":"text_completion","created":1764475200,"model":"m",'
    b'"choices":[{"index":0,"text":" end","logprobs":null,"finish_reason":"length","stop_reason":null}],'
    b'"usage":null}'
)
CMPL_CLOSE_ONLY = (
    b'{"id":"cmpl-8f1","object":"text_completion","created":1764475200,"model":"m",'
    b'"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length","stop_reason":null}]}'
)
CMPL_USAGE = (
    b'{"id":"cmpl-8f1","object":"text_completion","created":1764475200,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":1000,"total_tokens":2000,"completion_tokens":1000}}'
)
VLLM_ERROR = (
    b'{"error":{"object":"error","message":"The decoder prompt (length 9000) is longer than the '
    b'maximum model length of 8192.","type":"BadRequestError","param":null,"code":400}}'
)


def test_backend_registry() -> None:
    assert isinstance(get_backend("openai"), OpenAICompletions)
    assert isinstance(get_backend("sglang"), SGLangGenerate)
    assert isinstance(get_backend("chat"), ChatCompletions)


def test_get_backend_unknown_names_choices() -> None:
    with pytest.raises(ValueError) as ei:
        get_backend("nope")
    msg = str(ei.value)
    assert "'nope'" in msg
    for name in ("openai", "sglang", "chat"):
        assert name in msg


def test_backend_paths_and_sources() -> None:
    o, s, c = get_backend("openai"), get_backend("sglang"), get_backend("chat")
    assert (o.path, o.token_source, o.takes_token_ids) == ("/v1/completions", SRC_USAGE, True)
    assert (s.path, s.token_source, s.takes_token_ids) == ("/generate", SRC_META, True)
    assert (c.path, c.token_source, c.takes_token_ids) == ("/v1/chat/completions", SRC_USAGE, False)


def test_parsers_are_fresh_per_request() -> None:
    b = get_backend("openai")
    p1, p2 = b.parser(), b.parser()
    p1.feed(CMPL_USAGE)
    assert p1.output_tokens == 1000
    assert p2.output_tokens is None


def test_completions_content_event_counts_one() -> None:
    p = get_backend("openai").parser()
    assert p.feed(CMPL_CONTENT) == 1
    assert p.output_tokens is None and p.prompt_tokens is None
    assert p.finish_reason is None and p.error is None


def test_completions_empty_text_event_is_still_a_decode_step() -> None:
    # Half a UTF-8 character comes as an empty text: one token all the same.
    assert get_backend("openai").parser().feed(CMPL_EMPTY_TEXT) == 1


def test_completions_final_event_with_text_counts_one_and_sets_finish() -> None:
    p = get_backend("openai").parser()
    assert p.feed(CMPL_FINAL) == 1
    assert p.finish_reason == "length"


def test_completions_close_only_event_counts_zero() -> None:
    p = get_backend("openai").parser()
    assert p.feed(CMPL_CLOSE_ONLY) == 0
    assert p.finish_reason == "length"


def test_completions_usage_only_event() -> None:
    p = get_backend("openai").parser()
    assert p.feed(CMPL_CONTENT) == 1
    assert p.feed(CMPL_USAGE) == 0
    assert p.output_tokens == 1000
    assert p.prompt_tokens == 1000


def test_completions_usage_on_a_content_event() -> None:
    # continuous_usage_stats: every event carries the running usage.
    ev = b'{"choices":[{"index":0,"text":"x","finish_reason":null}],"usage":{"prompt_tokens":8,"completion_tokens":3}}'
    p = get_backend("openai").parser()
    assert p.feed(ev) == 3  # the running count says the event carried 3 tokens
    assert (p.output_tokens, p.prompt_tokens) == (3, 8) and p.counted_events is True


def test_completions_error_event() -> None:
    p = get_backend("openai").parser()
    assert p.feed(VLLM_ERROR) == 0
    assert p.error is not None
    assert "maximum model length of 8192" in p.error


def test_completions_error_as_string() -> None:
    p = get_backend("openai").parser()
    assert p.feed(b'{"error":"engine dead"}') == 0
    assert p.error == "engine dead"


@pytest.mark.parametrize("payload", [b'{"choices":[{"text":"a"', b"not json", b"", b"[1, 2]", b"42", b'"x"'])
def test_completions_malformed_raises(payload: bytes) -> None:
    with pytest.raises(MalformedEvent):
        get_backend("openai").parser().feed(payload)


def test_completions_non_object_choice_is_malformed() -> None:
    with pytest.raises(MalformedEvent):
        get_backend("openai").parser().feed(b'{"choices":["x"]}')


# chat completions --------------------------------------------------------------------------------

CHAT_ROLE = (
    b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764475200,"model":"m",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}'
)
CHAT_CONTENT = (
    b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764475200,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":" Hello"},"logprobs":null,"finish_reason":null}]}'
)
CHAT_REASONING = (
    b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764475200,"model":"m",'
    b'"choices":[{"index":0,"delta":{"reasoning_content":"Let"},"logprobs":null,"finish_reason":null}]}'
)
CHAT_FINISH = (
    b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764475200,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"length","stop_reason":null}]}'
)
CHAT_USAGE = (
    b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764475200,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":1012,"total_tokens":2012,"completion_tokens":1000}}'
)


def test_chat_role_only_first_chunk_is_not_a_token() -> None:
    p = get_backend("chat").parser()
    assert p.feed(CHAT_ROLE) == 0
    assert p.feed(b'{"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}') == 0


def test_chat_content_counts_one() -> None:
    assert get_backend("chat").parser().feed(CHAT_CONTENT) == 1


def test_chat_role_with_content_counts_one() -> None:
    ev = b'{"choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}'
    assert get_backend("chat").parser().feed(ev) == 1


def test_chat_reasoning_counts_one() -> None:
    assert get_backend("chat").parser().feed(CHAT_REASONING) == 1
    ev = b'{"choices":[{"index":0,"delta":{"reasoning":"hm","content":null},"finish_reason":null}]}'
    assert get_backend("chat").parser().feed(ev) == 1


def test_chat_finish_only_chunk_counts_zero() -> None:
    p = get_backend("chat").parser()
    assert p.feed(CHAT_FINISH) == 0
    assert p.finish_reason == "length"
    assert p.feed(b'{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}') == 0
    assert p.finish_reason == "stop"


def test_chat_last_token_with_finish_counts_one() -> None:
    ev = b'{"choices":[{"index":0,"delta":{"content":" end"},"finish_reason":"length"}]}'
    p = get_backend("chat").parser()
    assert p.feed(ev) == 1
    assert p.finish_reason == "length"


def test_chat_usage() -> None:
    p = get_backend("chat").parser()
    assert p.feed(CHAT_USAGE) == 0
    assert (p.output_tokens, p.prompt_tokens) == (1000, 1012)


def test_chat_error_and_malformed() -> None:
    p = get_backend("chat").parser()
    assert p.feed(b'{"error":{"message":"boom","code":500}}') == 0
    assert p.error == "boom"
    with pytest.raises(MalformedEvent):
        get_backend("chat").parser().feed(b'{"choices":[{"delta":')
    with pytest.raises(MalformedEvent):
        get_backend("chat").parser().feed(b'{"choices":["x"]}')


# SGLang /generate ---------------------------------------------------------------------------------


def sgl(completion: int, finish: str | None = None, svc: int | None = None, text: str = "x") -> bytes:
    """One /generate event, laid out byte for byte as SGLang writes it."""
    fr = "null" if finish is None else f'{{"type":"{finish}","length":{completion}}}'
    extra = "" if svc is None else f',"spec_verify_ct":{svc}'
    return (
        f'{{"text":"{text}","output_ids":[1],"meta_info":{{"id":"9c1","finish_reason":{fr},"prompt_tokens":1000,'
        f'"weight_version":"default","completion_tokens":{completion},"cached_tokens":0{extra},"e2e_latency":0.1}}}}'
    ).encode()


def test_sglang_cumulative_counts_give_deltas() -> None:
    p = get_backend("sglang").parser()
    assert p.feed(sgl(1)) == 1
    assert p.output_tokens == 1
    assert p.prompt_tokens == 1000
    assert p.feed(sgl(4, svc=2)) == 3  # a speculative step accepted three tokens at once
    assert p.output_tokens == 4
    assert p.spec_verify_ct == 2
    assert p.feed(sgl(4)) == 0  # no new token: not a content event
    assert p.spec_verify_ct == 2  # kept when an event does not repeat it
    assert p.feed(sgl(6, finish="length", svc=3)) == 2
    assert p.finish_reason == "length"
    assert p.output_tokens == 6
    assert p.spec_verify_ct == 3


def test_sglang_first_event_with_several_tokens() -> None:
    p = get_backend("sglang").parser()
    assert p.feed(sgl(3)) == 3


def test_sglang_finish_reason_forms() -> None:
    p = get_backend("sglang").parser()
    p.feed(b'{"text":"","meta_info":{"completion_tokens":1,"finish_reason":{"type":"stop","matched":2}}}')
    assert p.finish_reason == "stop"
    p = get_backend("sglang").parser()
    p.feed(b'{"text":"","meta_info":{"completion_tokens":1,"finish_reason":"abort"}}')
    assert p.finish_reason == "abort"


def test_sglang_error_event() -> None:
    p = get_backend("sglang").parser()
    assert p.feed(b'{"error":{"message":"Input length exceeds the context"}}') == 0
    assert p.error == "Input length exceeds the context"


@pytest.mark.parametrize(
    "payload",
    [b'{"text":"x"}', b'{"text":"x","meta_info":{}}', b'{"text":"x","meta_info":null}', b"{bad", b"[]"],
)
def test_sglang_malformed(payload: bytes) -> None:
    with pytest.raises(MalformedEvent):
        get_backend("sglang").parser().feed(payload)


def test_sglang_malformed_names_missing_key() -> None:
    with pytest.raises(MalformedEvent, match="meta_info"):
        get_backend("sglang").parser().feed(b'{"text":"x"}')


def test_sglang_non_integer_count_is_malformed() -> None:
    with pytest.raises(MalformedEvent):
        get_backend("sglang").parser().feed(b'{"text":"x","meta_info":{"completion_tokens":null}}')


# request bodies -----------------------------------------------------------------------------------


def test_openai_body() -> None:
    ids = [1001, 1002, 1003]
    body = get_backend("openai").body(ids, 64, "m", 0.0, {})
    assert body == {
        "model": "m",
        "prompt": [1001, 1002, 1003],
        "max_tokens": 64,
        "min_tokens": 64,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "return_spec_tokens_details": True,
    }


def test_openai_body_merges_extra() -> None:
    extra = {"top_p": 0.5, "temperature": 0.3}
    body = get_backend("openai").body([1], 8, None, 0.0, extra)
    assert body["top_p"] == 0.5
    assert body["temperature"] == 0.3
    assert body["model"] is None
    assert extra == {"top_p": 0.5, "temperature": 0.3}


def test_sglang_body() -> None:
    body = get_backend("sglang").body([5, 6], 100, "m", 0.0, {})
    assert body == {
        "stream": True,
        "input_ids": [5, 6],
        "sampling_params": {"max_new_tokens": 100, "ignore_eos": True, "temperature": 0.0},
    }


def test_sglang_body_merges_extra_sampling_params() -> None:
    extra = {"sampling_params": {"top_k": 5, "temperature": 0.2}, "return_logprob": False}
    body = get_backend("sglang").body([5], 10, None, 0.0, extra)
    assert body["sampling_params"] == {
        "max_new_tokens": 10,
        "ignore_eos": True,
        "temperature": 0.2,
        "top_k": 5,
    }
    assert body["return_logprob"] is False
    assert extra == {"sampling_params": {"top_k": 5, "temperature": 0.2}, "return_logprob": False}
    # The next body does not inherit anything from the last one.
    again = get_backend("sglang").body([5], 10, None, 0.0, {})
    assert again["sampling_params"] == {"max_new_tokens": 10, "ignore_eos": True, "temperature": 0.0}


def test_sglang_body_text_prompt() -> None:
    body = get_backend("sglang").body("hello there", 10, None, 0.0, {})
    assert body["text"] == "hello there"
    assert "input_ids" not in body


def test_chat_body() -> None:
    body = get_backend("chat").body("1 the of and", 32, "m", 0.5, {"top_p": 0.9})
    assert body["messages"] == [{"role": "user", "content": "1 the of and"}]
    assert body["model"] == "m"
    assert body["max_tokens"] == 32 and body["min_tokens"] == 32
    assert body["ignore_eos"] is True
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["temperature"] == 0.5
    assert body["top_p"] == 0.9
    assert "prompt" not in body


# llama.cpp's last event, as seen from a speculative llama-server (draft model, --spec-synth-len 3)
LLAMACPP_SPEC_LAST = (
    b'{"choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"length"}],"object":"text_completion",'
    b'"usage":{"completion_tokens":20,"prompt_tokens":3,"total_tokens":23},"timings":{"cache_n":0,"prompt_n":3,'
    b'"predicted_n":20,"predicted_ms":20.466,"draft_n":19,"draft_n_accepted":12}}'
)


@pytest.mark.parametrize("backend", ["openai", "chat"])
def test_llamacpp_timings_give_drafted_and_accepted_but_no_steps(backend: str) -> None:
    p = get_backend(backend).parser()
    ev = (
        LLAMACPP_SPEC_LAST if backend == "openai" else LLAMACPP_SPEC_LAST.replace(b'"text":""', b'"delta":{}')
    )
    assert p.feed(ev) == 0
    # 20 tokens, 12 of them accepted drafts out of 19; how many steps drafted, timings do not say.
    assert (p.output_tokens, p.spec_accepted, p.spec_drafted, p.spec_verify_ct) == (20, 12, 19, None)


def test_llamacpp_timings_without_a_draft_say_nothing() -> None:
    p = get_backend("openai").parser()
    p.feed(LLAMACPP_SPEC_LAST.replace(b'"draft_n":19,"draft_n_accepted":12', b'"predicted_per_second":9'))
    assert p.spec_verify_ct is None and p.spec_drafted is None and p.spec_source is None
