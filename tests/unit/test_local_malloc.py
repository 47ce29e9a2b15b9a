"""The local engine process's C heap policy: freed memory goes back to the system after a call."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from verl.workers.remote_client.local.malloc import ENGINE_MALLOC_ENV

_PROBE = r"""
import json
from verl.workers.remote_client.local.malloc import free_heap_bytes, release_freed_memory

def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

blocks = [b"x" * (4 << 20) for _ in range(100)]  # 400 MB in 4 MB blocks, all from the heap
peak = rss_mb()
last = blocks[-1]  # still in use, above the freed ones: glibc cannot shrink the heap past it
del blocks
freed = rss_mb()
free_mb = free_heap_bytes() / 2**20
kept_by_default = not release_freed_memory()  # 396 MB free is under the 4 GiB the heap may keep
after_default = rss_mb()
released = release_freed_memory(keep_free_bytes=0)
print(json.dumps({"peak": peak, "freed": freed, "free_mb": free_mb, "kept_by_default": kept_by_default,
                  "after_default": after_default, "trimmed": rss_mb(), "released": released, "kept": len(last)}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or not os.path.exists("/proc/self/status"), reason="glibc's")
def test_memory_freed_inside_the_engines_heap_is_kept_until_the_trim_hands_it_back():
    """Under the engine's own malloc settings, 396 MB freed below a block still in use stay
    resident (what made the engine grow step after step); ``release_freed_memory`` keeps them
    while they are under its ``keep_free_bytes`` (for the next call to reuse) and hands them back
    above it."""
    env = {**os.environ, **ENGINE_MALLOC_ENV}
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    rss = json.loads(out.stdout.strip().splitlines()[-1])
    assert rss["freed"] > rss["peak"] - 50, rss  # free() alone gave (almost) nothing back
    assert rss["free_mb"] > 390, rss
    assert rss["kept_by_default"] is True and rss["after_default"] > rss["peak"] - 50, rss
    assert rss["released"] is True
    assert rss["trimmed"] < rss["freed"] - 300, rss  # the trim gave back at least 300 of the 396 MB


_REUSE_PROBE = r"""
import json, resource

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

first = b"x" * (113 << 20)  # a micro-batch's vocabulary-projection gradient on SmolLM2-135M
del first
before = faults()
again = b"y" * (113 << 20)
print(json.dumps({"faults": faults() - before}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's")
def test_a_freed_block_of_a_hundred_megabytes_is_reused_without_faulting_its_pages_in_again():
    """Under glibc's defaults a 113 MB block is mapped for each use and every one of its 29k pages
    faults in again (what cost the engine's update several seconds of system time per call);
    under the engine's settings the freed block stays in the heap and the next one reuses it."""
    runs = {}
    for name, extra in (("defaults", {}), ("engine", ENGINE_MALLOC_ENV)):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        env.update(extra)
        out = subprocess.run([sys.executable, "-c", _REUSE_PROBE], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-2000:]
        runs[name] = json.loads(out.stdout.strip().splitlines()[-1])["faults"]
    assert runs["defaults"] > 25_000, runs  # 113 MB / 4 KiB pages = 28,928
    assert runs["engine"] < 1_000, runs
