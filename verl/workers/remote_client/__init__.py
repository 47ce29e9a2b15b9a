"""Backend adapters: one module per backend, each registering one ``RemoteBackend``.

Modules here are imported lazily by ``RemoteBackendRegistry.get``; importing
this package imports none of them.
"""
