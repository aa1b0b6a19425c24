"""The worker runtime library: register, heartbeat, leases and drain."""
