"""Accounts, access keys and quotas as data, and the quota decision.

An account is a 12-digit id, like AWS's; everything one of its keys creates carries it
as ``OwnerId``. A key is an access key id, its secret (stored encrypted, see
`roost.gateway.accounts`), the account it acts for and whether it is an operator's
(``admin``: sees and changes every account's resources).

Quotas follow EC2's On-Demand classes: vCPUs of running instances per class (the
standard class is A, C, D, H, I, M, R, T and Z families; G and VT; P; then F, X, Inf, DL,
Trn and the high-memory U family each on their own, and "other" for families EC2 has
no class for), whole-GPU thousandths, and the instance count. A limit of None is
unlimited. Usage is what the account holds now: one entry per live instance, and one
hold per launch in flight (`Usage.holds`), so a launch reserves before it places and a
crash between the two is forgotten after `HOLD_TTL`.
"""

from __future__ import annotations

import re

import msgspec

from roost.domain.catalog import InstanceType
from roost.domain.errors import InstanceLimitExceeded, VcpuLimitExceeded

DEFAULT_ACCOUNT = "000000000000"
"""The account of keys given with ``--credentials`` and of instances from before
accounts existed (their records carry no owner)."""
HOLD_TTL = 600.0
"""Seconds after which a launch's hold that never became instances is dropped (its
gateway died mid-launch); longer than any launch may take."""

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


class Usage(msgspec.Struct, frozen=True):
    instances: dict[str, Held] = {}
    holds: dict[str, Held] = {}
    """Launch (reservation) id -> what it reserved before placing."""

    def live_holds(self, now: float) -> dict[str, Held]:
        return {k: h for k, h in self.holds.items() if now - h.at < HOLD_TTL}

    def totals(self, now: float) -> Held:
        """Everything held, as one `Held` per class folded into vCPUs by class."""
        every = [*self.instances.values(), *self.live_holds(now).values()]
        return Held("", sum(h.vcpus for h in every), sum(h.gpus_milli for h in every),
                    sum(h.instances for h in every))

    def vcpus_by_class(self, now: float) -> dict[str, int]:
        out: dict[str, int] = {}
        for h in [*self.instances.values(), *self.live_holds(now).values()]:
            out[h.cls] = out.get(h.cls, 0) + h.vcpus
        return out


def demand(itype: InstanceType, count: int, now: float) -> Held:
    """What ``count`` instances of ``itype`` hold of a quota."""
    return Held(quota_class(itype.name), itype.vcpus * count, itype.gpu_total_milli * count,
                count, now)


def check(quotas: Quotas, usage: Usage, want: Held, now: float) -> None:
    """Raise EC2's limit error if ``want`` on top of ``usage`` exceeds ``quotas``."""
    vcpu_limit = quotas.vcpus.get(want.cls)
    if vcpu_limit is not None and want.vcpus and (
            usage.vcpus_by_class(now).get(want.cls, 0) + want.vcpus > vcpu_limit):
        raise VcpuLimitExceeded(
            f"You have requested more vCPU capacity than your current vCPU limit of "
            f"{vcpu_limit} allows for the instance bucket that the specified instance type "
            "belongs to. Please visit http://aws.amazon.com/contact-us/ec2-request to "
            "request an adjustment to this limit.")
    held = usage.totals(now)
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
