"""How a worker of a native pool gets its database credential without it ever being in
user data (which any caller allowed to describe the instance can read).

1. At launch, the native adapter puts an **enrollment token** in the user data, not a
   DSN: ``ret1.<pool>.<nonce>.<mac>``, where the nonce is the launch's ClientToken and the
   MAC an HMAC-SHA256 under a key derived from the adapter's secret access key. It is a
   function of the launch, so a retried RunInstances sends the same user data (EC2
   compares it under a ClientToken), and every controller replica with the same
   settings can check it without shared state.
2. The worker starts and POSTs the token and its instance id (``ROOST_INSTANCE_ID``) to
   ``/api/v1/worker-credentials`` on the controller.
3. The controller checks the MAC; asks the gateway that the instance is a pending or
   running instance of that pool, launched less than ``enroll_ttl`` seconds ago; and
   records the instance in ``worker_enrollments``, once: a second exchange for the same
   instance is refused. Only then does it answer with the DSN of the least-privilege
   ``roost_worker`` role (`roost.store.roles`).

A token read from user data is worth little: it works only for a fresh instance of its
pool that has not enrolled yet, which in practice the worker itself does within
seconds of boot. What this does not protect is in docs/security.md.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass

PREFIX = "ret1"
_TOKEN = re.compile(r"ret1\.([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)\.([0-9a-f]{1,64})\.([0-9a-f]{64})")
INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,17}")
ENV_TOKEN = "ROOST_WORKER_ENROLL_TOKEN"
ENV_URL = "ROOST_WORKER_ENROLL_URL"


def derive_key(secret: str) -> bytes:
    """The MAC key, from a secret every replica of one controller deployment shares."""
    return hmac.new(secret.encode(), b"roost worker enrollment v1", hashlib.sha256).digest()


def _mac(key: bytes, pool_id: str, nonce: str) -> str:
    return hmac.new(key, f"{pool_id}\0{nonce}".encode(), hashlib.sha256).hexdigest()


def issue(key: bytes, pool_id: str, nonce: str) -> str:
    return f"{PREFIX}.{pool_id}.{nonce}.{_mac(key, pool_id, nonce)}"


@dataclass(frozen=True, slots=True)
class Enrollment:
    pool_id: str
    nonce: str


def verify(key: bytes, token: str) -> Enrollment | None:
    """The pool a token was issued for, or None for one that is malformed or forged."""
    m = _TOKEN.fullmatch(token)
    if m is None:
        return None
    pool_id, nonce, mac = m.group(1), m.group(3), m.group(4)
    if not hmac.compare_digest(mac, _mac(key, pool_id, nonce)):
        return None
    return Enrollment(pool_id, nonce)
