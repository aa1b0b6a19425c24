"""NATS: subject names, message schemas and connection helpers. Only this package builds
subject names, so a rename is one edit."""
