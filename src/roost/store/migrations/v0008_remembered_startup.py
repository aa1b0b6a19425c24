"""A pool's replica start-up time as the leader last estimated it, published with the
pool's desired capacity, and the pool's ``expected_revision`` then: a new leader starts
from it instead of the 30 s default (docs/architecture.md, "What a new leader
remembers"). Nullable columns with no default rewrite nothing.
"""

SQL = """
ALTER TABLE desired_capacity
    ADD COLUMN startup_seconds double precision CHECK (startup_seconds >= 0),
    ADD COLUMN startup_revision text;
"""
