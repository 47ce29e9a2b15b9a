"""Snowflake's own verl plugin (``arctic_platform.integrations.verl``, unmodified, from the installed
wheel) runs GRPO through ``python -m verl.remote_backend.main_ppo`` on stock verl 0.7.1.

Loaded as Snowflake documents it: ``VERL_USE_EXTERNAL_MODULES=arctic_platform.integrations.verl.register``,
their config directory on ``hydra.searchpath`` and ``remote_backend=arctic`` to merge their
``arctic.yaml`` flat into ``remote_backend``. Their adapter class serves ``trainer.remote_backend=arctic``
and their forwarder worker (``register_worker``) replaces ours; their adapter launches Arctic's
server itself, which ``arctic_standin/plugin_redirect`` turns into the stand-in (Arctic's server
code, the real DeepSpeed engine on CPU). Their vLLM rollout replica needs CUDA vLLM, so our
``remote`` replica serves their adapter's ``generate``.
"""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path

import pytest
from support.remote_e2e import REPO_ROOT, TESTS_DIR, run_entry, small_ci_overrides

PLUGIN_MODULE = "arctic_platform.integrations.verl.register"
#: Snowflake's adapter starts its server on localhost:7000 (hard-coded in adapter.py).
PLUGIN_SERVER_PORT = 7000


def _plugin_config_dir() -> Path:
    import arctic_platform.integrations.verl as plugin

    return Path(plugin.__file__).resolve().parent / "config"


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.slow
def test_snowflake_plugin_runs_two_grpo_steps_on_stock_verl(gsm8k_assets, tmp_path):
    if not _port_free(PLUGIN_SERVER_PORT):
        pytest.fail(f"port {PLUGIN_SERVER_PORT} is taken: Snowflake's adapter always starts its server there")
    model, train, test = gsm8k_assets["model"], gsm8k_assets["train"], gsm8k_assets["test"]
    overrides = small_ci_overrides(
        model=model, train=train, test=test, ckpt_dir=tmp_path / "ckpt", steps=2, backend="arctic"
    ) + [
        f"hydra.searchpath=[file://{_plugin_config_dir()}]",
        "remote_backend=arctic",
        # their default is Arctic's in-process Ray server; this run covers their HTTP path
        "remote_backend.comms.protocol=http",
        # as their gsm8k example: ZeRO-2 (at ZeRO-0 in fp32 DeepSpeed reports no gradient norm) with
        # log-probs on the training job (a log-prob job would get the ZeRO-2 config, which the real
        # DeepSpeed refuses without an optimizer: "zero stage 1 requires an optimizer")
        "remote_backend.train.deepspeed.zero_optimization.stage=2",
        "remote_backend.log_prob_gpus=0",
        f"reward.custom_reward_function.path={REPO_ROOT / 'tests' / 'support' / 'toy_reward.py'}",
        "reward.custom_reward_function.name=digit_share",
    ]
    env = {
        "VERL_USE_EXTERNAL_MODULES": PLUGIN_MODULE,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(TESTS_DIR / "arctic_standin" / "plugin_redirect"), os.environ.get("PYTHONPATH")])
        ),
    }
    result = run_entry(overrides, workdir=tmp_path / "run", env_extra=env, timeout_s=900)
    assert result.returncode == 0, result.tail()
    log = result.tail(10**7)
    # their adapter serves the name, their worker replaces the generic forwarder
    assert "backend=arctic (arctic_platform.integrations.verl.adapter.ArcticRLClientWrapper)" in log, result.tail()
    assert "own forwarder worker: arctic_platform.integrations.verl.worker.ArcticRLActorRolloutRefWorker" in log
    for step in (1, 2):
        data = result.step(step)
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean"):
            assert key in data and math.isfinite(float(data[key])), f"step {step}: {key}={data.get(key)}"
    assert max(float(result.step(s)["actor/grad_norm"]) for s in (1, 2)) > 0
    print(
        "snowflake plugin e2e: "
        + "; ".join(
            f"step {s}: "
            + ", ".join(
                f"{k}={float(result.step(s)[k]):.4g}" for k in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean")
            )
            for s in (1, 2)
        )
        + f"; wall {result.wall_s:.0f}s"
    )
    assert _port_free(PLUGIN_SERVER_PORT), "the plugin's server outlived the run"
