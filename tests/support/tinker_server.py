"""Test helpers for the ``tinker`` backend: a tiny Llama model skyrl's JAX backend can load,
the skyrl Tinker-API server's cached environment, and a started server with readiness and
teardown.

The server is skyrl 0.4.0's open-source Tinker-API server on CPU (``--backend jax``), in its
own environment built by ``scripts/setup_tinker_server.sh`` (cached, keyed by its pins). Our
tests talk to it with the ``tinker`` SDK from the project's environment, as a user would.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Optional

from support.ports import free_port
from verl.remote_backend.reliability.server_process import ServerProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
SETUP_SCRIPT = REPO_ROOT / "scripts" / "setup_tinker_server.sh"
API_KEY = "tml-verl-remote-backend-tests"


def build_tiny_llama(out_dir: Path, *, seed: int = 0) -> str:
    """A random 2-layer Llama with the project's tiny tokenizer: skyrl's JAX backend loads Llama,
    Qwen3, Qwen3.5 and DeepSeek-V3 architectures, not the Qwen2 the other backends' tests use."""
    from verl.remote_backend.testing.tiny_model import build_tiny_model

    return build_tiny_model(str(out_dir), architecture="llama", seed=seed)


class ServerEnvUnavailable(RuntimeError):
    """The server's environment could not be built (no registry access, no Python 3.12, ...)."""


def server_venv(timeout_s: float = 1800) -> Path:
    """Build (first time, ~2-6 min) or reuse skyrl's server environment; its path.

    Raises:
        ServerEnvUnavailable: the set-up script failed; the message quotes its output.
    """
    try:
        proc = subprocess.run(["bash", str(SETUP_SCRIPT)], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise ServerEnvUnavailable(f"{SETUP_SCRIPT.name} did not finish within {timeout_s}s") from exc
    if proc.returncode != 0:
        raise ServerEnvUnavailable(f"{SETUP_SCRIPT.name} failed (rc={proc.returncode}):\n{proc.stderr[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


class TinkerServer:
    """skyrl's Tinker-API server on 127.0.0.1, started in its own process session.

    ``start()`` returns once the engine answers (the first ``create_lora_training_client``
    succeeds: ``/api/v1/healthz`` answers before the engine has loaded the model).
    ``stop()`` ends the whole session (API server, ``uv`` shim, engine); ``kill()`` SIGKILLs it.
    """

    def __init__(self, venv: Path, model: str, workdir: Path, *, port: Optional[int] = None, max_lora_rank: int = 8):
        self.venv = Path(venv)
        self.model = model
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.max_lora_rank = max_lora_rank
        self.process: Optional[ServerProcess] = None
        self.log_path = self.workdir / f"tinker_server_{self.port}.log"
        self.ready_s: Optional[float] = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        import json

        return [
            str(self.venv / "bin" / "uv"), "run", "-m", "skyrl.tinker.api",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--base-model", self.model,
            "--backend", "jax",
            "--backend-config", json.dumps({"max_lora_rank": self.max_lora_rank, "max_lora_adapters": 16}),
            "--checkpoints-base", str(self.workdir / "checkpoints"),
            "--database-url", f"sqlite:///{self.workdir / 'tinker.db'}",
        ]  # fmt: skip

    def start(self, timeout_s: float = 600) -> "TinkerServer":
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env.pop("VIRTUAL_ENV", None)
        env["JAX_PLATFORMS"] = "cpu"
        self.process = ServerProcess.start(
            self.command(), log_path=str(self.log_path), address=self.base_url, env=env, cwd=str(self.workdir)
        )
        start = time.monotonic()
        try:
            self._wait_ready(start + timeout_s)
        except BaseException:
            self.stop()
            raise
        self.ready_s = time.monotonic() - start
        return self

    def _wait_ready(self, deadline: float) -> None:
        import tinker

        from verl.workers.remote_client.tinker.client import close_sdk_sessions

        last: Optional[BaseException] = None
        while time.monotonic() < deadline:
            if not self.process.alive():
                raise RuntimeError(
                    f"tinker server exited with {self.process.proc.returncode}; log {self.log_path}:\n{self.tail()}"
                )
            service = tinker.ServiceClient(base_url=self.base_url, api_key=API_KEY)
            try:
                service.create_lora_training_client(base_model=self.model, rank=1)
                return
            except Exception as exc:  # not up yet / engine still loading
                last = exc
                time.sleep(2)
            finally:
                close_sdk_sessions(service)  # else its heartbeat outlives the server, warning every 10 s
        raise TimeoutError(f"tinker server not ready in time: {last!r}; log {self.log_path}:\n{self.tail()}")

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def tail(self, n: int = 40) -> str:
        return self.process.tail(n) if self.process is not None else ""

    def kill(self) -> None:
        """SIGKILL the server's whole process session (a crash, as the fault test needs)."""
        if self.process is not None:
            self.process.kill()

    def stop(self) -> None:
        """SIGTERM the session, SIGKILL what is left after 20 s. Idempotent."""
        if self.process is not None:
            self.process.stop(timeout_s=20)
