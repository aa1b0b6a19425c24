"""Accounts, access keys and quotas as data, and the quota decision.

An account is a 12-digit id, like AWS's; everything one of its keys creates carries it
as ``OwnerId``. A key is an access key id, its secret (stored encrypted, see
`roost.gateway.accounts`), the account it acts for and whether it is an operator's
(``admin``: sees and changes every account's resources).

Quotas follow EC2's On-Demand classes: vCPUs of running instances per class (the
standard class is A, C, D, H, I, M, R, T and Z families; G and VT; P; then F, X, Inf, DL,
Trn and the high-memory U family each on their own, and "other" for families EC2 has
no class for), whole-GPU thousandths, and the instance count. A limit of None is
unlimited.

What an account uses is counted in two parts (`Usage.counted`):
- its instances in a counted state (`COUNTED_STATES`), summed by each gateway from its
  mirror of the instances bucket (a `Tally` kept as records change, so a check costs
  the same at ten instances or a hundred thousand);
- the account's usage record (`Usage`), which holds only what no mirror may show yet:
  one hold per launch in flight (so a launch reserves before it places, and a crash
  between the two is forgotten after `HOLD_TTL`), and one entry per instance a launch
  or a start settled in the last `RECENT_TTL` seconds, counted only until the checking
  gateway's mirror shows it.
The record therefore grows with the launch rate, not with the instances an account
runs; an instance that stops or ends stops counting as its record says so, with no
write.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import msgspec

from roost.domain.catalog import InstanceType
from roost.domain.errors import InstanceLimitExceeded, VcpuLimitExceeded

DEFAULT_ACCOUNT = "000000000000"
"""The account of keys given with ``--credentials`` and of instances from before
accounts existed (their records carry no owner)."""
HOLD_TTL = 600.0
"""Seconds after which a launch's hold that never became instances is dropped (its
gateway died mid-launch); longer than any launch may take."""
RECENT_TTL = 60.0
"""Seconds a settled launch's or start's entry stays in the usage record: long past any
mirror's lag, after which only the mirrors count the instance."""
MIRRORED_GRACE = 5.0
"""An entry the writing gateway's own mirror already counts is dropped once it is this
old: every other gateway's mirror has then had as long to show the instance too."""
COUNTED_STATES = frozenset({"pending", "running", "shutting-down"})
"""The states in which an instance counts against its account's quotas (EC2's are on
running instances; a stop gives back at once, an instance ending does when it ends)."""

_ACCOUNT_ID = re.compile(r"\d{12}")

# EC2's On-Demand instance quota classes, by the letters a family name starts with.
# Longest prefixes first, so "inf" and "dl" win over "i" and "d".
_CLASS_PREFIXES: tuple[tuple[str, str], ...] = (
    ("trn", "trn"), ("inf", "inf"), ("dl", "dl"), ("vt", "g"), ("u-", "hm"),
    ("a", "standard"), ("c", "standard"), ("d", "standard"), ("h", "standard"),
    ("i", "standard"), ("m", "standard"), ("r", "standard"), ("t", "standard"),
    ("z", "standard"), ("g", "g"), ("p", "p"), ("f", "f"), ("x", "x"),
)
QUOTA_CLASSES = ("standard", "g", "p", "f", "x", "inf", "dl", "trn", "hm", "other")
CLASS_NAMES = {
    "standard": "Standard (A, C, D, H, I, M, R, T, Z)", "g": "G and VT", "p": "P",
    "f": "F", "x": "X", "inf": "Inf", "dl": "DL", "trn": "Trn", "hm": "High Memory (U)",
    "other": "other",
}


def is_account_id(text: str) -> bool:
    return bool(_ACCOUNT_ID.fullmatch(text))


def quota_class(type_name: str) -> str:
    """The On-Demand quota class an instance type's vCPUs count against."""
    family = type_name.split(".", 1)[0].lower()
    for prefix, cls in _CLASS_PREFIXES:
        if family.startswith(prefix):
            return cls
    return "other"


class Quotas(msgspec.Struct, frozen=True, omit_defaults=True):
    vcpus: dict[str, int] = {}
    """Quota class -> the most vCPUs its running instances may have; absent: unlimited."""
    gpus_milli: int | None = None
    instances: int | None = None

    @property
    def limited(self) -> bool:
        """Whether any limit is set: an unlimited account's launches hold nothing."""
        return bool(self.vcpus) or self.gpus_milli is not None or self.instances is not None


class Account(msgspec.Struct, frozen=True):
    account_id: str
    name: str
    created: float
    quotas: Quotas = Quotas()


class StoredKey(msgspec.Struct, frozen=True):
    """An access key as the accounts bucket keeps it: the secret only sealed."""

    access_key_id: str
    account_id: str
    sealed_secret: str
    """base64 of nonce + AES-GCM ciphertext, bound to the access key id."""
    created: float
    admin: bool = False
    expires: float | None = None
    """Wall-clock seconds after which the key stops working (a rotated key's grace)."""


