"""The ``tinker`` backend: the client (:mod:`.client`, on the ``tinker`` SDK), the typed config and
start-up rules (:mod:`.config`), and verl batch <-> Tinker arrays (:mod:`.batch`); importing this
package does not import the SDK."""
