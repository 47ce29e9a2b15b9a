#!/usr/bin/env bash
# The README's test command: set up the environment, then run the whole suite.
# Extra arguments go to pytest (e.g. -m "not slow" for the fast suite only).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$(bash "$repo/scripts/setup_env.sh" test)"
cd "$repo"
exec "$venv/bin/python" -m pytest tests "$@"
