"""Pieces of the ``tinker`` backend (:mod:`verl.workers.remote_client.tinker.client`): the typed
config and start-up rules (:mod:`.config`), and verl batch <-> Tinker arrays (:mod:`.batch`).
Neither imports the ``tinker`` SDK."""
