"""The tasks a worker runs at once (its concurrency), as it registered: the plan reads
it to count the queue a pool's target allows (docs/autoscaling.md, "carried"). Null for
a worker that registered before the column; a nullable column with no default rewrites
nothing.
"""

SQL = """
ALTER TABLE workers ADD COLUMN slots integer CHECK (slots >= 1);
"""
