"""SigV4 verification against requests signed by botocore's own signer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from roost.domain.errors import AuthFailure, RequestExpired
from roost.gateway.sigv4 import SignedRequest, SigV4Verifier

KEY, SECRET = "AKIAROOSTTEST0000001", "secret-one"
BODY = b"Action=DescribeInstances&Version=2016-11-15"


def sign(
    body: bytes = BODY, *, secret: str = SECRET, method: str = "POST",
    url: str = "http://127.0.0.1:8773/", region: str = "roost-1",
) -> SignedRequest:
    req = AWSRequest(method=method, url=url, data=body,
                     headers={"Content-Type": "application/x-www-form-urlencoded"})
    SigV4Auth(Credentials(KEY, secret), "ec2", region).add_auth(req)
    parts = urlsplit(url)
    headers = [(k.lower(), v) for k, v in req.headers.items()]
    headers.append(("host", parts.netloc))
    return SignedRequest(method, parts.path or "/", parts.query, headers, body)


def verifier(now: datetime | None = None) -> SigV4Verifier:
    return SigV4Verifier({KEY: SECRET}, clock=lambda: now or datetime.now(UTC))


def test_botocore_signature_verifies() -> None:
    assert verifier().verify(sign()) == KEY


def test_get_with_query_string_verifies() -> None:
    url = "http://127.0.0.1:8773/?Action=DescribeRegions&Version=2016-11-15&Filter.1.Name=a%20b"
    assert verifier().verify(sign(b"", method="GET", url=url)) == KEY


def test_any_region_in_scope_is_accepted() -> None:
    assert verifier().verify(sign(region="us-east-1")) == KEY


def test_tampered_body_fails() -> None:
    req = sign()
    tampered = SignedRequest(req.method, req.path, req.query, req.headers, BODY + b"&DryRun=true")
    with pytest.raises(AuthFailure):
        verifier().verify(tampered)


def test_wrong_secret_fails() -> None:
    with pytest.raises(AuthFailure):
        verifier().verify(sign(secret="not-the-secret"))


def test_unknown_key_fails() -> None:
    with pytest.raises(AuthFailure):
        SigV4Verifier({"OTHER": SECRET}).verify(sign())


def test_missing_authorization_fails() -> None:
    req = sign()
    bare = SignedRequest(req.method, req.path, req.query,
                         [h for h in req.headers if h[0] != "authorization"], req.body)
    with pytest.raises(AuthFailure):
        verifier().verify(bare)


@pytest.mark.parametrize("skew", [timedelta(minutes=16), timedelta(minutes=-16)])
def test_skew_over_fifteen_minutes_is_expired(skew: timedelta) -> None:
    with pytest.raises(RequestExpired):
        verifier(datetime.now(UTC) + skew).verify(sign())


def test_skew_within_fifteen_minutes_passes() -> None:
    assert verifier(datetime.now(UTC) + timedelta(minutes=14)).verify(sign()) == KEY


def test_content_hash_header_must_match_body() -> None:
    req = sign()
    lying = SignedRequest(req.method, req.path, req.query,
                          [*req.headers, ("x-amz-content-sha256", "0" * 64)], req.body)
    with pytest.raises(AuthFailure):
        verifier().verify(lying)


@pytest.mark.parametrize("stamp", ["20261201T1200Z", "2026-12-01T12:00:00Z",
                                   "20261201T12000\u0660Z", "20261301T120000Z", "20261201 120000Z"])
def test_a_malformed_amz_date_is_refused(stamp: str) -> None:
    req = sign()
    bad = SignedRequest(req.method, req.path, req.query,
                        [(k, stamp if k == "x-amz-date" else v) for k, v in req.headers],
                        req.body)
    with pytest.raises(AuthFailure, match="X-Amz-Date"):
        verifier().verify(bad)
