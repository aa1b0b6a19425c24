"""The store's error tree.

StoreError
 ├── PoolNotFound     no pool with that id
 ├── PoolExists       create of an id already taken
 ├── PoolBusy         delete of a pool with live workers or open tasks (use force)
 ├── InvalidPool      a value the schema's constraints reject (min > max, bad id, ...)
 └── StaleEpoch       a fenced write by a leader whose epoch has moved on: it is deposed
                      and must abort its tick
"""

from __future__ import annotations


class StoreError(Exception):
    pass


class PoolNotFound(StoreError):
    def __init__(self, pool_id: str) -> None:
        super().__init__(f"no worker pool {pool_id!r}")
        self.pool_id = pool_id


class PoolExists(StoreError):
    def __init__(self, pool_id: str) -> None:
        super().__init__(f"worker pool {pool_id!r} already exists")
        self.pool_id = pool_id


class PoolBusy(StoreError):
    pass


class InvalidPool(StoreError):
    pass


class StaleEpoch(StoreError):
    def __init__(self, ours: int, current: int | None) -> None:
        super().__init__(f"leader epoch {ours} is stale (the lease is at {current})")
        self.ours = ours
        self.current = current
