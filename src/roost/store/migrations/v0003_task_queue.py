"""The task queue proper: payloads, idempotency keys, leases, execution tokens, attempts
and backoff, on top of the minimal ``tasks`` table of v0002.

A claim sets ``status = 'running'``, a fresh ``token`` and ``lease_expires_at``; only
that token can settle the task (see `roost.store.tasks`). The token is kept after a
settle so a worker that lost the reply to its own commit can ask again and be told it
went through. The ``pool_queue`` view is unchanged: 'queued' and 'running' keep their
meaning (a task waiting out its backoff is queued; one whose lease has expired is
running until it is reaped).
"""

SQL = """
ALTER TABLE tasks
    ADD COLUMN payload          jsonb   NOT NULL DEFAULT 'null',
    ADD COLUMN idempotency_key  text    CHECK (length(idempotency_key) BETWEEN 1 AND 200),
    ADD COLUMN result           jsonb,
    ADD COLUMN error            text,
    ADD COLUMN attempts         integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    ADD COLUMN max_attempts     integer NOT NULL DEFAULT 3 CHECK (max_attempts >= 1),
    ADD COLUMN run_after        timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN lease_expires_at timestamptz,
    ADD COLUMN token            uuid,
    ADD COLUMN updated_at       timestamptz NOT NULL DEFAULT now(),
    ADD CONSTRAINT tasks_idempotency_key UNIQUE (pool_id, idempotency_key);

-- The claim: the oldest ready task of a pool.
CREATE INDEX tasks_claimable ON tasks (pool_id, id) WHERE status = 'queued';
-- The reaper: running tasks by lease expiry.
CREATE INDEX tasks_leases ON tasks (pool_id, lease_expires_at) WHERE status = 'running';
-- A worker's held tasks (its heartbeat counts them).
CREATE INDEX tasks_worker_running ON tasks (worker_id) WHERE status = 'running';
-- Per-pool totals for the task API.
CREATE INDEX tasks_pool_status ON tasks (pool_id, status);
"""
