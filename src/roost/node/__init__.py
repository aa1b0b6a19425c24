"""The node agent: the authoritative ledger, capacity-gated subscriptions, instance drivers
and local state."""
