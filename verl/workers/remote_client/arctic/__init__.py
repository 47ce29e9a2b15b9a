"""Helpers of the ``arctic`` backend (``verl.workers.remote_client.arctic_rl_client``).

``payload``: pure tensor mapping between verl's batch layout and Arctic's dense one.
``bodies``: Arctic request bodies (batch, meta, processing) built from verl batches.
``launcher``: starting and stopping a local Arctic RL server process.
``config``: the typed ``remote_backend.arctic`` config; ``derive``: settings derived from verl's config and the Arctic client config.
``generation``: token-id prompts over the text-only /generate (round-trip proof, result parsing).
``errors``: its error classes; ``server_http``: the health probe and transport-error translation;
``responses``: validation of the server's answers; ``checkpoint``: its files inside verl's checkpoint.

Importing this package does not import ``arctic_platform``.
"""
