"""The credential the tests give the third-party adapter (tests/support/third_party_adapter.py), kept apart
from the adapter so that the test process can read it without registering the adapter."""

from __future__ import annotations

import hashlib
from typing import Optional

#: The adapter's credential setting (a flat key, as plugins read theirs) and its environment variable.
TOKEN_KEY, TOKEN_ENV = "remote_backend.my_engine_token", "MY_ENGINE_TOKEN"
#: The value the tests give it (searched for in everything a run prints or writes).
TEST_TOKEN = "my-engine-token-5d1f0c7be93a"


def token_digest(token: Optional[str]) -> str:
    """What the adapter prints instead of the token: the first 12 hex digits of its sha256."""
    return "none" if not token else hashlib.sha256(token.encode()).hexdigest()[:12]
