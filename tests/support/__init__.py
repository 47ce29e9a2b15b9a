"""Support code shared by the test modules (importable as ``support``: pytest puts ``tests/`` on
``sys.path``). Fixtures live in ``tests/conftest.py``; the helpers they and the tests call, here."""
