"""Pieces of the Kubernetes orchestrator (`roost.controller.adapters.kubernetes`).

- `pods`: pure reads of pods and nodes (readiness, deletion cost, requests, which nodes
  can take one more of a pool's pods), as Kubernetes' own controllers compute them;
- `safety`: whether removing one replica now removes the drained pod, and what
  actually went afterwards;
- `cluster`: the cluster-wide node and pod reads that every pool shares;
- `config`: where the API server is (in-cluster or kubeconfig) and how a pool names
  its Deployment;
- `errors`: client errors turned into the orchestrator error tree.
"""
