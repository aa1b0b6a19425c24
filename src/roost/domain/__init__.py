"""Pure data and rules: resources, the instance-type catalog, lifecycle and errors.

Nothing here does I/O, reads the clock or imports asyncio; `decide/` and every service
build on it.
"""
