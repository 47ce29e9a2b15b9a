"""verl's trainers with the compute in a remote backend, and the task runners that start them.

``ray_ppo`` / ``ray_ppo_runner``: verl's ``RayPPOTrainer`` (verl 0.7.1, and 0.9.1 with
``trainer.use_v1=false``); ``v1`` / ``v1_runner``: verl 0.9.1's V1 ``PPOTrainerSync``. What both
share (the backend's life in a trainer, timing, guarded saves) is in ``shared``; the CPU-only
resource pools of the forwarders in ``pools``. ``verl_versions`` picks the pair for the installed verl.
"""
