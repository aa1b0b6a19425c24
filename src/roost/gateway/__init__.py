"""The EC2 Query API gateway: protocol, SigV4, actions, live capacity view and launch
orchestration."""
