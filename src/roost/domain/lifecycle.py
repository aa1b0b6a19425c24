"""The instance lifecycle, held as data: EC2's six states and the moves between them."""

from __future__ import annotations

import enum
from collections.abc import Mapping


class InstanceState(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    SHUTTING_DOWN = "shutting-down"
    TERMINATED = "terminated"

    @property
    def code(self) -> int:
        """EC2's numeric state code (the low byte of ``InstanceState.Code``)."""
        return _CODES[self]

    @property
    def holds_capacity(self) -> bool:
        """Whether an instance in this state counts against its node's ledger.

        A stopped instance gives its resources back, as on EC2, so starting it again
        can meet InsufficientInstanceCapacity.
        """
        return self in (InstanceState.PENDING, InstanceState.RUNNING, InstanceState.STOPPING,
                        InstanceState.SHUTTING_DOWN)


_CODES = {
    InstanceState.PENDING: 0,
    InstanceState.RUNNING: 16,
    InstanceState.SHUTTING_DOWN: 32,
    InstanceState.TERMINATED: 48,
    InstanceState.STOPPING: 64,
    InstanceState.STOPPED: 80,
}

S = InstanceState
TRANSITIONS: Mapping[InstanceState, frozenset[InstanceState]] = {
    S.PENDING: frozenset({
        S.RUNNING,        # the driver started the instance
        S.SHUTTING_DOWN,  # terminated while still starting (e.g. a rolled-back launch)
        S.STOPPED,        # the process exited before it was reported running
    }),
    S.RUNNING: frozenset({
        S.STOPPING,       # StopInstances
        S.SHUTTING_DOWN,  # TerminateInstances
        S.STOPPED,        # the instance shut itself down (its process exited), EC2's default
    }),
    S.STOPPING: frozenset({
        S.STOPPED,        # the driver confirmed the stop
        S.SHUTTING_DOWN,  # TerminateInstances while stopping
    }),
    S.STOPPED: frozenset({
        S.PENDING,        # StartInstances
        S.SHUTTING_DOWN,  # TerminateInstances
    }),
    S.SHUTTING_DOWN: frozenset({
        S.TERMINATED,     # the driver confirmed the kill
    }),
    S.TERMINATED: frozenset(),  # final; the record is kept for describe, then expires
}


class IllegalTransition(ValueError):
    def __init__(self, current: InstanceState, target: InstanceState) -> None:
        super().__init__(f"cannot move an instance from {current} to {target}")
        self.current = current
        self.target = target


def check_transition(current: InstanceState, target: InstanceState) -> None:
    """Raise `IllegalTransition` unless ``current -> target`` is an edge of the table."""
    if target not in TRANSITIONS[current]:
        raise IllegalTransition(current, target)
