"""Every allowed and every forbidden move of the instance lifecycle table."""

from __future__ import annotations

import itertools

import pytest

from roost.domain.lifecycle import TRANSITIONS, IllegalTransition, InstanceState, check_transition

S = InstanceState
ALLOWED = {
    (S.PENDING, S.RUNNING), (S.PENDING, S.SHUTTING_DOWN), (S.PENDING, S.STOPPED),
    (S.RUNNING, S.STOPPING), (S.RUNNING, S.SHUTTING_DOWN), (S.RUNNING, S.STOPPED),
    (S.STOPPING, S.STOPPED), (S.STOPPING, S.SHUTTING_DOWN),
    (S.STOPPED, S.PENDING), (S.STOPPED, S.SHUTTING_DOWN),
    (S.SHUTTING_DOWN, S.TERMINATED),
}
ALL_PAIRS = list(itertools.product(S, S))


def test_table_is_exactly_the_allowed_set() -> None:
    assert {(a, b) for a, nxt in TRANSITIONS.items() for b in nxt} == ALLOWED


@pytest.mark.parametrize(("a", "b"), sorted(ALLOWED))
def test_allowed(a: InstanceState, b: InstanceState) -> None:
    check_transition(a, b)


@pytest.mark.parametrize(("a", "b"), [p for p in ALL_PAIRS if p not in ALLOWED])
def test_forbidden(a: InstanceState, b: InstanceState) -> None:
    with pytest.raises(IllegalTransition):
        check_transition(a, b)


def test_ec2_state_codes_and_capacity() -> None:
    assert [s.code for s in S] == [0, 16, 64, 80, 32, 48]
    assert {s for s in S if s.holds_capacity} == {S.PENDING, S.RUNNING, S.STOPPING,
                                                 S.SHUTTING_DOWN}
