"""The conformance kit as pytest tests, for an adapter's own CI. One short file is enough::

    # tests/test_conformance.py
    from verl.remote_backend.testing.pytest_support import conformance_test

    test_my_engine = conformance_test("my-engine", ["remote_backend.my-engine.address=127.0.0.1:9000"])

Each check becomes one test case (``unsupported`` capabilities are skipped, not failed).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from verl.remote_backend.testing.conformance import CHECKS, FAIL, PASS, KitOptions, kit_config, run_conformance

__all__ = ["conformance_test"]


def conformance_test(
    backend: str, overrides: Sequence[str] = (), options: Optional[KitOptions] = None
) -> Callable[[str], None]:
    """A pytest test function parametrized over every check; the kit runs once, on first use."""
    import pytest

    cache: dict[str, Any] = {}

    def report() -> Any:
        if "report" not in cache:
            cache["report"] = run_conformance(backend, kit_config(backend, overrides), options)
        return cache["report"]

    @pytest.mark.parametrize("check", list(CHECKS))
    def test_conformance(check: str) -> None:
        result = report().get(check)
        if result.status not in (PASS, FAIL):
            pytest.skip(f"{check}: {result.status}: {result.detail}")
        assert result.status == PASS, result.line()

    return test_conformance
