"""Every lifecycle command against every state, and what protection refuses."""

from __future__ import annotations

import pytest

from roost.domain.commands import ALLOWED, Protection, instance_shutdown, refusal
from roost.domain.lifecycle import InstanceState

S = InstanceState
NONE = Protection()
IID = "i-0123456789abcdef0"


@pytest.mark.parametrize("op", sorted(ALLOWED))
@pytest.mark.parametrize("state", list(S))
def test_every_op_in_every_state(op: str, state: InstanceState) -> None:
    got = refusal(op, IID, state, NONE)
    if state in ALLOWED[op]:
        assert got is None
    else:
        assert got is not None and got[0] == "IncorrectInstanceState"
        assert IID in got[1] and op in got[1]


def test_the_table_is_ec2s() -> None:
    assert ALLOWED["reboot"] == {S.RUNNING}
    assert S.STOPPING not in ALLOWED["start"] and S.TERMINATED in ALLOWED["terminate"]
    assert S.SHUTTING_DOWN not in ALLOWED["stop"] | ALLOWED["modify"]


def test_termination_protection() -> None:
    guarded = Protection(disable_api_termination=True)
    code, message = refusal("terminate", IID, S.RUNNING, guarded) or ("", "")
    assert code == "OperationNotPermitted"
    assert message == (f"The instance '{IID}' may not be terminated. Modify its "
                       "'disableApiTermination' instance attribute and try again.")
    assert refusal("terminate", IID, S.STOPPED, guarded) is not None
    assert refusal("terminate", IID, S.RUNNING, guarded, rollback=True) is None
    assert refusal("terminate", IID, S.TERMINATED, guarded) is None  # already gone
    assert refusal("stop", IID, S.RUNNING, guarded) is None


def test_stop_protection_holds_even_for_a_forced_stop() -> None:
    guarded = Protection(disable_api_stop=True)
    got = refusal("stop", IID, S.RUNNING, guarded, rollback=True)
    assert got is not None and "disableApiStop" in got[1]
    assert refusal("terminate", IID, S.RUNNING, guarded) is None


def test_type_and_user_data_change_only_while_stopped() -> None:
    for state in (S.PENDING, S.RUNNING, S.STOPPING):
        got = refusal("modify", IID, state, NONE, changes_type_or_data=True)
        assert got == ("IncorrectInstanceState",
                       f"The instance '{IID}' is not in the 'stopped' state.")
        assert refusal("modify", IID, state, NONE) is None  # protection, options: any time
    assert refusal("modify", IID, S.STOPPED, NONE, changes_type_or_data=True) is None


@pytest.mark.parametrize(("behavior", "states"), [
    ("stop", (S.STOPPED,)), ("terminate", (S.SHUTTING_DOWN, S.TERMINATED))])
def test_instance_initiated_shutdown(behavior: str, states: tuple[InstanceState, ...]) -> None:
    out = instance_shutdown(behavior=behavior, exit_code=3, oom_limit_mib=None)
    assert out.states == states and out.reason == "Client.InstanceInitiatedShutdown"
    assert out.note == "process exited with 3"
    oom = instance_shutdown(behavior=behavior, exit_code=-9, oom_limit_mib=1024)
    assert oom.reason == "Server.OutOfMemory" and "1024 MiB" in oom.note
