"""Access control: a random public id per task and bearer tokens for the task API,
scoped to a pool (or to every pool, for operators); and the instances of native pools
that have exchanged their enrollment token for a database credential (one each).

``public_id`` is what the API shows and takes (``t-`` and 32 hex digits from
``gen_random_uuid``); the sequential ``id`` stays internal, so ids cannot be enumerated.
A token is stored as the SHA-256 of its text only: tokens are 256 random bits, so a
plain hash needs no salt or stretching, and a database dump yields no usable token.

Adding ``public_id`` with a volatile default rewrites ``tasks`` once, under an exclusive
lock: on a large queue, run ``roost db migrate`` in a quiet moment.
"""

SQL = """
ALTER TABLE tasks
    ADD COLUMN public_id text NOT NULL UNIQUE
        DEFAULT ('t-' || replace(gen_random_uuid()::text, '-', ''));

CREATE TABLE api_tokens (
    name        text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9._-]{1,64}$'),
    token_hash  text NOT NULL UNIQUE,
    pool_id     text REFERENCES worker_pools (id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL DEFAULT now()
);
COMMENT ON COLUMN api_tokens.pool_id IS 'NULL: every pool (an operator token)';

CREATE TABLE worker_enrollments (
    instance_id text PRIMARY KEY,
    pool_id     text NOT NULL REFERENCES worker_pools (id) ON DELETE CASCADE,
    enrolled_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX worker_enrollments_age ON worker_enrollments (enrolled_at);
"""
