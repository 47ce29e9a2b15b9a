"""CPU stand-in for the Arctic RL HTTP server, backed by the ``local`` engine (tests only).

``server``: the FastAPI app speaking Arctic's protocol; ``bridge``: payload translation
to the local engine; ``harness``: helpers that start it and build test configs.
"""
