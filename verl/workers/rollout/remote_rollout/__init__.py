"""Rollout replica and server that forward verl's ``generate`` calls to a ``RemoteBackend``."""
