"""Test-only: turns the Arctic server that Snowflake's verl plugin launches into the stand-in.

Snowflake's adapter (``arctic_platform.integrations.verl``) starts its server itself, as
``<python> -m arctic_platform.common.http_server --host ... --port ... --training-gpus ...``
(``arctic_platform/client/transports/onprem_http.py``), and that server needs GPUs. With this
folder on ``PYTHONPATH``, such a process replaces itself (same pid, so the plugin's own
health wait and shutdown apply to it) with ``tests/arctic_standin/server.py`` and the same
arguments: Arctic's server code with only its GPU engines swapped (see ../README.md). Every
other Python process is left alone.
"""

import os
import sys

_ARCTIC_SERVER = ["-m", "arctic_platform.common.http_server"]
_argv = list(getattr(sys, "orig_argv", []))
for _i in range(len(_argv) - 1):
    if _argv[_i : _i + 2] == _ARCTIC_SERVER:
        _server = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "server.py")
        os.execv(sys.executable, [sys.executable, _server, *_argv[_i + 2 :]])
