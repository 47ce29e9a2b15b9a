"""The same batch through Snowflake's adapter and ours, against the same Arctic server.

Our ``arctic`` adapter creates the jobs on a running stand-in; Snowflake's ``ArcticRLClientWrapper``
(from the installed arctic-platform, unmodified) re-attaches to them through its own
``from_config(handle=...)``. Then, on one verl-shaped batch: forward log-probs at temperature 1
and at the rollout temperature, and one ``update_actor`` each from the same starting point (a
checkpoint of the initial state, restored between the two) with the loss, grad norm, metric
names and the weights after the step. Prints one JSON object (and a Markdown table with
``--table``). Its own process: importing Snowflake's adapter registers it as ``arctic``.

    python tests/arctic_standin/side_by_side.py --port 8123 --model /path/to/tiny-model --workdir /tmp/sbs
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from typing import Any

_TESTS = str(pathlib.Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

TEMPERATURE = 0.7
ROWS = 8  # 4 prompts x rollout.n 2, one mini-batch


def _config(model: str, workdir: str, port: int) -> Any:
    import arctic_platform.integrations.verl as plugin
    from omegaconf import OmegaConf, open_dict

    from arctic_standin.harness import compose_config

    cfg = compose_config(
        model,
        os.path.join(workdir, "ckpt"),
        port,
        [
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # x rollout.n 2 = all 8 rows: one optimizer step
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            f"actor_rollout_ref.rollout.temperature={TEMPERATURE}",
        ],
    )
    theirs = OmegaConf.load(pathlib.Path(plugin.__file__).parent / "config" / "remote_backend" / "arctic.yaml")
    with open_dict(cfg):  # their settings, flat under remote_backend, as `remote_backend=arctic` merges them
        cfg.remote_backend = OmegaConf.merge(cfg.remote_backend, theirs)
        cfg.remote_backend.comms.protocol = "http"
    return cfg


def _batch(vocab: int, pad: int) -> Any:
    from arctic_standin.harness import EIGHT_ROWS, make_batch
    from verl.utils import tensordict_utils as tu

    data = make_batch(
        **EIGHT_ROWS,
        vocab=vocab,
        pad_token_id=pad,
        seed=11,
        with_update_fields=True,
    )
    tu.assign_non_tensor(data, temperature=TEMPERATURE, calculate_entropy=False)
    return data


def _response_log_probs(data: Any, packed: Any) -> Any:
    """``[B, R]`` log-probs of the response tokens from a packed ``[T]`` predict-next output."""
    import torch

    values = packed.values() if getattr(packed, "is_nested", False) else packed
    offsets = data["input_ids"].offsets()
    prompt_lens = data["attention_mask"][:, : data["prompts"].shape[1]].sum(-1)
    out = torch.zeros(data["responses"].shape, dtype=torch.float32)
    for i in range(out.shape[0]):
        n = int(data["response_mask"][i].sum())
        start = int(offsets[i] + prompt_lens[i] - 1)  # slot predicting the first response token
        out[i, :n] = values[start : start + n].float()
    return out


def _weights_after(backend: Any, run: Any, directory: str, *, step: int) -> dict[str, Any]:
    """Save the job's state as verl's ``step`` under ``directory``; returns its weights."""
    import torch

    os.makedirs(directory, exist_ok=True)
    run(backend.save_checkpoint(directory, step))
    ckpt = os.path.join(directory, f"checkpoint-{step}")
    tag = open(os.path.join(ckpt, "latest")).read().strip()
    return torch.load(os.path.join(ckpt, tag, "mp_rank_00_model_states.pt"), map_location="cpu", weights_only=True)[
        "module"
    ]


def compare(model: str, workdir: str, port: int) -> dict[str, Any]:
    from arctic_platform.client import ArcticClientConfig
    from arctic_platform.integrations.verl.adapter import ArcticRLClientWrapper  # theirs, unmodified
    from support.aio import run_async as run
    from transformers import AutoTokenizer

    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.remote_client.arctic.client import ArcticBackend  # ours, imported before theirs

    cfg = _config(model, workdir, port)
    tok = AutoTokenizer.from_pretrained(model)
    pad = tok.pad_token_id
    actor_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    ours_a = theirs = None
    try:
        ours_a = ArcticBackend.from_config(cfg)  # one server holds one job set
        handle = ours_a.reconnect_handle()
        theirs = ArcticRLClientWrapper.from_config(
            cfg,
            handle={
                "rl_client_reconnect_config": ArcticClientConfig.model_validate(handle["client_config"]),
                "rl_server_state": None,
            },
        )
        data = _batch(len(tok), pad)
        out: dict[str, Any] = {"rows": ROWS, "temperature": TEMPERATURE}

        def ours_lp(temperature: float) -> Any:
            result = run(
                ours_a.compute_log_prob(
                    data.copy(),
                    ref=False,
                    calculate_entropy=False,
                    rollout_n=2,
                    temperature=temperature,
                    pad_token_id=pad,
                )
            )
            return _response_log_probs(data, result.log_probs)

        def theirs_lp(temperature: float) -> Any:
            from verl.remote_backend.worker_utils import make_njt
            from verl.utils import tensordict_utils as tu

            batch = data.copy()
            tu.assign_non_tensor(batch, temperature=temperature)
            raw = run(
                theirs.compute_log_prob(
                    batch, ref=False, calculate_entropy=False, rollout_n=2, temperature=temperature, pad_token_id=pad
                )
            )
            return _response_log_probs(data, make_njt(data, raw["model_output"]["log_probs"]))

        mask = data["response_mask"].bool()
        ours_t1, theirs_t1 = ours_lp(1.0), theirs_lp(1.0)
        ours_t, theirs_t = ours_lp(TEMPERATURE), theirs_lp(TEMPERATURE)
        out["log_probs_t1_max_abs_diff"] = float((ours_t1 - theirs_t1)[mask].abs().max())
        out["log_probs_t_max_abs_diff"] = float((ours_t - theirs_t)[mask].abs().max())
        out["theirs_t_vs_ours_t1_max_abs_diff"] = float((theirs_t - ours_t1)[mask].abs().max())

        start = os.path.join(workdir, "start")
        initial = _weights_after(ours_a, run, start, step=0)
        update_ours = run(
            ours_a.update_actor(
                data.copy(), actor_config=actor_config, pad_token_id=pad, rollout_n=2, temperature=TEMPERATURE
            )
        )
        after_ours = _weights_after(ours_a, run, os.path.join(workdir, "ours"), step=1)
        run(ours_a.load_checkpoint(start, 0))  # back to the same weights and optimizer state
        update_theirs = run(
            theirs.update_actor(
                data.copy(), actor_config=actor_config, pad_token_id=pad, rollout_n=2, temperature=TEMPERATURE
            )
        )
        after_theirs = _weights_after(ours_a, run, os.path.join(workdir, "theirs"), step=1)

        def scalar(value: Any) -> float:
            return float(value[-1] if isinstance(value, (list, tuple)) else value)

        out["ours"] = {
            "loss": scalar(update_ours.loss) if update_ours.loss is not None else None,
            "grad_norm": scalar(update_ours.metrics["grad_norm"]),
            "metric_names": sorted(update_ours.metrics),
        }
        out["theirs"] = {
            "loss": float(update_theirs["loss"]),
            "grad_norm": scalar(update_theirs["metrics"]["grad_norm"]),
            "metric_names": sorted(update_theirs["metrics"]),
        }
        out["weights_after_max_abs_diff"] = max(float((after_ours[k] - after_theirs[k]).abs().max()) for k in initial)
        out["weights_step_max_abs"] = max(float((after_ours[k] - initial[k]).abs().max()) for k in initial)
        return out
    finally:
        if theirs is not None:
            theirs._client = None  # re-attached: the jobs are ours to destroy, not their client's
        if ours_a is not None:
            run(ours_a.destroy())


def table(result: dict[str, Any]) -> str:
    ours, theirs = result["ours"], result["theirs"]
    rows = [
        ("forward log-probs at temperature 1, max abs diff", f"{result['log_probs_t1_max_abs_diff']:.2e}"),
        (
            f"forward log-probs at temperature {result['temperature']}, max abs diff",
            f"{result['log_probs_t_max_abs_diff']:.2e} (theirs vs ours at temperature 1: "
            f"{result['theirs_t_vs_ours_t1_max_abs_diff']:.2e})",
        ),
        ("update loss (ours / theirs)", f"{ours['loss']} / {theirs['loss']}"),
        ("grad norm (ours / theirs)", f"{ours['grad_norm']:.6g} / {theirs['grad_norm']:.6g}"),
        (
            "weights after the step, max abs diff",
            f"{result['weights_after_max_abs_diff']:.2e} (the step itself: {result['weights_step_max_abs']:.2e})",
        ),
        ("metric names only in ours", ", ".join(sorted(set(ours["metric_names"]) - set(theirs["metric_names"])))),
        ("metric names only in theirs", ", ".join(sorted(set(theirs["metric_names"]) - set(ours["metric_names"])))),
    ]
    return "\n".join(["| | value |", "|---|---|", *[f"| {a} | {b} |" for a, b in rows]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="a running stand-in (tests/arctic_standin/server.py)")
    parser.add_argument("--model", required=True, help="a local model directory (e.g. the tests' tiny Qwen2)")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--table", action="store_true", help="also print the Markdown table")
    args = parser.parse_args(argv)
    result = compare(args.model, args.workdir, args.port)
    print(json.dumps(result))
    if args.table:
        print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
