"""The EC2 Query wire format: a flat form of ``Name=value`` pairs, lists as ``Name.N``.

EC2 flattens structures and lists into dotted keys: ``InstanceId.1``,
``Filter.2.Value.1``, ``TagSpecification.1.Tag.3.Key``. `Params` reads them back
without building a tree first, so a malformed or hostile key (``Filter.x.Name``,
``Filter.99999999999.Name``) costs nothing until an action asks for it, and then fails
as ``InvalidParameterValue`` rather than as a crash.

A list index is what EC2's Query reference calls ``param.n``: "an integer starting from
1". roost reads that strictly, as ASCII decimal without leading zeros, so that one
member has one spelling. ``str.isdigit`` alone is not enough: it accepts ``²``, ``③``
and Arabic-Indic digits that ``int`` then refuses or silently maps to another key, and
``InstanceId.01`` would be read as ``InstanceId.1``, a key the form does not hold.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from urllib.parse import parse_qsl

from roost.domain.errors import InvalidParameterValue, MissingParameter

MAX_LIST_INDEX = 10_000
"""The largest ``.N`` accepted. EC2's own lists stop far below it (1,000 ids a page), but
indices may leave gaps, so the bound is on the number, not on the count."""
_INDEX = re.compile(r"[1-9][0-9]{0,4}")
"""An index as EC2 spells it: ASCII, no sign, no leading zero, at most 5 digits (so a
4,000-digit index is refused by its length, before any ``int`` conversion)."""
_INTEGER = re.compile(r"[+-]?[0-9]{1,30}")
"""An integer value: ASCII digits only (``int`` would also take ``1_0``, `` 5`` and
non-ASCII digits, none of which botocore sends)."""
_SHOWN = 80
"""How much of a hostile key an error message repeats."""
MAX_FIELDS = 2_000
"""More pairs than any EC2 action takes; a larger form is refused before it is read."""


def parse_form(body: bytes, query: str = "") -> dict[str, str]:
    """Merge the URL query and a form-encoded body into one mapping (the body wins).

    EC2 accepts the parameters in either place; boto3 and Terraform send a POST body,
    a hand-written ``curl`` often a GET query string.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidParameterValue("The request body is not valid UTF-8.") from None
    pairs: dict[str, str] = {}
    for source in (query, text):
        try:
            for key, value in parse_qsl(
                source, keep_blank_values=True, errors="strict", max_num_fields=MAX_FIELDS
            ):
                pairs[key] = value
        except (UnicodeDecodeError, ValueError):
            raise InvalidParameterValue("The request is not valid form encoding.") from None
    return pairs


class Params:
    """Read access to a flat Query mapping, scoped to a prefix by `members`."""

    def __init__(self, pairs: Mapping[str, str], *, prefix: str = "") -> None:
        self._pairs = pairs
        self._prefix = prefix

    def _key(self, name: str) -> str:
        return f"{self._prefix}{name}"

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._pairs.get(self._key(name), default)

    def require(self, name: str) -> str:
        value = self._pairs.get(self._key(name))
        if value is None or value == "":
            raise MissingParameter(f"The request must contain the parameter {self._key(name)}")
        return value

    def integer(self, name: str, default: int | None = None) -> int | None:
        raw = self.get(name)
        if raw is None or raw == "":
            return default
        if _INTEGER.fullmatch(raw) is None:
            raise InvalidParameterValue(
                f"Value ({_shown(raw)}) for parameter {self._key(name)} is invalid. "
                "Expected an integer."
            )
        return int(raw)

    def flag(self, name: str, default: bool = False) -> bool:
        raw = self.get(name)
        if raw is None or raw == "":
            return default
        low = raw.lower()
        if low in ("true", "1"):
            return True
        if low in ("false", "0"):
            return False
        raise InvalidParameterValue(
            f"Value ({_shown(raw)}) for parameter {self._key(name)} is invalid. "
            "Expected a boolean."
        )

    def _indices(self, name: str) -> Iterator[tuple[int, str | None, str]]:
        """``(N, rest, key)`` for every key ``<prefix><name>.N[.rest]``, in key order;
        ``rest`` is None for a plain list element ``name.N``.

        A key that ends in a dot (``InstanceId.2.``) names neither an element nor a
        member, so it is refused rather than read as one of them.
        """
        head = self._key(name) + "."
        for key in self._pairs:
            if not key.startswith(head):
                continue
            index, dot, rest = key[len(head):].partition(".")
            if _INDEX.fullmatch(index) is None or int(index) > MAX_LIST_INDEX:
                raise InvalidParameterValue(
                    f"Invalid list index in parameter {_shown(key)}: expected 1 to "
                    f"{MAX_LIST_INDEX} in ASCII digits, without leading zeros"
                )
            if dot and not rest:
                raise InvalidParameterValue(f"Invalid parameter name {_shown(key)}")
            yield int(index), rest if dot else None, key

    def values(self, name: str) -> list[str]:
        """The values of ``name.1``, ``name.2``, ...: ordered by N, gaps allowed."""
        found = {i: self._pairs[key] for i, rest, key in self._indices(name) if rest is None}
        return [found[i] for i in sorted(found)]

    def members(self, name: str) -> list[Params]:
        """One `Params` per structure ``name.N.*``, ordered by N."""
        indices = sorted({i for i, rest, _ in self._indices(name) if rest is not None})
        return [Params(self._pairs, prefix=f"{self._key(name)}.{i}.") for i in indices]

    def under(self, name: str) -> Params:
        """The structure ``name.*`` as a `Params` of its own."""
        return Params(self._pairs, prefix=f"{self._key(name)}.")

    def pairs(self) -> dict[str, str]:
        """Every pair under this prefix, the prefix taken off."""
        n = len(self._prefix)
        return {k[n:]: v for k, v in self._pairs.items() if k.startswith(self._prefix)}

    def has(self, name: str) -> bool:
        key = self._key(name)
        return key in self._pairs or any(k.startswith(key + ".") for k in self._pairs)


def _shown(text: str) -> str:
    """``text`` cut short for an error message: a client's 4,000-digit key is its own
    evidence, the answer need not echo all of it."""
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
