#!/usr/bin/env bash
# Create (or reuse) the project's Python 3.12 virtual environment and install
# verl-remote-backend into it with the extras given as $1 (default: "test"; "base" = what the
# main job needs: the package and its [examples] extra, without arctic-platform and deepspeed),
# on verl $VRB_VERL (default 0.7.1, the release the whole suite passes on; the other supported
# release is 0.9.1, what a plain `pip install` resolves). Both releases' test environments hold the
# Arctic client, DeepSpeed and the Tinker SDK; 0.9.1's also gets TransferQueue, which its V1
# trainer needs.
#
# The environment lives outside the checkout, keyed by a hash of pyproject.toml's dependencies,
# so a repeat run with unchanged dependencies only reinstalls our own files
# (seconds). Override its location with VRB_VENV=/path. Prints the venv path last.
set -euo pipefail

extras="${1:-test}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# shellcheck source=cached_venv.sh
source "$repo/scripts/cached_venv.sh"

# Keyed by what pip resolves (build system, Python, dependencies, extras), not by the whole
# pyproject.toml, so editing tool settings (pytest markers, timeouts) reuses the environment.
deps="$($(find_python) -c 'import json, sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))
proj = p["project"]
print(json.dumps([p["build-system"], proj.get("requires-python"), proj.get("dependencies"),
                  proj.get("optional-dependencies")], sort_keys=True))' "$repo/pyproject.toml")"
verl_version="${VRB_VERL:-0.7.1}"
# release_pins: what one release needs on top of pyproject.toml's dependencies (kept out of them so
# that the other release's environment, and its cache key, do not change). verl 0.9.1's V1 trainer
# (its default, the remote path's there) keeps its batches in TransferQueue: verl's `verl-core`
# extra asks for TransferQueue>=0.1.10, which needs tensordict>=0.10.0 (verl caps it at 0.10.0).
case "$verl_version" in
    0.7.1) release=""; release_pins="" ;;
    0.9.1) release="-verl091"; release_pins="TransferQueue==0.1.11 tensordict==0.10.0" ;;
    *) echo "error: VRB_VERL=$verl_version: the supported verl releases are 0.7.1 and 0.9.1" >&2; exit 1 ;;
esac
# A release's pins join its key only when it has some: 0.7.1's key is the dependencies' hash alone.
hashed="$deps"
if [ -n "$release_pins" ]; then hashed="$deps $release_pins"; fi
key="$(echo "$hashed" | sha256sum | cut -c1-12)-${extras//[^a-z,]/}$release"
venv="${VRB_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/verl-remote-backend/venv-$key}"

spec="$repo[$extras]"
if [ "$extras" = "base" ]; then spec="$repo[examples]"; fi
# Dependencies first (cached with the venv), then our own files below.
# shellcheck disable=SC2086 # release_pins is a list of requirement specifiers
build_cached_venv "$venv" setup "~4 min, ~6 GB" "$spec" "verl==$verl_version" $release_pins
if [ "$extras" = "test" ]; then
    # Snowflake's verl plugin (arctic_platform.integrations.verl, tests/e2e/test_arctic_plugin_e2e.py)
    # checks that arctic-platform's [verl] extra is installed, which includes arctic-inference:
    # a source-only package (its vLLM extra, CUDA only, is not needed). Built once per cached venv.
    if ! "$venv/bin/python" -c 'import importlib.metadata as m; m.version("arctic-inference")' 2>/dev/null; then
        echo "[setup] building arctic-inference 0.3.0 from source (~1 min, once)" >&2
        "$venv/bin/python" -m pip install -q nanobind==2.9.2 wheel >"$venv/arctic-inference.log" 2>&1
        CMAKE_ARGS="-Dnanobind_DIR=$("$venv/bin/python" -m nanobind --cmake_dir)" \
            "$venv/bin/python" -m pip install --no-build-isolation --no-deps arctic-inference==0.3.0 \
            >>"$venv/arctic-inference.log" 2>&1 \
            || { tail -20 "$venv/arctic-inference.log" >&2; echo "[setup] arctic-inference build failed" >&2; exit 1; }
    fi
fi
# Our package changes every commit: reinstall just it (no deps, a few seconds).
"$venv/bin/python" -m pip install -q --no-deps --force-reinstall "$repo" >&2
# setuptools leaves build metadata in the checkout; an in-tree *.egg-info would shadow the
# installed distribution's metadata for anything run from the repository root.
rm -rf "$repo"/*.egg-info "$repo/build"
echo "$venv"
