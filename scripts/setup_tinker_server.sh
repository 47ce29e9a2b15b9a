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

# shellcheck source=cached_venv.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/cached_venv.sh"
build_cached_venv "$venv" setup-tinker-server "~6 min, ~6.7 GB" "$SKYRL_SPEC" "${EXTRA_SPECS[@]}"
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
