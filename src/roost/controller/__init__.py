"""The capacity controller: leadership, the reconcile loop, and orchestrator adapters."""
