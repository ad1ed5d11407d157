"""The proxy's client API key is compared in constant time."""

from __future__ import annotations

import hmac

import pytest

from ucmctl.proxy import app

KEY = b"Bearer s3cret"


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("Bearer s3cret", True),
        ("Bearer s3cre", False),  # a prefix of the key
        ("Bearer s3cretX", False),
        ("bearer s3cret", False),
        ("", False),
        ("Bearer s3cr\udcffet", False),  # bytes that are not UTF-8, as a lenient decoder keeps them
    ],
)
def test_authorization_matches_only_the_exact_header(header: str, ok: bool) -> None:
    assert app.authorization_matches(header, KEY) is ok


def test_comparison_is_hmac_compare_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(app.hmac, "compare_digest", spy)
    assert app.authorization_matches("Bearer nope", KEY) is False
    assert calls == [(b"Bearer nope", KEY)]
