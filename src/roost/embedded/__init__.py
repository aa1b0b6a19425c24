"""Real nats-server and Postgres processes, started from their pip wheels.

`roost up` and the test fixtures both use these. Each server gets free loopback ports,
its own directory, a readiness wait, and is stopped by its own pid, never by name.
"""

from roost.embedded.nats import NatsCluster, NatsServer
from roost.embedded.postgres import PostgresServer
from roost.embedded.proc import EmbeddedError

__all__ = ["EmbeddedError", "NatsCluster", "NatsServer", "PostgresServer"]
