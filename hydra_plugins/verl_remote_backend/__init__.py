"""Hydra plugin of verl-remote-backend (discovered by Hydra in the ``hydra_plugins`` namespace)."""
