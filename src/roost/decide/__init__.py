"""Pure decisions: placement policies and the capacity plan. No asyncio, no I/O, no clock:
callers pass in snapshots and ``now``."""
