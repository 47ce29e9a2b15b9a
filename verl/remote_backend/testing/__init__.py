"""Tools for adapter authors and for this package's own tests: a tiny random model builder
(``python -m verl.remote_backend.testing.tiny_model OUT_DIR``). Not imported by the product."""
