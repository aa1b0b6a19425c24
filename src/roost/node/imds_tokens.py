"""IMDSv2 session tokens that need no server-side table.

EC2 hands out an opaque token on ``PUT /latest/api/token`` and accepts it on later GETs
until its TTL runs out, only from the instance it was issued to. Keeping a table of
issued tokens would grow with every PUT (clients may ask for a token per request) and
would be lost on restart anyway, so the token carries its own expiry and an HMAC over
``instance id | expiry`` under a secret only this server knows. Verifying is then a
pure function of the token, the caller's instance id, the secret and ``now``.

A token issued to instance A and presented by instance B fails the MAC check, exactly
as EC2 rejects a token used "outside of the instance on which it was generated".
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import re
import struct

MAX_TTL_SECONDS = 21600
"""Six hours: EC2's upper bound for X-aws-ec2-metadata-token-ttl-seconds."""
MIN_TTL_SECONDS = 1

_EXPIRY = struct.Struct(">Q")  # expiry in whole milliseconds since the epoch
_MAC_SIZE = hashlib.sha256().digest_size
_TOKEN_SIZE = _EXPIRY.size + _MAC_SIZE
_DIGITS = re.compile(r"[0-9]{1,6}")


def parse_ttl(header: str | None) -> int | None:
    """The requested TTL in seconds, or None when EC2 would answer 400: missing,
    not a plain decimal integer, or outside 1..21600."""
    if header is None or not _DIGITS.fullmatch(header.strip()):
        return None
    ttl = int(header)
    return ttl if MIN_TTL_SECONDS <= ttl <= MAX_TTL_SECONDS else None


class TokenSigner:
    """Issues and checks tokens under one secret; the secret never leaves this object."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the IMDS token secret must be at least 16 bytes")
        self._secret = secret

    def issue(self, instance_id: str, ttl: int, *, now: float) -> str:
        """A token valid for ``ttl`` seconds from ``now``, for ``instance_id`` only."""
        expiry_ms = math.floor((now + ttl) * 1000)
        raw = _EXPIRY.pack(expiry_ms) + self._mac(instance_id, expiry_ms)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    def remaining(self, token: str, instance_id: str, *, now: float) -> int | None:
        """Whole seconds the token has left (rounded up, as a client would count them),
        or None when it is malformed, forged, expired or belongs to another instance."""
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (binascii.Error, ValueError):
            return None
        if len(raw) != _TOKEN_SIZE:
            return None
        (expiry_ms,) = _EXPIRY.unpack_from(raw)
        if not hmac.compare_digest(raw[_EXPIRY.size:], self._mac(instance_id, expiry_ms)):
            return None
        left = expiry_ms / 1000 - now
        return math.ceil(left) if left > 0 else None

    def _mac(self, instance_id: str, expiry_ms: int) -> bytes:
        message = f"{instance_id}|{expiry_ms}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).digest()
