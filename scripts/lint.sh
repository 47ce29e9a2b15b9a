#!/usr/bin/env bash
# Lint the whole repository with ruff (rules and line length in ruff.toml); CI runs it before
# the tests. The pinned ruff lives in its own small cached venv, keyed by its version.
# Extra arguments go to `ruff check` (e.g. --fix).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=cached_venv.sh
source "$repo/scripts/cached_venv.sh"
version="0.17.6"
venv="${XDG_CACHE_HOME:-$HOME/.cache}/verl-remote-backend/ruff-$version"
build_cached_venv "$venv" lint "~10 s, ~30 MB" "ruff==$version"
cd "$repo"
"$venv/bin/ruff" check "$@" .
"$venv/bin/ruff" format --check .
