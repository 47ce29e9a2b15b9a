#!/usr/bin/env bash
# The README's test command: set up the environment, then run the whole suite.
# Extra arguments go to pytest (e.g. -m "not slow" for the fast suite only, or
# tests/test_registry.py to run one file). VRB_VERL=0.9.1 runs on verl 0.9.1 in its own
# environment, where only the tests marked every_verl run (tests/conftest.py skips the rest).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$(bash "$repo/scripts/setup_env.sh" test)"
cd "$repo"
# Run the whole suite unless the arguments name test files or folders themselves.
for arg in "$@"; do
    if [ -e "${arg%%::*}" ]; then exec "$venv/bin/python" -m pytest "$@"; fi
done
exec "$venv/bin/python" -m pytest tests "$@"
