"""Which lifecycle command an instance accepts in which state, held as data, and the
refusals EC2 gives for the rest. Pure: the node agent asks `refusal` before it acts.

A refusal is (EC2 error code, message); None means the command may go ahead (which
for some states means "nothing to do", e.g. stopping a stopped instance).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from roost.domain.lifecycle import InstanceState

S = InstanceState

ALLOWED: Mapping[str, frozenset[InstanceState]] = {
    # terminate: from anywhere; terminating a terminated instance answers as EC2 does
    "terminate": frozenset(S),
    # stop: not once it is going away; stopping a stopped instance is a no-op
    "stop": frozenset({S.PENDING, S.RUNNING, S.STOPPING, S.STOPPED}),
    # start: a stopped instance; a running or pending one is a no-op
    "start": frozenset({S.PENDING, S.RUNNING, S.STOPPED}),
    # reboot: only a running instance restarts its program in place
    "reboot": frozenset({S.RUNNING}),
    # modify: anything but an instance that is going or gone
    "modify": frozenset({S.PENDING, S.RUNNING, S.STOPPING, S.STOPPED}),
}

Refusal = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Protection:
    disable_api_termination: bool = False
    disable_api_stop: bool = False


def refusal(op: str, instance_id: str, state: InstanceState, protection: Protection, *,
            rollback: bool = False, changes_type_or_data: bool = False) -> Refusal | None:
    """Why ``op`` may not run on an instance in ``state``, or None. ``rollback`` is the
    gateway undoing its own launch (MinCount not met): it alone lifts termination
    protection."""
    allowed = ALLOWED.get(op)
    if allowed is not None and state not in allowed:
        return ("IncorrectInstanceState",
                f"cannot {op} instance {instance_id} while it is {state}")
    going = state in (S.SHUTTING_DOWN, S.TERMINATED)
    if op == "terminate" and protection.disable_api_termination and not rollback and not going:
        return _not_permitted(instance_id, "terminated", "disableApiTermination")
    if op == "stop" and protection.disable_api_stop:
        return _not_permitted(instance_id, "stopped", "disableApiStop")
    if op == "modify" and changes_type_or_data and state is not S.STOPPED:
        return ("IncorrectInstanceState",
                f"The instance '{instance_id}' is not in the 'stopped' state.")
    return None


def _not_permitted(instance_id: str, verb: str, attribute: str) -> Refusal:
    return ("OperationNotPermitted",
            f"The instance '{instance_id}' may not be {verb}. Modify its '{attribute}' "
            "instance attribute and try again.")


@dataclass(frozen=True, slots=True)
class ShutdownOutcome:
    """What an instance-initiated shutdown does: the states it moves through, why."""

    states: tuple[InstanceState, ...]
    reason: str
    note: str


def instance_shutdown(*, behavior: str, exit_code: int | None,
                      oom_limit_mib: int | None) -> ShutdownOutcome:
    """The instance's program ended by itself (or its memory limit ended it): it stops,
    or terminates, as its shutdown behaviour says."""
    if oom_limit_mib is not None:
        reason = "Server.OutOfMemory"
        note = (f"killed by its memory limit of {oom_limit_mib} MiB (out of memory); "
                f"exit code {exit_code}")
    else:
        reason = "Client.InstanceInitiatedShutdown"
        note = f"process exited with {exit_code}"
    states = (S.SHUTTING_DOWN, S.TERMINATED) if behavior == "terminate" else (S.STOPPED,)
    return ShutdownOutcome(states, reason, note)
