"""A server that echoes the Authorization header in an error must not put the key into the records,
run.json, the report or the log (review ab9c161, M6): every reason built from a server's words goes
through the same redaction."""

from __future__ import annotations

import pytest

from specload.client.http import redact_key, server_message

KEY = "sk-ECHOKEY-555"


@pytest.mark.parametrize(
    "body",
    [
        b'{"error": {"message": "invalid key: Bearer sk-ECHOKEY-555"}}',
        b"401 Unauthorized: your header was Authorization: Bearer sk-ECHOKEY-555",
        b'{"detail": "key sk-ECHOKEY-555 is not valid"}',
        b"x" * 190 + b" Bearer sk-ECHOKEY-555 and more text after it" * 3,  # cut by shorten: still redacted
    ],
)
def test_an_echoed_key_is_redacted_in_the_reason(monkeypatch: pytest.MonkeyPatch, body: bytes) -> None:
    monkeypatch.setenv("SPECLOAD_API_KEY", KEY)
    msg = server_message(401, body)
    assert "ECHOKEY" not in msg and "sk-ECHO" not in msg, msg
    assert "<redacted>" in msg or len(msg) < len(body), msg


def test_another_bearer_token_is_redacted_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECLOAD_API_KEY", raising=False)
    assert redact_key("got Authorization: Bearer abc.def-123 from you") == (
        "got Authorization: Bearer <redacted> from you"
    )
    assert redact_key("model overloaded, try later") == "model overloaded, try later"
