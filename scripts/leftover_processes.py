"""List the processes a test run left behind, and fail if there is any.

    python3 scripts/leftover_processes.py TAG [--wait SECONDS]

A process belongs to the run tagged TAG when its environment holds ``VRB_TEST_RUN=TAG``
(``scripts/run_tests.sh`` exports it; every process the suite starts inherits it: servers, Ray's
daemons and workers, engines). Waits up to ``--wait`` seconds (default 30: the suite's reapers
give a process 5 s after SIGTERM) for them to end, then prints each one still running (pid and
command line) and exits 1; exits 0 when none is left. Standard library only, reads /proc.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def tagged_processes(tag: str) -> dict[int, str]:
    """pid -> command line of every running process whose environment holds ``VRB_TEST_RUN=tag``."""
    wanted = f"VRB_TEST_RUN={tag}".encode()
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if wanted not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat", "rb") as fh:
                if fh.read().rsplit(b")", 1)[1].split()[0] == b"Z":  # a zombie has exited
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                found[int(entry)] = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tag")
    parser.add_argument("--wait", type=float, default=30.0)
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.wait
    while True:
        left = tagged_processes(args.tag)
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    if not left:
        print(f"leftover processes: none of test run {args.tag} is running")
        return 0
    print(f"leftover processes: {len(left)} of test run {args.tag} still running {args.wait:.0f} s after it ended:")
    for pid, cmdline in sorted(left.items()):
        print(f"  pid {pid}: {cmdline[:300]}")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
