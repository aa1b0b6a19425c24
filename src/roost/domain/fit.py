"""Whether an instance type fits a node's free resources, and on which GPU devices.

This is the one fit rule in roost: the node ledger commits with it and every placement
policy in `decide/` scores with it, so a placement the gateway picks is one the node
will accept (races aside).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from roost.domain.catalog import InstanceType
from roost.domain.resources import GPU_MILLI, Resources

GpuAssignment = tuple[tuple[int, int], ...]
"""``((device_index, milli), ...)``: what an instance holds on each GPU."""


@dataclass(frozen=True, slots=True)
class FreeCapacity:
    """What a node has free: CPU/memory plus free milli and model per GPU device."""

    resources: Resources
    gpu_free: tuple[int, ...] = ()
    gpu_models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.gpu_free) != len(self.gpu_models):
            raise ValueError("gpu_free and gpu_models must have one entry per device")


def _model_ok(cap: FreeCapacity, i: int, itype: InstanceType) -> bool:
    """Device ``i`` is of a model ``itype`` accepts (any, when it names none)."""
    return itype.accepts_model(cap.gpu_models[i])


def assign_gpus(cap: FreeCapacity, itype: InstanceType) -> GpuAssignment | None:
    """Pick devices for ``itype``, or None when its GPU ask can't be met.

    Whole GPUs take fully free devices, lowest index first. A fraction goes best-fit:
    the device with the least free milli that still holds it, so that whole devices
    stay whole for whole-GPU types.
    """
    if itype.gpu_count:
        whole = [
            i for i, f in enumerate(cap.gpu_free) if f == GPU_MILLI and _model_ok(cap, i, itype)
        ]
        if len(whole) < itype.gpu_count:
            return None
        return tuple((i, GPU_MILLI) for i in whole[: itype.gpu_count])
    if itype.gpu_milli:
        candidates = [
            (f, i)
            for i, f in enumerate(cap.gpu_free)
            if f >= itype.gpu_milli and _model_ok(cap, i, itype)
        ]
        if not candidates:
            return None
        _, best = min(candidates)
        return ((best, itype.gpu_milli),)
    return ()


def assignment_on(
    cap: FreeCapacity, itype: InstanceType, devices: Sequence[int]
) -> GpuAssignment | None:
    """``itype``'s GPU ask met on exactly ``devices`` (as a placement chose them), or None
    if those devices can't hold it now: wrong count, repeated, out of range, wrong model,
    or too little free milli."""
    want = itype.gpu_count or (1 if itype.gpu_milli else 0)
    milli = GPU_MILLI if itype.gpu_count else itype.gpu_milli
    if len(devices) != want or len(set(devices)) != want:
        return None
    for i in devices:
        if not 0 <= i < len(cap.gpu_free) or cap.gpu_free[i] < milli:
            return None
        if not _model_ok(cap, i, itype):
            return None
    return tuple((i, milli) for i in devices)


def gpu_choices(cap: FreeCapacity, itype: InstanceType) -> list[GpuAssignment]:
    """Every materially different way to meet ``itype``'s GPU ask; empty when none.

    `assign_gpus` picks one of these by a fixed rule (best fit); a placement policy that
    weighs devices itself (FGD chooses the device that fragments least) picks among all
    of them. For whole GPUs, fully free devices of one model are alike: when the type
    accepts several models present on the node, there is one choice per model that
    alone has enough devices (lowest indices of it), else the single lowest-index
    choice `assign_gpus` makes. For a fraction there is one choice per distinct (free
    milli, model) among the devices that hold it, lowest index first; two devices alike
    in both are interchangeable. A type with no GPU ask has the single empty choice.
    """
    if itype.gpu_count:
        return _whole_choices(cap, itype)
    if itype.gpu_milli:
        seen: set[tuple[int, str]] = set()
        out: list[GpuAssignment] = []
        for i, f in enumerate(cap.gpu_free):
            key = (f, cap.gpu_models[i])
            if f >= itype.gpu_milli and _model_ok(cap, i, itype) and key not in seen:
                seen.add(key)
                out.append(((i, itype.gpu_milli),))
        return out
    return [()]


def _whole_choices(cap: FreeCapacity, itype: InstanceType) -> list[GpuAssignment]:
    by_model: dict[str, list[int]] = {}
    for i, f in enumerate(cap.gpu_free):
        if f == GPU_MILLI and _model_ok(cap, i, itype):
            by_model.setdefault(cap.gpu_models[i], []).append(i)
    if len(by_model) > 1:
        out = [tuple((i, GPU_MILLI) for i in devices[: itype.gpu_count])
               for devices in by_model.values() if len(devices) >= itype.gpu_count]
        if out:
            return out
    one = assign_gpus(cap, itype)
    return [] if one is None else [one]


def fits(cap: FreeCapacity, itype: InstanceType) -> bool:
    return cap.resources.covers(itype.resources) and assign_gpus(cap, itype) is not None


def fit_count(cap: FreeCapacity, itype: InstanceType) -> int:
    """How many more instances of ``itype`` fit, each placed as `assign_gpus` would."""
    n = min(cap.resources.cpu_milli // itype.cpu_milli, cap.resources.mem_mib // itype.mem_mib)
    if itype.gpu_count:
        whole = sum(
            1 for i, f in enumerate(cap.gpu_free) if f == GPU_MILLI and _model_ok(cap, i, itype)
        )
        n = min(n, whole // itype.gpu_count)
    elif itype.gpu_milli:
        slots = sum(
            f // itype.gpu_milli for i, f in enumerate(cap.gpu_free) if _model_ok(cap, i, itype)
        )
        n = min(n, slots)
    return max(0, n)


def take(cap: FreeCapacity, itype: InstanceType, gpus: GpuAssignment) -> FreeCapacity:
    """``cap`` after committing one ``itype`` on ``gpus``."""
    free = list(cap.gpu_free)
    for i, milli in gpus:
        free[i] -= milli
    return FreeCapacity(cap.resources - itype.resources, tuple(free), cap.gpu_models)


def give(cap: FreeCapacity, itype: InstanceType, gpus: GpuAssignment) -> FreeCapacity:
    """``cap`` after releasing one ``itype`` that held ``gpus``."""
    free = list(cap.gpu_free)
    for i, milli in gpus:
        free[i] += milli
    return FreeCapacity(cap.resources + itype.resources, tuple(free), cap.gpu_models)
