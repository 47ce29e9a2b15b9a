#!/usr/bin/env bash
# The README's test command: set up the environment, then run the whole suite.
# Extra arguments go to pytest (e.g. tests/unit for one tier, -m "not slow" for the fast suite, or
# tests/integration/test_registry.py for one file). The release is verl 0.7.1 unless VRB_VERL=0.9.1;
# each release has its own cached environment with every extra. The whole suite passes on 0.7.1;
# .ci/run runs the tests marked every_verl on 0.9.1 (README: what still fails there).
#
# The whole suite runs in parallel pytest-xdist workers: VRB_TEST_WORKERS of them (default: one per
# core, at most one per 8 GiB of memory and at most 4; 1 = one process, no xdist), each test file
# on one worker (--dist loadfile: a module's server, engine or Ray cluster is set up once), files
# with slow tests dealt out first (tests/conftest.py orders them). Named files run in one process
# unless VRB_TEST_WORKERS is set. OpenMP threads sleep when idle (OMP_WAIT_POLICY=PASSIVE, unless
# set): with several workers the processes' torch threads outnumber the cores, and threads that
# spin at OpenMP barriers then burn the cores others need (measured: two 2-thread torch processes
# on 2 cores use ~1.7x the CPU time spinning as sleeping).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$(bash "$repo/scripts/setup_env.sh" test)"
cd "$repo"

default_workers() {
    local cores mem_gib
    cores="$(nproc)"
    mem_gib="$(awk '/^MemTotal:/ {print int($2 / 1048576)}' /proc/meminfo)"
    local n=$(( cores < mem_gib / 8 ? cores : mem_gib / 8 ))
    n=$(( n > 4 ? 4 : n ))
    echo $(( n < 1 ? 1 : n ))
}

# Run the whole suite unless the arguments name test files or folders themselves.
targets=(tests)
for arg in "$@"; do
    if [ -e "${arg%%::*}" ]; then targets=(); fi
done
workers="${VRB_TEST_WORKERS:-}"
if [ -z "$workers" ]; then
    if [ ${#targets[@]} -gt 0 ]; then workers="$(default_workers)"; else workers=1; fi
fi
parallel=()
if [ "$workers" -gt 1 ]; then
    parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)
    export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
fi
# Every process the run starts inherits this tag: scripts/leftover_processes.py finds what outlived it.
export VRB_TEST_RUN="${VRB_TEST_RUN:-$(date +%s)-$$}"
exec "$venv/bin/python" -m pytest "${targets[@]}" "${parallel[@]}" "$@"
