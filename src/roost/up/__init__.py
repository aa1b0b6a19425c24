"""`roost up`: a whole roost on one machine, as a list of components."""

from roost.up.cluster import ClusterSpec, Component, LocalCluster, build_components

__all__ = ["ClusterSpec", "Component", "LocalCluster", "build_components"]
