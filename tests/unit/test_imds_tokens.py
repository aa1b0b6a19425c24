"""IMDSv2 tokens: signed, bound to one instance, expiring on an injected clock."""

from __future__ import annotations

import pytest

from roost.node.imds_tokens import MAX_TTL_SECONDS, TokenSigner, parse_ttl

SECRET = b"s" * 32
T0 = 1_700_000_000.0


def test_a_token_verifies_for_its_instance_and_counts_down() -> None:
    signer = TokenSigner(SECRET)
    token = signer.issue("i-a", 60, now=T0)
    assert signer.remaining(token, "i-a", now=T0) == 60
    assert signer.remaining(token, "i-a", now=T0 + 0.5) == 60  # rounded up
    assert signer.remaining(token, "i-a", now=T0 + 59.2) == 1
    assert signer.remaining(token, "i-a", now=T0 + 60) is None
    assert signer.remaining(token, "i-a", now=T0 + 3600) is None


def test_a_token_is_refused_for_another_instance() -> None:
    signer = TokenSigner(SECRET)
    token = signer.issue("i-a", 60, now=T0)
    assert signer.remaining(token, "i-b", now=T0) is None


def test_another_secret_does_not_accept_the_token() -> None:
    token = TokenSigner(SECRET).issue("i-a", 60, now=T0)
    assert TokenSigner(b"t" * 32).remaining(token, "i-a", now=T0) is None


@pytest.mark.parametrize("mangle", [
    lambda t: t[:-2] + ("AA" if t[-2:] != "AA" else "BB"),  # MAC changed
    lambda t: ("B" if t[0] != "B" else "C") + t[1:],        # expiry changed
    lambda t: t[:10],                                        # truncated
    lambda t: t + "AAAA",                                    # too long
    lambda t: "",
    lambda t: "not a token!",
    lambda t: "é" * 54,
])
def test_a_tampered_or_garbage_token_is_refused(mangle: object) -> None:
    signer = TokenSigner(SECRET)
    token = signer.issue("i-a", 60, now=T0)
    assert callable(mangle)
    assert signer.remaining(mangle(token), "i-a", now=T0) is None


def test_tokens_are_opaque_urlsafe_text() -> None:
    token = TokenSigner(SECRET).issue("i-a", MAX_TTL_SECONDS, now=T0)
    assert token.isascii() and "i-a" not in token
    assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def test_a_short_secret_is_refused() -> None:
    with pytest.raises(ValueError):
        TokenSigner(b"short")


@pytest.mark.parametrize(("header", "ttl"), [
    ("1", 1), ("21600", 21600), ("300", 300), (" 60 ", 60),
    (None, None), ("", None), ("0", None), ("21601", None), ("-5", None), ("+5", None),
    ("1.5", None), ("abc", None), ("9999999", None),
])
def test_ttl_header_must_be_1_to_21600(header: str | None, ttl: int | None) -> None:
    assert parse_ttl(header) == ttl
