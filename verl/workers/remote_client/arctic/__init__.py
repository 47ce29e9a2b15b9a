"""The ``arctic`` backend: the client verl's trainer talks to (:mod:`.client`, which imports
``arctic_platform``) and the parts that can be built and tested without an Arctic server: config
and the settings derived from verl's, request bodies and tensor mapping, token-id generation,
the checkpoint format, error translation and the launcher of a local server process.
Importing this package does not import ``arctic_platform``.
"""
