"""Start and stop an Arctic RL HTTP server as a child process of the backend.

Used when ``remote_backend.arctic.launch_server=true``. The backend launches the server itself,
rather than through the Arctic client's own launcher, because that one binds ``0.0.0.0``; here
the server binds ``remote_backend.arctic.host`` (127.0.0.1 by default).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Optional, Sequence

from verl.remote_backend.reliability.server_process import ServerProcess
from verl.workers.remote_client.arctic.errors import ArcticUnreachableError
from verl.workers.remote_client.arctic.server_http import probe_health

__all__ = ["ServerProcess", "launch_server"]

DEFAULT_SERVER_MODULE = "arctic_platform.common.http_server"


def launch_server(
    *,
    host: str,
    port: int,
    training_gpus: int,
    sampling_gpus: int,
    log_prob_gpus: int,
    colocate: bool,
    command: Optional[Sequence[str]] = None,
    startup_timeout_s: float = 600.0,
    log_dir: Optional[str] = None,
) -> ServerProcess:
    """Start the server and wait until ``/health`` answers.

    ``command`` (default ``python -m arctic_platform.common.http_server``) gets the real server's
    arguments appended (``--host --port --training-gpus --sampling-gpus --log-prob-gpus
    --log-prob-engine [--colocate]``), so any server speaking that CLI can be launched.

    The child runs in its own process session (so :meth:`ServerProcess.stop`
    also ends the workers it spawns) and logs to ``<log_dir>/arctic_server_<port>.log``.

    Raises:
        ArcticUnreachableError: the server exited or stayed unhealthy for
            ``startup_timeout_s``; the message quotes the log's tail and path.
    """
    argv = list(command) if command else [sys.executable, "-m", DEFAULT_SERVER_MODULE]
    argv += [
        "--host", str(host),
        "--port", str(port),
        "--training-gpus", str(training_gpus),
        "--sampling-gpus", str(sampling_gpus),
        "--log-prob-gpus", str(log_prob_gpus),
        "--log-prob-engine", "deepspeed",
    ]  # fmt: skip
    if colocate:
        argv.append("--colocate")
    log_dir = log_dir or tempfile.gettempdir()
    os.makedirs(log_dir, exist_ok=True)
    log_path = os.path.join(log_dir, f"arctic_server_{port}.log")
    server = ServerProcess.start(argv, log_path=log_path, address=f"{host}:{port}")
    deadline = time.monotonic() + float(startup_timeout_s)
    while True:
        if not server.alive():
            raise ArcticUnreachableError(
                f"Arctic RL server launched at {server.address} exited with code {server.proc.returncode} "
                f"before becoming healthy; log {log_path}:\n{server.tail()}"
            )
        left = deadline - time.monotonic()
        try:
            probe_health(host, port, timeout_s=max(0.1, min(2.0, left)))
            return server
        except ArcticUnreachableError:
            if time.monotonic() >= deadline:
                server.stop()
                raise ArcticUnreachableError(
                    f"Arctic RL server launched at {server.address} was not healthy within {startup_timeout_s}s "
                    f"(remote_backend.arctic.startup_timeout_s); log {log_path}:\n{server.tail()}"
                ) from None
