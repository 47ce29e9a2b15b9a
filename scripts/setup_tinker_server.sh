#!/usr/bin/env bash
# Create (or reuse) the environment of skyrl's open-source Tinker-API server (CPU, JAX backend),
# which the tinker backend's tests run against. Separate from the project's own environment:
# skyrl brings its own jax/flax/fastapi stack and pins the `tinker` SDK it serves.
#
# Cached outside the checkout, keyed by a hash of the pins below, so a repeat run only checks
# the marker file (and rewrites the `uv` shim). First build: ~6 min, ~6.7 GB.
# Override the location with VRB_TINKER_SERVER_VENV=/path, the Python with VRB_PYTHON.
# Prints the venv path last. The venv's bin/ holds a `uv` shim: skyrl starts its engine with
# `uv run ...`; put "$venv/bin" first on PATH when starting the server.
set -euo pipefail

SKYRL_SPEC="skyrl[tinker,jax]==0.4.0"
# aiohttp: imported by skyrl's tinker server, not declared by it.
EXTRA_SPECS=("jax[cpu]" "aiohttp")

key="$(echo "py3.12 $SKYRL_SPEC ${EXTRA_SPECS[*]}" | sha256sum | cut -c1-12)"
venv="${VRB_TINKER_SERVER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/verl-remote-backend/tinker-server-$key}"

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

if [ ! -f "$venv/.complete" ]; then
    python="$(find_python)"
    echo "[setup-tinker-server] creating $venv (first run: ~6 min, ~6.7 GB)" >&2
    rm -rf "$venv"
    $python -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip >"$venv/pip-upgrade.log" 2>&1
    start=$(date +%s)
    "$venv/bin/python" -m pip install "$SKYRL_SPEC" "${EXTRA_SPECS[@]}" >"$venv/pip.log" 2>&1 &
    pip_pid=$!
    while kill -0 "$pip_pid" 2>/dev/null; do
        sleep 15
        if kill -0 "$pip_pid" 2>/dev/null; then
            last="$(grep -oE '^(Collecting|Downloading|Installing collected|Building)[^ ]* ?[^ ]*' "$venv/pip.log" | tail -1 || true)"
            echo "[setup-tinker-server] ... $(( $(date +%s) - start ))s: ${last:-resolving}" >&2
        fi
    done
    if ! wait "$pip_pid"; then
        tail -20 "$venv/pip.log" >&2
        echo "[setup-tinker-server] pip install failed; full log: $venv/pip.log" >&2
        exit 1
    fi
    echo "[setup-tinker-server] installed in $(( $(date +%s) - start ))s" >&2
    touch "$venv/.complete"
fi
# skyrl's API server is meant to be started as `uv run [uv options] -m skyrl.tinker.api ...`: it
# reads its *parent's* command line to rebuild the `uv run` prefix and starts its engine with
# `uv run <those options> --extra tinker --extra jax -m skyrl.tinker.engine ...`. This shim stands
# in for uv on the prepared venv: it drops uv's options and runs the command with this venv's
# python as a *child* (not exec), so it is the API server's parent; SIGTERM/SIGINT are passed on.
cat > "$venv/bin/uv" <<'SHIM'
#!/usr/bin/env bash
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ "${1:-}" = "run" ] || { echo "uv shim: only 'uv run' is supported" >&2; exit 2; }
shift
while [ $# -gt 0 ]; do
    case "$1" in
        run) shift ;;  # skyrl copies the words between `uv` and `-m` of its parent: `run` again
        --) shift; break ;;
        --extra|--with|--python|--project|--directory|--group|--env-file|--package) shift 2 ;;
        --*) shift ;;
        *) break ;;
    esac
done
case "${1:-}" in python|python3) shift ;; esac
"$here/python" "$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM INT
while kill -0 "$child" 2>/dev/null; do wait "$child"; done
wait "$child"
SHIM
chmod +x "$venv/bin/uv"
echo "$venv"
