"""Worker pools, workers, published desired capacity and the controller's leader lease.

``workers`` is shared with the worker runtime (issue 5): the runtime writes heartbeats,
running tasks, leases and revision; the controller writes only ``status``,
``draining_since`` and ``removal_target``, always fenced by the leader epoch.
"""

SQL = """
CREATE TABLE worker_pools (
    id                  text PRIMARY KEY
                        CHECK (id ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
    min_replicas        integer NOT NULL DEFAULT 0 CHECK (min_replicas >= 0),
    max_replicas        integer NOT NULL CHECK (max_replicas >= min_replicas),
    target_per_replica  integer NOT NULL CHECK (target_per_replica > 0),
    worker_cpu_milli    integer NOT NULL CHECK (worker_cpu_milli > 0),
    worker_mem_mib      integer NOT NULL CHECK (worker_mem_mib > 0),
    worker_db_pool_size integer NOT NULL CHECK (worker_db_pool_size >= 0),
    expected_revision   text    NOT NULL DEFAULT '',
    orchestrator        text    NOT NULL,
    orchestrator_ref    text    NOT NULL DEFAULT '',
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE workers (
    id             text PRIMARY KEY,
    pool_id        text NOT NULL REFERENCES worker_pools (id) ON DELETE CASCADE,
    status         text NOT NULL DEFAULT 'active'
                   CHECK (status IN ('active', 'draining', 'gone')),
    running_tasks  integer NOT NULL DEFAULT 0 CHECK (running_tasks >= 0),
    active_leases  integer NOT NULL DEFAULT 0 CHECK (active_leases >= 0),
    revision       text NOT NULL DEFAULT '',
    instance_ref   text NOT NULL DEFAULT '',
    heartbeat_at   timestamptz NOT NULL DEFAULT now(),
    draining_since timestamptz,
    removal_target integer CHECK (removal_target >= 0),
    status_epoch   bigint,
    registered_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX workers_live ON workers (pool_id) WHERE status <> 'gone';

CREATE TABLE desired_capacity (
    pool_id       text PRIMARY KEY REFERENCES worker_pools (id) ON DELETE CASCADE,
    desired       integer,
    current       integer,
    raw_desired   integer,
    reason        text NOT NULL DEFAULT '',
    frozen_reason text,
    valid_until   timestamptz NOT NULL,
    leader_epoch  bigint NOT NULL,
    published_at  timestamptz NOT NULL
);

CREATE TABLE leader_lease (
    name        text PRIMARY KEY,
    epoch       bigint NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    holder      text NOT NULL DEFAULT '',
    acquired_at timestamptz
);
"""
