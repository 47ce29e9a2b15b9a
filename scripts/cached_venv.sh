# Sourced by the set-up scripts: build a Python 3.12 virtual environment once, cached by key.
#
#   build_cached_venv VENV LABEL SIZE_NOTE PIP_ARGS...
# does nothing when VENV/.complete exists; otherwise (re)creates VENV and pip-installs PIP_ARGS
# into it, printing progress every 15 s to stderr (log: VENV/pip.log), and marks it complete.
# The Python is $VRB_PYTHON, or the first Python 3.12 found.

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

build_cached_venv() {
    local venv="$1" label="$2" size_note="$3"
    shift 3
    [ -f "$venv/.complete" ] && return 0
    local python
    python="$(find_python)"
    echo "[$label] creating $venv with $($python --version 2>&1) (first run: $size_note)" >&2
    rm -rf "$venv"
    $python -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip >"$venv/pip-upgrade.log" 2>&1
    local start pip_pid last
    start=$(date +%s)
    echo "[$label] installing $* (log: $venv/pip.log)" >&2
    "$venv/bin/python" -m pip install "$@" >"$venv/pip.log" 2>&1 &
    pip_pid=$!
    while kill -0 "$pip_pid" 2>/dev/null; do
        sleep 15
        if kill -0 "$pip_pid" 2>/dev/null; then
            last="$(grep -oE '^(Collecting|Downloading|Installing collected|Building)[^ ]* ?[^ ]*' "$venv/pip.log" | tail -1 || true)"
            echo "[$label] ... $(( $(date +%s) - start ))s: ${last:-resolving}" >&2
        fi
    done
    if ! wait "$pip_pid"; then
        tail -20 "$venv/pip.log" >&2
        echo "[$label] pip install failed; full log: $venv/pip.log" >&2
        exit 1
    fi
    echo "[$label] installed in $(( $(date +%s) - start ))s" >&2
    touch "$venv/.complete"
}
