"""Who may look and who may act.

- On a loopback address, anyone who can reach the port may look (read-only); anyone on
  the machine can already read the same through NATS.
- Off loopback, every page needs credentials, and with none configured the dashboard
  refuses to start (`check_bind`).
- An action (drain) always needs credentials: the gateway's access key id and secret,
  sent with HTTP Basic auth, the same keys the EC2 API takes. The action must also come
  from the dashboard's own page (an ``HX-Request`` header, which a cross-site form cannot
  set), so a browser that remembers the credentials cannot be made to drain by another
  site.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
from collections.abc import Mapping


class BindRefused(Exception):
    pass


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, credentials: Mapping[str, str]) -> None:
    if not is_loopback(host) and not credentials:
        raise BindRefused(
            f"refusing to serve the dashboard on {host!r} without credentials: off "
            "loopback every page needs them. Give --credentials KEY:SECRET (the gateway's "
            "access keys), or bind to 127.0.0.1 and reach it through an SSH tunnel."
        )


def basic_user(header: str, credentials: Mapping[str, str]) -> str | None:
    """The access key id if ``header`` is HTTP Basic auth with a configured key pair."""
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic" or not value:
        return None
    try:
        user, sep, password = base64.b64decode(value, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    secret = credentials.get(user)
    if not sep or secret is None:
        return None
    if not hmac.compare_digest(password.encode(), secret.encode()):
        return None
    return user


CHALLENGE = {"WWW-Authenticate": 'Basic realm="roost dashboard", charset="UTF-8"'}
