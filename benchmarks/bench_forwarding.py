"""Row 1 - forwarding overhead: the forwarder worker group vs a direct call to the backend's actor.

The backend is ``bench-null`` (:mod:`benchmarks.null_backend`): the local
backend's client in front of an actor that returns zeros, so only transport is
timed. Two variants of each op, interleaved, on the same TensorDict that
verl's trainer sends (``left_right_2_no_padding`` output plus its non-tensor
fields):

* **forwarded** - ``wg.compute_log_prob(td)`` / ``wg.update_actor(td)`` on a
  verl ``RayWorkerGroup`` of one :class:`RemoteBackendWorker` on a CPU pool,
  built as the trainer builds it (colocated worker class, ``spawn``), with
  verl's dispatch (chunk + ``ray.put``) and collect, then ``tu.get`` of the
  outputs the trainer reads;
* **direct** - from the driver straight to the actor, the fastest of
  ``ray.get(actor.<op>.remote(td, ...))`` (Ray serialises the argument),
  ``ray.get(actor.<op>.remote(ray.put(td), ...))`` (the same with an explicit
  object) and ``ray.get(actor.<op>.remote(ray.put(to_wire(td)), ...))`` (the
  plugin's own wire format, tensors as numpy buffers), each timed separately:
  the reference is the best a caller without the forwarder gets, including the
  serialisation speed-up the forwarder itself uses.

ratio = forwarded / direct (target <= 1.25x). The driver runs torch single-
threaded, as verl's trainer driver does (a Ray actor with one CPU).

Usage: ``python -m benchmarks.bench_forwarding [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from typing import Any, Sequence

from benchmarks.common import Result, format_table, nested_verl_batch, time_interleaved

TARGET = 1.25

#: (batch, prompt width, response width) per size; full and --quick sets.
SIZES = [(64, 256, 256), (256, 512, 512), (1024, 256, 768)]
QUICK_SIZES = [(64, 256, 256), (256, 512, 512)]
SMOKE_SIZES = [(8, 16, 16)]


def compose_config(model_dir: str, backend: str, extra: Sequence[str] = ()):
    """The entry point's composed config (verl's ``ppo_trainer`` + ours) for a one-forwarder run,
    plus ``extra`` Hydra overrides."""
    from hydra import compose, initialize_config_module

    with initialize_config_module("verl.remote_backend.config", version_base=None):
        return compose(
            "remote_ppo_trainer",
            overrides=[
                f"trainer.remote_backend={backend}",
                "trainer.device=cpu",
                "trainer.n_gpus_per_node=1",
                f"actor_rollout_ref.model.path={model_dir}",
                "actor_rollout_ref.rollout.n=1",
                "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                *extra,
            ],
        )


def build_forwarder_group(config: Any, handle: dict[str, Any]):
    """One :class:`RemoteBackendWorker` in a verl worker group on a CPU pool, as the trainer builds it."""
    import ray

    from verl.remote_backend.forwarder.worker import RemoteBackendWorker
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.single_controller.ray.base import create_colocated_worker_cls

    role = "actor_rollout"
    cls = RayClassWithInitArgs(cls=ray.remote(RemoteBackendWorker), config=config.actor_rollout_ref, role=role)
    pool = RayResourcePool(process_on_nodes=[1], use_gpu=False, max_colocate_count=1, name_prefix="bench_fwd")
    group = RayWorkerGroup(
        resource_pool=pool, ray_cls_with_init=create_colocated_worker_cls({role: cls}), device_name="cpu"
    )
    wg = group.spawn(prefix_set={role})[role]
    wg.init_model()
    wg.attach_backend(config, handle)
    return wg


def run(sizes: Sequence[tuple[int, int, int]], *, repeats: int = 7, model_dir: str | None = None) -> list[Result]:
    """Time both variants of ``compute_log_prob`` and ``update_actor`` at each size.

    Expects Ray to be initialised with :func:`benchmarks.null_backend.worker_env`
    in the job's ``runtime_env`` (``benchmarks.run`` does it).
    """
    import ray

    from benchmarks.null_backend import NAME
    from verl.remote_backend.registry import RemoteBackendRegistry
    from verl.remote_backend.testing.tiny_model import build_tiny_model
    from verl.remote_backend.transport.wire import to_wire
    from verl.utils import tensordict_utils as tu
    from verl.workers.remote_client.local.objective import to_actor_config

    model_dir = model_dir or build_tiny_model(tempfile.mkdtemp(prefix="bench_fwd_model_"))
    config = compose_config(model_dir, NAME)
    backend = RemoteBackendRegistry.create(NAME, config)
    results: list[Result] = []
    try:
        wg = build_forwarder_group(config, backend.reconnect_handle())
        actor = backend.actor
        actor_config = to_actor_config(config.actor_rollout_ref.actor)
        for batch, prompt, response in sizes:
            td_lp = nested_verl_batch(batch, prompt, response)
            td_up = nested_verl_batch(batch, prompt, response, update=True)
            tokens = int(td_lp["input_ids"].values().shape[0])

            def forwarded_lp() -> None:
                out = wg.compute_log_prob(td_lp)
                tu.get(out, "log_probs"), tu.get(out, "entropy"), tu.get(out, "metrics")

            def direct_lp() -> None:
                ray.get(actor.compute_log_prob.remote(td_lp, ref=False, calculate_entropy=True, temperature=1.0))

            def direct_put_lp() -> None:
                ref = ray.put(td_lp)
                ray.get(actor.compute_log_prob.remote(ref, ref=False, calculate_entropy=True, temperature=1.0))

            def direct_wire_lp() -> None:
                ref = ray.put(to_wire(td_lp))
                ray.get(actor.compute_log_prob.remote(ref, ref=False, calculate_entropy=True, temperature=1.0))

            def forwarded_up() -> None:
                tu.get(wg.update_actor(td_up), "metrics")

            def direct_up() -> None:
                ray.get(actor.update_actor.remote(td_up, actor_config=actor_config, temperature=1.0))

            def direct_put_up() -> None:
                ray.get(actor.update_actor.remote(ray.put(td_up), actor_config=actor_config, temperature=1.0))

            def direct_wire_up() -> None:
                ray.get(actor.update_actor.remote(ray.put(to_wire(td_up)), actor_config=actor_config, temperature=1.0))

            times = time_interleaved(
                {
                    "fwd_lp": forwarded_lp,
                    "dir_lp": direct_lp,
                    "put_lp": direct_put_lp,
                    "wire_lp": direct_wire_lp,
                    "fwd_up": forwarded_up,
                    "dir_up": direct_up,
                    "put_up": direct_put_up,
                    "wire_up": direct_wire_up,
                },
                repeats=repeats,
            )
            # Ray's own serialisation of the TensorDict (as an argument or an explicit object),
            # shown beside the case; the reference is the best direct call, wire format included
            ray_default = {op: min(times.pop(f"dir_{op}"), times.pop(f"put_{op}")) for op in ("lp", "up")}
            for op in ("lp", "up"):
                times[f"dir_{op}"] = min(ray_default[op], times.pop(f"wire_{op}"))
            size = f"B={batch} P={prompt} R={response} T={tokens}"
            for op, key in (("compute_log_prob", "lp"), ("update_actor", "up")):
                forwarded, direct = times[f"fwd_{key}"], times[f"dir_{key}"]
                ratio = forwarded / direct
                results.append(
                    Result(
                        row="1 forwarding",
                        case=f"{op} {size} (direct with Ray's default serialisation: "
                        f"{ray_default[key] * 1e3:.2f} ms = {forwarded / ray_default[key]:.2f}x)",
                        a=forwarded,
                        a_label="forwarder s",
                        b=direct,
                        b_label="direct s",
                        ratio=ratio,
                        target=f"<= {TARGET}x",
                        met=ratio <= TARGET,
                    )
                )
        for worker in wg.workers:  # the group has no teardown of its own
            ray.kill(worker)
    finally:
        asyncio.run(backend.destroy())
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)

    import ray
    import torch

    from benchmarks.null_backend import worker_env

    torch.set_num_threads(1)  # like the trainer's driver (a Ray actor with one CPU); see README
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": worker_env()})
    try:
        print(format_table(run(QUICK_SIZES if args.quick else SIZES, repeats=args.repeats)))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
