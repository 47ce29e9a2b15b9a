"""Helpers of the integration tests: assets, small-CI overrides, and entry-point runs.

End-to-end tests run ``python -m verl.remote_backend.main_ppo`` in a child
process - the real entry point, a fresh Ray cluster that dies with the child,
nothing leaking into pytest - and read verl's per-step metrics from verl's own
``file`` logger (``VERL_FILE_LOGGER_PATH``). While the child runs, the summed
PSS (proportional set size) of its process tree (driver, Ray daemons, workers, engine) is sampled.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[2]
#: On every run's PYTHONPATH: ``support.*`` (adapters, rewards) import from here.
TESTS_DIR = Path(__file__).resolve().parents[1]
SUPPORT_DIR = Path(__file__).resolve().parent
GSM8K_DIR = REPO_ROOT.parent / "shared" / "data" / "gsm8k"

#: The metrics the issue requires after every GRPO step.
REQUIRED_STEP_METRICS = (
    "actor/pg_loss",
    "actor/grad_norm",
    "actor/mfu",
    "critic/score/mean",
    "response_length/mean",
    "timing_s/gen",
    "timing_s/update_actor",
)
#: The same metrics under the names verl's loggers write them (MFU as ``perf/mfu/actor``).
LOGGED_STEP_METRICS = tuple("perf/mfu/actor" if key == "actor/mfu" else key for key in REQUIRED_STEP_METRICS)


def build_model(out_dir: Path) -> str:
    """The tiny Qwen2 + tokenizer (seconds on CPU)."""
    from verl.remote_backend.testing.tiny_model import build_tiny_model

    return build_tiny_model(str(out_dir))


def external_modules_env(module: str) -> dict[str, str]:
    """The environment that makes every process of a run import ``tests/<module>.py`` through verl's
    ``VERL_USE_EXTERNAL_MODULES`` hook (the documented way to register an adapter from outside)."""
    return {
        "VERL_USE_EXTERNAL_MODULES": module,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")])),
    }


def load_example(name: str):
    """``examples/gsm8k_remote/<name>.py`` as a module (examples/ is not a package)."""
    path = REPO_ROOT / "examples" / "gsm8k_remote" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_gsm8k(
    out_dir: Path, *, max_train: int = 32, max_test: int = 8, max_question_chars: int = 160
) -> tuple[str, str]:
    """A short-question gsm8k subset in verl's parquet layout; returns (train, test) paths."""
    prepare = load_example("prepare_gsm8k")
    rc = prepare.main(
        [
            "--input-dir",
            str(GSM8K_DIR),
            "--output-dir",
            str(out_dir),
            "--max-train",
            str(max_train),
            "--max-test",
            str(max_test),
            "--max-question-chars",
            str(max_question_chars),
        ]
    )
    assert rc == 0
    return str(out_dir / "train.parquet"), str(out_dir / "test.parquet")


@dataclass(frozen=True)
class ReleaseSwitch:
    """The key of verl's config that only one release has and the remote path requires: verl 0.7.1's
    worker-path switch, verl 0.9.1's V1 trainer mode. ``refused``: an explicit value it refuses.
    ``derived``: ``(key, verl's value, remote value)`` of the keys only this release derives on
    verl's GRPO line (0.9.1: the V1 trainer's mode is already ``sync``; TransferQueue's storage
    units shrink to one)."""

    key: str
    verl_default: Any
    remote_value: Any
    refused: str
    derived: frozenset = frozenset()


def release_switch() -> ReleaseSwitch:
    """The :class:`ReleaseSwitch` of the installed verl."""
    from verl.remote_backend.verl_versions import installed_verl_version

    if installed_verl_version() == "0.7.1":
        key = "trainer.use_legacy_worker_impl"
        return ReleaseSwitch(key, "auto", "disable", "enable", frozenset({(key, "auto", "disable")}))
    storage_units = ("transfer_queue.backend.SimpleStorage.num_data_storage_units", 8, 1)
    return ReleaseSwitch("trainer.v1.trainer_mode", "sync", "sync", "colocate_async", frozenset({storage_units}))


#: Runs verl 0.9.1's legacy trainer (``main_ppo_v0``'s ``RayPPOTrainer``) instead of its V1 default.
LEGACY_TRAINER_ON_091 = "trainer.use_v1=false"


def _release_overrides() -> tuple[str, ...]:
    switch = release_switch()
    return (f"{switch.key}={str(switch.remote_value).lower()}",)


#: The smallest remote-backend run: the switch plus what verl's CPU-only remote path needs (verl's
#: new worker implementation, CPU, one forwarder, the ``remote`` rollout with one replica), GRPO,
#: and no resume. Tests that compose configs or run the entry point start from these.
REMOTE_BASE_OVERRIDES = (
    "trainer.remote_backend=local",
    *_release_overrides(),
    "trainer.device=cpu",
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
    "actor_rollout_ref.rollout.name=remote",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "algorithm.adv_estimator=grpo",
    "trainer.resume_mode=disable",
)


