"""Hydra configs of `python -m verl.remote_backend.main_ppo` (a package so ``pkg://`` can find them)."""
