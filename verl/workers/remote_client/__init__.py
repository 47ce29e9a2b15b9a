"""Backend adapters: one folder per backend (``<name>/``: its client, config, payload and
checkpoint format), each client registering one ``RemoteBackend``.

The clients are imported lazily by ``RemoteBackendRegistry.get``; importing this package imports
none of them. ``arctic_rl_client.py`` keeps the seed contract's import path of the Arctic client.
"""