#: Test runs start Ray without its dashboard: nothing here reads it, and on a 2-core machine its
#: start-up costs ~10 s of every run (ray.init 17.6 s with it, 7.2 s without, measured under load).
NO_RAY_DASHBOARD = "+ray_kwargs.ray_init.include_dashboard=false"


def remote_base_overrides(backend: str = "local") -> list[str]:
    """:data:`REMOTE_BASE_OVERRIDES` with ``trainer.remote_backend=backend``."""
    return [f"trainer.remote_backend={backend}", *REMOTE_BASE_OVERRIDES[1:]]


def small_ci_overrides(
    *,
    model: str,
    train: str,
    test: str,
    ckpt_dir: Path,
    steps: int,
    backend: str = "local",
    batch_size: int = 4,
    rollout_n: int = 2,
    prompt_len: int = 192,
    response_len: int = 16,
    save_freq: int = -1,
) -> list[str]:
    """Hydra overrides for a few fast GRPO steps on CPU: tiny batches and lengths, one agent-loop
    and one reward worker, no validation, and verl's ``file`` logger on so :func:`run_entry` can read the metrics."""
    return remote_base_overrides(backend) + [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={train}",
        f"data.val_files={test}",
        f"data.train_batch_size={batch_size}",
        f"data.max_prompt_length={prompt_len}",
        f"data.max_response_length={response_len}",
        "data.truncation=left",
        "data.filter_overlong_prompts=true",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.rollout.n={rollout_n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch_size}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={batch_size * rollout_n}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={batch_size * rollout_n}",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        "trainer.logger=[console,file]",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        f"trainer.total_training_steps={steps}",
        f"trainer.save_freq={save_freq}",
        f"trainer.default_local_dir={ckpt_dir}",
        "trainer.project_name=vrb_tests",
        "trainer.experiment_name=e2e",
        NO_RAY_DASHBOARD,
    ]


#: Steps of the suite's 30-step run (conftest ``thirty_step_run``: 4 prompts x 4 samples of 16 tokens,
#: lr 5e-3, the digit-share reward), which test_learning_toy_task and test_soak_e2e assert on.
THIRTY_STEPS = 30


def soak_overrides(
    *,
    model: str,
    train: str,
    test: str,
    ckpt_dir: Path,
    steps: int,
    batch_size: int = 4,
    rollout_n: int = 2,
    response_len: int = 16,
    lr: float = 1e-4,
) -> list[str]:
    """:func:`small_ci_overrides` for a long run (the soak benchmark and its CI version): ``steps``
    steps end it, not the data (verl loops over the prompts for as many epochs as it takes), no
    checkpoints, and a reward that varies within each GRPO group (tests/support/toy_reward.py) so that every
    update really changes the weights the sampler uses, as in a real run."""
    base = small_ci_overrides(
        model=model,
        train=train,
        test=test,
        ckpt_dir=ckpt_dir,
        steps=steps,
        batch_size=batch_size,
        rollout_n=rollout_n,
        response_len=response_len,
    )
    return base + [
        "trainer.total_epochs=100000",
        f"actor_rollout_ref.actor.optim.lr={lr}",
        f"reward.custom_reward_function.path={SUPPORT_DIR / 'toy_reward.py'}",
        "reward.custom_reward_function.name=digit_share",
    ]


def verl_grpo_gsm8k_line(
    *,
    model: str,
    train: str,
    test: str,
    ckpt_dir: Path,
    backend: str,
    steps: int = 1,
    batch_size: int = 4,
    rollout_n: int = 2,
) -> list[str]:
    """verl's own GRPO-on-gsm8k command line (its ``examples/grpo_trainer`` Qwen2 script: vLLM
    rollout with tensor parallel 2, FSDP actor, KL loss, 8 GPUs per node), with only the model and
    data paths and the batch/length/step sizes changed for a CPU box, plus ``trainer.remote_backend``.
    The sizes include verl's worker-process counts: one agent-loop worker, one reward worker and no
    dataloader workers instead of verl's default 8 each (on 2 cores each extra Ray worker costs
    ~10 s of imports at start-up and again at the first validation; the count is a machine size,
    not something the remote path derives). Every other key is verl's, including the ones that
    describe verl's own GPU engines: the entry point derives what the remote path needs
    (``trainer.logger`` keeps wandb; run with ``WANDB_MODE=offline``). Like the script, the line
    validates before training and at the last step and checkpoints at the last step (verl does
    both at ``is_last_step`` whatever ``test_freq``/``save_freq`` say).
    ``trainer.default_local_dir`` keeps the run's files in the test folder."""
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={train}",
        f"data.val_files={test}",
        f"data.train_batch_size={batch_size}",
        "data.max_prompt_length=192",
        "data.max_response_length=16",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.model.use_remove_padding=True",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch_size}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={batch_size * rollout_n}",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={batch_size * rollout_n}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        f"actor_rollout_ref.rollout.n={rollout_n}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={batch_size * rollout_n}",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        'trainer.logger=["console","wandb"]',
        "trainer.project_name=verl_grpo_example_gsm8k",
        "trainer.experiment_name=qwen2_7b_function_rm",
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=1",
        "trainer.save_freq=20",
        "trainer.test_freq=5",
        "trainer.total_epochs=15",
        f"trainer.total_training_steps={steps}",
        f"trainer.default_local_dir={ckpt_dir}",
        f"trainer.remote_backend={backend}",
        # sizes for this machine (see the docstring): verl's defaults are 8 each
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        "data.dataloader_num_workers=0",
    ]


