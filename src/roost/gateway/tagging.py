"""Tags as EC2 takes them, wherever they enter: CreateTags, DeleteTags and the
TagSpecification.N of every action that creates something.

One set of rules, so that no way in is laxer than another, and one way to apply a
change to a resource's tags, so that the 50-tag limit counts what the resource will
hold and not only what one request brings.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from roost.domain.errors import InvalidParameterValue, TagLimitExceeded
from roost.gateway.query import Params

MAX_TAGS = 50
RESERVED = "aws:"
"""EC2's own keys (``aws:ec2launchtemplate:id``): callers may not set them, and they do
not count against the limit."""
_CONTROL = re.compile("[\x00-\x1f\x7f]")

Tags = tuple[tuple[str, str], ...]


def _shown(text: str) -> str:
    """``text`` for an error message, its control characters as ``\\xNN``: XML would
    show them as U+FFFD, and the caller could not tell which tag was meant."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text[:128])


def check_tag(key: str, value: str | None, *, stored: bool = True) -> None:
    """EC2's limits on one tag. A tag to be ``stored`` may hold no control character:
    XML cannot carry most of them, so the tag would come back as U+FFFD and could never
    be named again to filter or delete it. DeleteTags (not ``stored``) may name one, to
    remove a tag kept before roost refused them."""
    if not key or len(key) > 128:
        raise InvalidParameterValue("Tag keys must be 1 to 128 characters long.")
    if key.lower().startswith(RESERVED):
        raise InvalidParameterValue("Tag keys starting with 'aws:' are reserved for internal use")
    if value is not None and len(value) > 256:
        raise InvalidParameterValue("Tag values may be at most 256 characters long.")
    if not stored:
        return
    if _CONTROL.search(key):
        raise InvalidParameterValue(f"Tag key '{_shown(key)}' holds a control character: "
                                    "tag keys and values may not.")
    if value and _CONTROL.search(value):
        raise InvalidParameterValue(f"The value of tag '{_shown(key)}' holds a control "
                                    "character: tag keys and values may not.")


def tag_list(members: Sequence[Params], *, deleting: bool = False
             ) -> tuple[tuple[str, str | None], ...]:
    """Tag.N of CreateTags or DeleteTags, or of one TagSpecification. A tag to be kept
    gets "" for a missing value, and may not repeat a key (EC2 refuses rather than let
    the last one win); DeleteTags keeps None, "whatever the value"."""
    if len(members) > MAX_TAGS:
        raise TagLimitExceeded(f"The maximum number of tags per resource is {MAX_TAGS}.")
    out: list[tuple[str, str | None]] = []
    seen: set[str] = set()
    for t in members:
        key, value = t.require("Key"), t.get("Value")
        check_tag(key, value, stored=not deleting)
        if not deleting:
            if key in seen:
                raise InvalidParameterValue(f"Duplicate tag key '{_shown(key)}' specified.")
            seen.add(key)
            value = value or ""
        out.append((key, value))
    return tuple(out)


def specified(p: Params, kinds: Sequence[str], *, default: str = "",
              elsewhere: Sequence[str] = ()) -> dict[str, Tags]:
    """TagSpecification.N by resource type, one entry for each of ``kinds``. Another
    type is refused, as EC2 refuses it, rather than dropped: ``elsewhere`` are the types
    EC2 tags in this action and roost does not, refused saying so. ``default``: the type
    of an entry that names none ("": it must name one)."""
    out: dict[str, dict[str, str]] = {k: {} for k in kinds}
    for spec in p.members("TagSpecification"):
        kind = spec.get("ResourceType") or default or spec.require("ResourceType")
        if kind in elsewhere:
            raise InvalidParameterValue(
                f"roost cannot tag '{kind}' resources here, only: {', '.join(kinds)}.")
        found = out.get(kind)
        if found is None:
            raise InvalidParameterValue(
                f"'{_shown(kind[:80])}' is not a valid taggable resource type for this "
                "operation.")
        for key, value in tag_list(spec.members("Tag")):
            if key in found:
                raise InvalidParameterValue(f"Duplicate tag key '{_shown(key)}' specified.")
            found[key] = value or ""
        if len(found) > MAX_TAGS:
            raise TagLimitExceeded(f"The maximum number of tags per resource is {MAX_TAGS}.")
    return {k: tuple(v.items()) for k, v in out.items()}


def counted(tags: Mapping[str, str]) -> int:
    """The tags that count against the limit: EC2's own do not."""
    return sum(1 for k in tags if not k.lower().startswith(RESERVED))


def changed(resource_id: str, current: Mapping[str, str],
            change: Mapping[str, str | None], *, delete: bool) -> dict[str, str]:
    """``current`` after a CreateTags (``delete`` False) or DeleteTags.

    DeleteTags naming no key removes every tag; a value of None removes the key whatever
    its value, a value only if it matches, as EC2 does. CreateTags may not leave more
    than `MAX_TAGS`: keys already there only overwrite, so the resource's tags plus the
    new keys are counted. Called inside the compare-and-set loop that writes the result,
    so a racing call is counted too (its write makes this one retry from the new tags).
    A resource already over the limit (tagged before roost counted) may still be
    overwritten, not grown."""
    tags = {} if delete and not change else dict(current)
    for key, value in change.items():
        if not delete:
            tags[key] = value or ""
        elif key in tags and (value is None or tags[key] == value):
            del tags[key]
    after = counted(tags)
    if not delete and after > MAX_TAGS and after > counted(current):
        raise TagLimitExceeded(
            f"The maximum number of tags per resource is {MAX_TAGS}: {resource_id} has "
            f"{counted(current)} and the request adds {after - counted(current)}.")
    return tags
