"""Per-pool autoscaling bounds, and the indexes the demand model's rate query uses.

``growth_*`` bound scale-up (at most ``max(growth_replicas, growth_percent %)`` more
replicas per growth period), ``disruption_*`` bound scale-down (drains begun per
disruption period). The checks refuse a pool that could never grow or never shrink.
The two indexes let the controller count a pool's tasks created, and average those
finished, over the last seconds without scanning the whole table.
"""

SQL = """
ALTER TABLE worker_pools
    ADD COLUMN growth_replicas     integer NOT NULL DEFAULT 4 CHECK (growth_replicas >= 1),
    ADD COLUMN growth_percent      integer NOT NULL DEFAULT 100 CHECK (growth_percent >= 0),
    ADD COLUMN disruption_replicas integer NOT NULL DEFAULT 2
                                   CHECK (disruption_replicas >= 1),
    ADD COLUMN disruption_percent  integer NOT NULL DEFAULT 20
                                   CHECK (disruption_percent BETWEEN 0 AND 100);

CREATE INDEX tasks_pool_created ON tasks (pool_id, created_at);
CREATE INDEX tasks_pool_finished ON tasks (pool_id, finished_at) WHERE finished_at IS NOT NULL;
"""
