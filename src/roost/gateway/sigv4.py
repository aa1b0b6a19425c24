"""AWS Signature Version 4 verification for the EC2 endpoint and the admin API.

The verifier rebuilds the canonical request from what arrived (method, path, query,
the headers the client says it signed, and the hash of the exact body bytes), signs it
with the secret of the claimed access key, and compares with `hmac.compare_digest`.
The region and service in the credential scope are taken as the client sent them:
clients sign with whatever region they are configured for, and roost has one.

Order of checks, each with EC2's code:
  no or unparsable Authorization, unknown key, host unsigned -> AuthFailure
  X-Amz-Date more than 15 minutes from the gateway's clock   -> RequestExpired
  signature mismatch (tampered body, wrong secret)           -> AuthFailure
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Protocol
from urllib.parse import quote, unquote

from roost.domain.errors import AuthFailure, RequestExpired

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW = timedelta(minutes=15)
_AUTH = re.compile(
    r"AWS4-HMAC-SHA256\s+Credential=(?P<cred>[^,\s]+)\s*,\s*"
    r"SignedHeaders=(?P<signed>[^,\s]+)\s*,\s*Signature=(?P<sig>[0-9a-f]{64})\s*"
)
_SPACES = re.compile(r"\s+")
_DENIED = "AWS was not able to validate the provided access credentials"


@dataclass(frozen=True, slots=True)
class SignedRequest:
    """The parts of an HTTP request that SigV4 covers. ``headers`` keep repeats."""

    method: str
    path: str
    query: str
    headers: Sequence[tuple[str, str]]
    body: bytes


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode("utf-8"), hashlib.sha256).digest()


@functools.lru_cache(maxsize=256)
def signing_key(secret: str, day: str, region: str, service: str) -> bytes:
    """The day's key for ``secret`` (four HMACs): the same for every request of that day,
    so it is kept (by secret: a rotated secret derives its own)."""
    k = _hmac(f"AWS4{secret}".encode(), day)
    k = _hmac(k, region)
    k = _hmac(k, service)
    return _hmac(k, "aws4_request")


def _uri_encode(s: str, safe: str = "-_.~") -> str:
    return quote(s, safe=safe)


def canonical_query(query: str) -> str:
    pairs = []
    for part in query.split("&"):
        if not part:
            continue
        k, _, v = part.partition("=")
        pairs.append((_uri_encode(unquote(k)), _uri_encode(unquote(v))))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def canonical_path(path: str) -> str:
    return _uri_encode(path or "/", safe="/~")


def canonical_request(req: SignedRequest, signed: Sequence[str], payload_hash: str) -> str:
    grouped: dict[str, list[str]] = {}
    for name, value in req.headers:
        grouped.setdefault(name.lower(), []).append(_SPACES.sub(" ", value.strip()))
    lines = [f"{h}:{','.join(grouped.get(h, []))}\n" for h in signed]
    return "\n".join([
        req.method.upper(),
        canonical_path(req.path),
        canonical_query(req.query),
        "".join(lines),
        ";".join(signed),
        payload_hash,
    ])


def _header(req: SignedRequest, name: str) -> str | None:
    for k, v in req.headers:
        if k.lower() == name:
            return v
    return None


def _amz_date(raw: str) -> datetime:
    """``YYYYMMDDTHHMMSSZ`` (by hand: `datetime.strptime` was a few percent of a launch's
    CPU, for one fixed format)."""
    digits = raw[:8] + raw[9:15]
    if len(raw) != 16 or raw[8] != "T" or raw[15] != "Z" or not (
            digits.isascii() and digits.isdigit()):
        raise ValueError(raw)
    return datetime(int(raw[:4]), int(raw[4:6]), int(raw[6:8]), int(raw[9:11]),
                    int(raw[11:13]), int(raw[13:15]), tzinfo=UTC)


def _request_time(req: SignedRequest) -> datetime:
    raw = _header(req, "x-amz-date")
    try:
        if raw is not None:
            return _amz_date(raw)
        date = _header(req, "date")
        if date is not None:
            return parsedate_to_datetime(date).astimezone(UTC)
    except (ValueError, TypeError):
        pass
    raise AuthFailure("The request must carry a valid X-Amz-Date header.")


class KeyLookup(Protocol):
    """Access key id -> secret, None when unknown: a dict, or a gateway's `KeyBook`
    that follows the accounts bucket (so revocations land without a restart)."""

    def get(self, key_id: str, /) -> str | None: ...


class SigV4Verifier:
    """Checks requests against ``keys`` (access key id -> secret), looked up per
    request: the lookup is live, not copied."""

    def __init__(
        self,
        keys: KeyLookup,
        *,
        max_skew: timedelta = MAX_SKEW,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self._keys = keys
        self._max_skew = max_skew
        self._clock = clock

    def verify(self, req: SignedRequest) -> str:
        """The access key id that signed ``req``; raises AuthFailure or RequestExpired."""
        auth = _header(req, "authorization")
        match = _AUTH.fullmatch(auth.strip()) if auth else None
        if match is None:
            raise AuthFailure(_DENIED)
        scope = match["cred"].split("/")
        if len(scope) != 5 or scope[4] != "aws4_request":
            raise AuthFailure(_DENIED)
        key_id, day, region, service, _ = scope
        secret = self._keys.get(key_id)
        signed = match["signed"].split(";")
        if secret is None or "host" not in signed or signed != sorted(signed):
            raise AuthFailure(_DENIED)
        when = _request_time(req)
        if abs(self._clock() - when) > self._max_skew:
            raise RequestExpired("Request has expired.")
        if when.strftime("%Y%m%d") != day:
            raise AuthFailure(_DENIED)
        payload_hash = hashlib.sha256(req.body).hexdigest()
        claimed = _header(req, "x-amz-content-sha256")
        if claimed is not None and claimed != payload_hash:
            raise AuthFailure(_DENIED)
        to_sign = "\n".join([
            ALGORITHM,
            _header(req, "x-amz-date") or _header(req, "date") or "",
            "/".join(scope[1:]),
            hashlib.sha256(canonical_request(req, signed, payload_hash).encode()).hexdigest(),
        ])
        expected = hmac.new(
            signing_key(secret, day, region, service), to_sign.encode(), hashlib.sha256
        ).hexdigest()
        if not hmac.compare_digest(expected, match["sig"]):
            raise AuthFailure(_DENIED)
        return key_id
