"""The EC2 Query wire format: a flat form of ``Name=value`` pairs, lists as ``Name.N``.

EC2 flattens structures and lists into dotted keys: ``InstanceId.1``,
``Filter.2.Value.1``, ``TagSpecification.1.Tag.3.Key``. `Params` reads them back
without building a tree first, so a malformed or hostile key (``Filter.x.Name``,
``Filter.99999999999.Name``) costs nothing until an action asks for it, and then fails
as ``InvalidParameterValue`` rather than as a crash.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from urllib.parse import parse_qsl

from roost.domain.errors import InvalidParameterValue, MissingParameter

MAX_LIST_INDEX = 10_000
"""The largest ``.N`` accepted. EC2's own lists stop far below it."""
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
        try:
            return int(raw)
        except ValueError:
            raise InvalidParameterValue(
                f"Value ({raw}) for parameter {self._key(name)} is invalid. "
                "Expected an integer."
            ) from None

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
            f"Value ({raw}) for parameter {self._key(name)} is invalid. Expected a boolean."
        )

    def _indices(self, name: str) -> Iterator[tuple[int, str]]:
        """``(N, rest)`` for every key ``<prefix><name>.N[.rest]``, in key order."""
        head = self._key(name) + "."
        for key in self._pairs:
            if not key.startswith(head):
                continue
            index, _, rest = key[len(head):].partition(".")
            if not index.isdigit() or not 1 <= int(index) <= MAX_LIST_INDEX:
                raise InvalidParameterValue(f"Invalid list index in parameter {key}")
            yield int(index), rest

    def values(self, name: str) -> list[str]:
        """The values of ``name.1``, ``name.2``, ...: ordered by N, gaps allowed."""
        found = {i: self._pairs[f"{self._key(name)}.{i}"] for i, rest in self._indices(name)
                 if not rest}
        return [found[i] for i in sorted(found)]

    def members(self, name: str) -> list[Params]:
        """One `Params` per structure ``name.N.*``, ordered by N."""
        indices = sorted({i for i, rest in self._indices(name) if rest})
        return [Params(self._pairs, prefix=f"{self._key(name)}.{i}.") for i in indices]

    def has(self, name: str) -> bool:
        key = self._key(name)
        return key in self._pairs or any(k.startswith(key + ".") for k in self._pairs)
