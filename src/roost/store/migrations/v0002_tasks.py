"""A minimal task table and the per-pool queue view the controller reads demand from.

The worker runtime (issue 5) completes the table (leases, execution tokens, attempts)
in later migrations; the controller depends only on ``pool_id`` and ``status`` and on
the ``pool_queue`` view, so new columns and statuses leave it unaffected as long as
'queued' and 'running' keep their meaning.
"""

SQL = """
CREATE TABLE tasks (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pool_id     text NOT NULL REFERENCES worker_pools (id) ON DELETE CASCADE,
    status      text NOT NULL DEFAULT 'queued'
                CHECK (status IN ('queued', 'running', 'done', 'failed')),
    worker_id   text REFERENCES workers (id) ON DELETE SET NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    started_at  timestamptz,
    finished_at timestamptz
);
CREATE INDEX tasks_open ON tasks (pool_id, status) WHERE status IN ('queued', 'running');

CREATE VIEW pool_queue AS
SELECT p.id AS pool_id,
       count(t.id) FILTER (WHERE t.status = 'queued')        AS queued,
       count(t.id) FILTER (WHERE t.status = 'running')       AS running,
       min(t.created_at) FILTER (WHERE t.status = 'queued')  AS oldest_queued_at
FROM worker_pools p
LEFT JOIN tasks t ON t.pool_id = p.id AND t.status IN ('queued', 'running')
GROUP BY p.id;
"""
