"""The task state table and the worker's backoff: pure data and arithmetic."""

from __future__ import annotations

import pytest

from roost.store.tasks import TRANSITIONS, TaskStatus
from roost.worker import WorkerConfig, instance_ref_from_env, retry_delay


def test_the_state_table_covers_every_status_and_final_states_are_final() -> None:
    assert set(TRANSITIONS) == set(TaskStatus)
    assert TRANSITIONS[TaskStatus.DONE] == TRANSITIONS[TaskStatus.FAILED] == frozenset()
    assert TRANSITIONS[TaskStatus.QUEUED] == {TaskStatus.RUNNING}  # only a claim starts work
    reachable = {TaskStatus.QUEUED}
    for _ in TaskStatus:
        reachable |= {b for a in reachable for b in TRANSITIONS[a]}
    assert reachable == set(TaskStatus)


@pytest.mark.parametrize(("attempt", "want"), [(0, 0.0), (1, 2.0), (2, 4.0), (3, 8.0),
                                               (4, 10.0), (100, 10.0)])
def test_retry_backoff_doubles_up_to_the_cap(attempt: int, want: float) -> None:
    assert retry_delay(attempt, base=2.0, cap=10.0) == want


def test_identity_and_config() -> None:
    assert instance_ref_from_env({"ROOST_INSTANCE_ID": "i-1", "POD_NAME": "p"}) == "i-1"
    assert instance_ref_from_env({"POD_NAME": "web-7f9c"}) == "web-7f9c"
    assert instance_ref_from_env({}) == ""
    c = WorkerConfig(dsn="x", pool="p", lease=9, instance_ref="i-1").validate()
    assert c.heartbeat_interval == 3 and c.worker_id.startswith("i-1-")
    for bad in ({"concurrency": 0}, {"concurrency": 2**31}, {"lease": 0},
                {"heartbeat_interval": 30}, {"db_pool_size": 0},
                {"retry_backoff": 5, "retry_backoff_max": 1}):
        with pytest.raises(ValueError):
            WorkerConfig(dsn="x", pool="p", **bad).validate()  # type: ignore[arg-type]
