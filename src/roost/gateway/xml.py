"""A small builder for EC2's response XML, and the one renderer of errors.

EC2 responses are element-only XML (no attributes but the namespace), lists are
``<fooSet><item>...</item></fooSet>``, and booleans are ``true``/``false``. A fragment
is a `Fragment` (already-escaped text); only `text` escapes, so nothing is escaped twice.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from functools import lru_cache
from xml.sax.saxutils import escape

from roost.domain.errors import RoostError

NAMESPACE = "http://ec2.amazonaws.com/doc/2016-11-15/"
API_VERSION = "2016-11-15"
_PROLOG = '<?xml version="1.0" encoding="UTF-8"?>\n'
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


_NEEDS_WORK = re.compile("[&<>\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def escape_text(value: str) -> str:
    """Escape for element text. Characters XML 1.0 cannot carry at all (NUL and most
    controls, which a form can smuggle in) become U+FFFD, so the document still parses.

    Most values (ids, names, times) hold none of them: one search answers those, which
    keeps a 10,000-instance DescribeInstances from spending most of its time here."""
    if _NEEDS_WORK.search(value) is None:
        return value
    return escape(_NOT_XML.sub("\ufffd", value))


_escape = escape_text


class Fragment(str):
    """Rendered, escaped XML."""


def text(tag: str, value: str | int | bool | None) -> Fragment:
    """``<tag>value</tag>``; None renders nothing, as EC2 omits unset members."""
    if value is None:
        return Fragment("")
    if type(value) is str:
        body = _escape(value)
    elif isinstance(value, bool):
        body = "true" if value else "false"
    else:
        body = _escape(str(value))
    return Fragment(f"<{tag}>{body}</{tag}>")


def node(tag: str, *children: str) -> Fragment:
    return Fragment(f"<{tag}>{''.join(children)}</{tag}>")


def items(tag: str, members: Iterable[str]) -> Fragment:
    """``<tag><item>m</item>...</tag>``, or ``<tag/>`` when empty."""
    inner = "".join(f"<item>{m}</item>" for m in members)
    return Fragment(f"<{tag}>{inner}</{tag}>" if inner else f"<{tag}/>")


def values(tag: str, members: Iterable[str]) -> Fragment:
    """A list of plain strings: ``<tag><item>a</item>...</tag>``."""
    return items(tag, (Fragment(_escape(m)) for m in members))


@lru_cache(maxsize=16384)
def timestamp(iso: str) -> str:
    """Any ISO 8601 time as EC2 writes it: UTC, milliseconds, ``Z``.

    Terraform's SDK parses RFC 3339 strictly, so the node's format is normalised here
    rather than passed through.
    """
    try:
        t = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return iso
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    t = t.astimezone(UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def response(action: str, request_id: str, *children: str) -> str:
    body = "".join(children)
    return (
        f'{_PROLOG}<{action}Response xmlns="{NAMESPACE}">'
        f"<requestId>{_escape(request_id)}</requestId>{body}</{action}Response>"
    )


def error(err: RoostError, request_id: str) -> str:
    """EC2's error envelope. Every failure the gateway returns goes through here."""
    return (
        f"{_PROLOG}<Response><Errors><Error>"
        f"<Code>{_escape(err.code)}</Code><Message>{_escape(err.message)}</Message>"
        f"</Error></Errors><RequestID>{_escape(request_id)}</RequestID></Response>"
    )
