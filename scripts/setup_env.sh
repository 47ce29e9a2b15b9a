#!/usr/bin/env bash
# Create (or reuse) the project's Python 3.12 virtual environment and install
# verl-remote-backend into it with the extras given as $1 (default: "test"; "base" = no extra:
# what the main job needs, without arctic-platform and deepspeed).
#
# The environment lives outside the checkout, keyed by a hash of pyproject.toml,
# so a repeat run with unchanged dependencies only reinstalls our own files
# (seconds). Override its location with VRB_VENV=/path. Prints the venv path last.
set -euo pipefail

extras="${1:-test}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

find_python() {
    if [ -n "${VRB_PYTHON:-}" ]; then echo "$VRB_PYTHON"; return; fi
    for candidate in python3.12 "env PYENV_VERSION=3.12.1 python3.12"; do
        if $candidate -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
            echo "$candidate"; return
        fi
    done
    echo "error: Python 3.12 not found; install it or set VRB_PYTHON=/path/to/python3.12" >&2
    exit 1
}

key="$(sha256sum < "$repo/pyproject.toml" | cut -c1-12)-${extras//[^a-z,]/}"
venv="${VRB_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/verl-remote-backend/venv-$key}"

if [ ! -f "$venv/.complete" ]; then
    python="$(find_python)"
    echo "[setup] creating $venv with $($python --version 2>&1) (first run: ~4 min, ~6 GB)" >&2
    rm -rf "$venv"
    $python -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip >"$venv/pip-upgrade.log" 2>&1
    start=$(date +%s)
    spec="$repo[$extras]"
    if [ "$extras" = "base" ]; then spec="$repo"; fi
    # Dependencies first (cached with the venv), then our own files below. pip is quiet; a
    # ticker says what is happening and for how long.
    echo "[setup] installing dependencies of $spec (log: $venv/pip.log)" >&2
    "$venv/bin/python" -m pip install "$spec" >"$venv/pip.log" 2>&1 &
    pip_pid=$!
    while kill -0 "$pip_pid" 2>/dev/null; do
        sleep 15
        if kill -0 "$pip_pid" 2>/dev/null; then
            last="$(grep -oE '^(Collecting|Downloading|Installing collected|Building)[^ ]* ?[^ ]*' "$venv/pip.log" | tail -1 || true)"
            echo "[setup] ... $(( $(date +%s) - start ))s: ${last:-resolving}" >&2
        fi
    done
    if ! wait "$pip_pid"; then
        tail -20 "$venv/pip.log" >&2
        echo "[setup] pip install failed; full log: $venv/pip.log" >&2
        exit 1
    fi
    echo "[setup] dependencies installed in $(( $(date +%s) - start ))s" >&2
    touch "$venv/.complete"
fi
# Our package changes every commit: reinstall just it (no deps, a few seconds).
"$venv/bin/python" -m pip install -q --no-deps --force-reinstall "$repo" >&2
# setuptools leaves build metadata in the checkout; an in-tree *.egg-info would shadow the
# installed distribution's metadata for anything run from the repository root.
rm -rf "$repo"/*.egg-info "$repo/build"
echo "$venv"