def compose(overrides: Sequence[str]):
    """The entry point's composed config for ``overrides`` (no Ray, nothing started)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    with initialize_config_module("verl.remote_backend.config", version_base=None):
        return hydra_compose("remote_ppo_trainer", overrides=list(overrides))


@dataclass
class RunResult:
    returncode: int
    output: str
    metrics: list[dict[str, Any]]
    wall_s: float
    peak_pss_gb: float
    log_path: Path = field(default=Path())

    def step(self, n: int) -> dict[str, Any]:
        for entry in self.metrics:
            if entry["step"] == n:
                return entry["data"]
        raise AssertionError(f"no metrics logged for step {n}; steps: {[m['step'] for m in self.metrics]}")

    def console_step(self, n: int) -> dict[str, float]:
        """Step ``n``'s metrics as verl's ``console`` logger printed them (``step:N - key:value - ...``),
        for runs whose ``trainer.logger`` has no ``file`` logger."""
        step_metrics = load_example("console_filter").step_metrics
        for line in self.output.splitlines():
            parsed = step_metrics(line)
            if parsed and parsed[0] == n:
                return parsed[1]
        raise AssertionError(f"verl printed no metrics line for step {n}")

    def console_steps(self) -> list[int]:
        """The steps of verl's ``console`` metrics lines, in the order printed (0: validation before training)."""
        step_metrics = load_example("console_filter").step_metrics
        return [parsed[0] for parsed in map(step_metrics, self.output.splitlines()) if parsed]

    def tail(self, chars: int = 6000) -> str:
        return self.output[-chars:]


def _tree(pid: int) -> list:
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _pss(procs: list) -> int:
    """Summed proportional set size: shared pages (torch, CUDA libs) counted once overall."""
    import psutil

    total = 0
    for proc in procs:
        try:
            info = proc.memory_full_info()
            total += getattr(info, "pss", info.rss)
        except psutil.Error:
            pass
    return total


def _reap(procs: dict) -> None:
    """Stop processes this run started (seen in the child's tree) that outlived it, by pid."""
    import psutil

    alive = [p for p in procs.values() if p.is_running()]
    for proc in alive:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, still = psutil.wait_procs(alive, timeout=10)
    for proc in still:
        try:
            proc.kill()
        except psutil.Error:
            pass


def run_entry(
    overrides: Sequence[str],
    *,
    workdir: Path,
    env_extra: Optional[dict[str, str]] = None,
    timeout_s: float = 900,
    monitor: Optional[Callable[[int, Path], None]] = None,
) -> RunResult:
    """Run the entry point in a child process; collect output, metrics, wall time, peak memory.

    ``monitor(child_pid, metrics_path)``, when given, is called about once a second from the
    thread that samples memory while the child runs (a soak run samples its processes there at
    step boundaries, which it reads from ``metrics_path``, verl's file logger); an exception it
    raises ends the run's monitoring and is raised here once the child has exited."""
    metrics_path = workdir / "metrics.jsonl"
    log_path = workdir / "run.log"
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        {
            "VERL_FILE_LOGGER_PATH": str(metrics_path),
            "HYDRA_FULL_ERROR": "1",
            "RAY_DEDUP_LOGS": "0",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    env.update(env_extra or {})
    if not any("include_dashboard" in item for item in overrides):
        overrides = [*overrides, NO_RAY_DASHBOARD]
    cmd = [sys.executable, "-m", "verl.remote_backend.main_ppo", f"hydra.run.dir={workdir}/hydra", *overrides]
    peak = 0
    seen: dict = {}
    monitor_error: list[BaseException] = []
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                procs = _tree(proc.pid)
                seen.update({p.pid: p for p in procs})
                peak = max(peak, _pss(procs))
                if monitor is not None and not monitor_error:
                    try:
                        monitor(proc.pid, metrics_path)
                    except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                        monitor_error.append(exc)
                stop.wait(1.0)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        finally:
            wall = time.monotonic() - start
            stop.set()
            sampler.join()
            _reap(seen)
    if monitor_error:
        raise monitor_error[0]
    metrics = []
    if metrics_path.exists():
        metrics = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    return RunResult(rc, log_path.read_text(errors="replace"), metrics, wall, peak / 2**30, log_path)
