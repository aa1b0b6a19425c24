"""roost: a self-hosted compute control plane.

Placement: an EC2-compatible gateway routes launches only to node agents with room.
Autoscaling: a leader-elected controller sizes worker pools from queue demand.
"""

__version__ = "0.1.0"