class Held(msgspec.Struct, frozen=True, array_like=True):
    """What one instance or one launch in flight holds of an account's quotas."""

    cls: str
    vcpus: int
    gpus_milli: int
    instances: int
    at: float = 0.0
    starting: bool = False
    """An entry for a stopped instance starting (counted while the mirror still shows
    it stopped), not for a launch (counted until the mirror shows it at all)."""

    def part(self, count: int) -> Held:
        """What ``count`` of the instances this holds for hold (none below 1)."""
        count = max(0, min(count, self.instances))
        if count == self.instances:
            return self
        per = self.instances or 1
        return Held(self.cls, self.vcpus * count // per, self.gpus_milli * count // per,
                    count, self.at, self.starting)


class Tally:
    """Sums of `Held`: vCPUs by quota class, GPU thousandths, instances."""

    __slots__ = ("gpus_milli", "instances", "vcpus")

    def __init__(self) -> None:
        self.vcpus: dict[str, int] = {}
        self.gpus_milli = 0
        self.instances = 0

    def add(self, held: Held, sign: int = 1) -> None:
        self.vcpus[held.cls] = self.vcpus.get(held.cls, 0) + sign * held.vcpus
        if not self.vcpus[held.cls]:
            del self.vcpus[held.cls]
        self.gpus_milli += sign * held.gpus_milli
        self.instances += sign * held.instances

    def copy(self) -> Tally:
        out = Tally()
        out.vcpus, out.gpus_milli, out.instances = dict(self.vcpus), self.gpus_milli, \
            self.instances
        return out


class Usage(msgspec.Struct, frozen=True):
    """An account's usage record: what no gateway's mirror may show yet."""

    instances: dict[str, Held] = {}
    """Instance id -> what a launch or start settled for it recently (`RECENT_TTL`)."""
    holds: dict[str, Held] = {}
    """Launch (reservation) id -> what it reserved before placing."""

    def live_holds(self, now: float) -> dict[str, Held]:
        return {k: h for k, h in self.holds.items() if now - h.at < HOLD_TTL}

    def counted(self, now: float, mirrored: Tally, state_of: Callable[[str], str | None],
                launched: Callable[[str], int]) -> Tally:
        """Everything the account holds: ``mirrored`` (its instances in the checking
        gateway's mirror, `COUNTED_STATES` only), its live holds less the instances of
        each that the mirror already shows (``launched``: how many of a reservation
        it holds), and each recent entry the mirror does not count yet (``state_of``:
        its state of an instance, None without a record)."""
        out = mirrored.copy()
        for rid, held in self.live_holds(now).items():
            out.add(held.part(held.instances - launched(rid)))
        for iid, held in self.instances.items():
            if now - held.at < RECENT_TTL and not _shown(held, state_of(iid)):
                out.add(held)
        return out

    def pruned(self, now: float, state_of: Callable[[str], str | None]) -> Usage:
        """Without lapsed holds, entries past `RECENT_TTL`, and entries this mirror has
        counted for `MIRRORED_GRACE` (a record dropped of those stays small however
        many instances the account runs)."""
        return Usage({i: h for i, h in self.instances.items()
                      if now - h.at < RECENT_TTL
                      and (now - h.at < MIRRORED_GRACE or not _shown(h, state_of(i)))},
                     self.live_holds(now))


def _shown(held: Held, state: str | None) -> bool:
    """Whether a mirror holding ``state`` for an entry's instance already counts it
    (or knows it to be over): any record does for a launch's entry; for a start's, one
    that has left the stopped states."""
    if state is None:
        return False
    return not held.starting or state not in ("stopping", "stopped")


def demand(itype: InstanceType, count: int, now: float) -> Held:
    """What ``count`` instances of ``itype`` hold of a quota."""
    return Held(quota_class(itype.name), itype.vcpus * count, itype.gpu_total_milli * count,
                count, now)


def check(quotas: Quotas, held: Tally, want: Held) -> None:
    """Raise EC2's limit error if ``want`` on top of what is ``held`` exceeds
    ``quotas``."""
    vcpu_limit = quotas.vcpus.get(want.cls)
    if vcpu_limit is not None and want.vcpus and (
            held.vcpus.get(want.cls, 0) + want.vcpus > vcpu_limit):
        raise VcpuLimitExceeded(
            f"You have requested more vCPU capacity than your current vCPU limit of "
            f"{vcpu_limit} allows for the instance bucket that the specified instance type "
            "belongs to. Please visit http://aws.amazon.com/contact-us/ec2-request to "
            "request an adjustment to this limit.")
    if quotas.instances is not None and held.instances + want.instances > quotas.instances:
        raise InstanceLimitExceeded(
            f"Your quota allows for {max(0, quotas.instances - held.instances)} more running "
            f"instance(s). You requested at least {want.instances}.")
    if (quotas.gpus_milli is not None and want.gpus_milli
            and held.gpus_milli + want.gpus_milli > quotas.gpus_milli):
        raise VcpuLimitExceeded(
            f"You have requested more GPU capacity than your current GPU limit of "
            f"{quotas.gpus_milli / 1000:g} allows. Please ask the operator of this roost "
            "to adjust this limit.")
