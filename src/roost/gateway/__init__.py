"""The EC2 Query API gateway: protocol, SigV4, actions, live capacity view and launch
orchestration.

The public surface is `Gateway` and `GatewayConfig` (run one inside any asyncio
program), `SigV4Verifier`, and `ACTIONS` (the EC2 actions served). How the modules
divide the work:

  query, requests   the wire form and typed requests (what a well-formed call is)
  service, reads    the model: launches, commands, tags; the Describe* reads
  render, xml       EC2's response and error XML
  sigv4             signature verification
  capacity, launch  the live capacity view; placement with failover and anycast
  nodes             the node contract over NATS
  index, tokens     the instance mirror, tags and user data; ClientToken idempotency
  app, admin        the ASGI app, /api/v1, /healthz, /metrics
  server, cli       the service's lifecycle; ``roost gateway`` and ``roost status``
"""

from roost.gateway.actions import ACTIONS
from roost.gateway.server import Gateway, GatewayConfig
from roost.gateway.sigv4 import SigV4Verifier

__all__ = ["ACTIONS", "Gateway", "GatewayConfig", "SigV4Verifier"]
