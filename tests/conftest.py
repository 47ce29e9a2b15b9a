"""Fixtures shared across the suite: the tiny model, a Ray session, and the entry-point runs that
several test modules assert on (pytest finds them here)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import pytest
from support.fault_ledger import LEDGER as FAULT_LEDGER
from support.remote_e2e import (
    LEGACY_TRAINER_ON_091,
    SUPPORT_DIR,
    THIRTY_STEPS,
    RunResult,
    build_gsm8k,
    external_modules_env,
    run_entry,
    small_ci_overrides,
    soak_overrides,
    verl_grpo_gsm8k_line,
)
from support.shared_runs import once_per_session
from support.time_report import TIERS

from verl.remote_backend.reliability.server_process import ServerProcess

#: Whatever a test starts ends with the run, also a killed one (support/reaping.py); where the time
#: went, per tier and file, at the end (support/time_report.py); no test skips for a missing extra
#: under the test command (support/no_silent_skips.py).
pytest_plugins = ["support.reaping", "support.time_report", "support.no_silent_skips"]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A tiny random Qwen2 model + tokenizer on disk, built once per session (all workers share it)."""
    from verl.remote_backend.testing.tiny_model import build_tiny_model

    return once_per_session(
        tmp_path_factory, "tiny-model", lambda: build_tiny_model(str(tmp_path_factory.mktemp("local_backend_tiny")))
    )


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray cluster for the module, unless one is already running (then it is shared)."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()
        assert not ray.is_initialized()


@dataclass(frozen=True)
class SharedRun:
    """One finished entry-point run that several tests assert on: the result, its checkpoint folder,
    and verl's ``latest_checkpointed_iteration.txt`` as the run left it (a later run that resumes
    into the same folder overwrites the file)."""

    result: RunResult
    ckpt: Path
    latest_checkpoint: Optional[str]

    @classmethod
    def finished(cls, result: RunResult, ckpt: Path) -> "SharedRun":
        latest = ckpt / "latest_checkpointed_iteration.txt"
        return cls(result, ckpt, latest.read_text().strip() if latest.is_file() else None)


#: Steps of verl's GRPO line per backend: 2 for ``local`` (test_e2e_grpo_gsm8k asserts on two
#: steps and the checkpoint of the last), 1 for the third-party adapter (its tests need one step).
VERL_LINE_STEPS = {"local": 2, "my-engine": 1}


@pytest.fixture(scope="session")
def small_gsm8k_assets(tmp_path_factory, tiny_model_dir) -> dict[str, str]:
    """``{"model", "train", "test"}``: the session's tiny model and a gsm8k subset of 8 train / 4 test
    prompts (two steps of 4), built once; runs only read them."""
    build = lambda: build_gsm8k(tmp_path_factory.mktemp("small_gsm8k"), max_train=8, max_test=4)
    train, test = once_per_session(tmp_path_factory, "small-gsm8k", build)
    return {"model": tiny_model_dir, "train": train, "test": test}


@pytest.fixture(scope="session")
def verl_grpo_line_run(tmp_path_factory, small_gsm8k_assets) -> Callable[[str], SharedRun]:
    """``run(backend)``: verl's GRPO-on-gsm8k command line (``remote_e2e.verl_grpo_gsm8k_line``)
    with ``trainer.remote_backend=backend``, run through the entry point at most once per backend
    per session (across pytest-xdist workers: ``support/shared_runs.py``); every later call returns
    the same finished run. ``my-engine`` is the adapter of
    ``tests/support/third_party_adapter.py``, made known through ``VERL_USE_EXTERNAL_MODULES``.

    One trainer run costs minutes on 2 cores, so the modules that assert on the same run share it
    (test_derived_settings, test_e2e_grpo_gsm8k, test_third_party_adapter_e2e). The run's
    return code is not checked here: each test asserts it, with the run's output."""
    runs: dict[str, SharedRun] = {}

    def build(backend: str) -> SharedRun:
        root = tmp_path_factory.mktemp(f"verl_line_{backend}")
        line = verl_grpo_gsm8k_line(
            model=small_gsm8k_assets["model"],
            train=small_gsm8k_assets["train"],
            test=small_gsm8k_assets["test"],
            ckpt_dir=root / "ckpt",
            backend=backend,
            steps=VERL_LINE_STEPS[backend],
        )
        env = {"WANDB_MODE": "offline"}
        if backend == "my-engine":
            from support.credentials import TEST_TOKEN, TOKEN_KEY  # not the adapter: it would register here

            env.update(external_modules_env("support.third_party_adapter"))
            line = [*line, f"{TOKEN_KEY}={TEST_TOKEN}"]  # a credential: test_security greps for it
        return SharedRun.finished(run_entry(line, workdir=root / "run", env_extra=env), root / "ckpt")

    def run(backend: str) -> SharedRun:
        if backend not in runs:
            runs[backend] = once_per_session(tmp_path_factory, f"verl-line-{backend}", lambda: build(backend))
        return runs[backend]

    return run


@pytest.fixture(scope="session")
def gsm8k_assets(tmp_path_factory, tiny_model_dir) -> dict[str, str]:
    """``{"model", "train", "test"}``: the session's tiny model and the default gsm8k subset of
    ``remote_e2e.build_gsm8k`` (32 train / 8 test prompts), built once; runs only read them."""
    train, test = once_per_session(
        tmp_path_factory, "gsm8k", lambda: build_gsm8k(tmp_path_factory.mktemp("gsm8k_assets"))
    )
    return {"model": tiny_model_dir, "train": train, "test": test}


@dataclass(frozen=True)
class SeededRunSpec:
    """One run of :func:`seeded_local_run`: how many steps, through which backend, saving how often,
    resuming or not, and whose checkpoint folder it writes (its own unless ``ckpt_of`` names a run)."""

    steps: int
    backend: str = "local"
    save_freq: int = 2
    resume_mode: str = "disable"
    ckpt_of: str = ""
    extra: tuple[str, ...] = ()


#: ``first``: a fresh 4-step run. ``head`` + ``tail``: the same run interrupted after step 2 and
#: resumed to step 4 (``trainer.resume_mode=auto``); ``head`` is also the second fresh run with the
#: same seeds, compared with ``first`` on steps 1-2 and the step-2 weights. They go
#: through ``local-resume-probe`` (tests/support/resume_probe_backend.py: the local backend plus a dump of
#: the state it holds right after loading) and save every step, so test_resume_e2e can compare the
#: restored state with the saved one on the very runs test_reproducibility_e2e compares with ``first``.
SEEDED_RUNS = {
    "first": SeededRunSpec(steps=4),
    "head": SeededRunSpec(steps=2, backend="local-resume-probe", save_freq=1),
    "tail": SeededRunSpec(steps=4, backend="local-resume-probe", save_freq=1, resume_mode="auto", ckpt_of="head"),
    # ``head`` with verl's bypass mode (old log-probs = the sampler's): test_bypass_mode_e2e compares the two
    "bypass": SeededRunSpec(steps=2, save_freq=1, extra=("algorithm.rollout_correction.bypass_mode=true",)),
    # ``head`` on verl 0.9.1's legacy trainer: test_e2e_grpo_v1 compares it with ``head`` on the V1 default
    "legacy091": SeededRunSpec(steps=2, backend="local-resume-probe", save_freq=1, extra=(LEGACY_TRAINER_ON_091,)),
}


def seeded_overrides(assets: dict[str, str], ckpt: Path, spec: SeededRunSpec, rollouts: Path) -> list[str]:
    """The small-CI overrides of a seeded run: ``data.seed=7``, a visible learning rate and a reward
    that varies within each GRPO group (tests/support/toy_reward.py), so every step really trains; verl
    writes each step's samples to ``rollouts/<step>.jsonl`` (``trainer.rollout_data_dir``)."""
    base = small_ci_overrides(
        model=assets["model"],
        train=assets["train"],
        test=assets["test"],
        ckpt_dir=ckpt,
        steps=spec.steps,
        save_freq=spec.save_freq,
        backend=spec.backend,
    )
    return [o for o in base if not o.startswith("trainer.resume_mode=")] + [
        f"trainer.resume_mode={spec.resume_mode}",
        "data.seed=7",  # verl's prompt shuffle; each sample's stream derives from it too
        "actor_rollout_ref.actor.optim.lr=1e-3",
        f"reward.custom_reward_function.path={SUPPORT_DIR / 'toy_reward.py'}",
        "reward.custom_reward_function.name=digit_share",
        f"trainer.rollout_data_dir={rollouts}",
        *spec.extra,
    ]


@pytest.fixture(scope="session")
def seeded_local_run(tmp_path_factory, gsm8k_assets) -> Callable[[str], SharedRun]:
    """``run(name)`` for a name of :data:`SEEDED_RUNS`: that entry-point run, started at most once per
    session, across workers (``tail`` runs ``head`` first: it resumes from head's checkpoint); later
    calls return the finished run. Shared by test_reproducibility_e2e and test_resume_e2e. Return
    codes are the tests' to check."""
    probe_env = external_modules_env("support.resume_probe_backend")
    root = tmp_path_factory.mktemp("seeded_runs")
    runs: dict[str, SharedRun] = {}

    def build(name: str) -> SharedRun:
        spec = SEEDED_RUNS[name]
        # a resumed run writes into the folder of the run it resumes, wherever that was made
        ckpt = run(spec.ckpt_of).ckpt if spec.ckpt_of else root / name / "ckpt"
        env = probe_env if spec.backend == "local-resume-probe" else None
        overrides = seeded_overrides(gsm8k_assets, ckpt, spec, rollouts=root / name / "rollouts")
        return SharedRun.finished(run_entry(overrides, workdir=root / name, env_extra=env), ckpt)

    def run(name: str) -> SharedRun:
        if name not in runs:
            runs[name] = once_per_session(tmp_path_factory, f"seeded-{name}", lambda: build(name))
        return runs[name]

    return run


@dataclass(frozen=True)
class SampledRun:
    """A finished entry-point run and the per-process samples taken while it ran (``StepSampler``)."""

    result: RunResult
    sampler: object


@pytest.fixture(scope="session")
def thirty_step_run(tmp_path_factory, gsm8k_assets) -> SampledRun:
    """One 30-step GRPO run through the entry point (local backend, tiny model, a reward the model can
    learn and that varies within groups), its processes sampled every 2 steps. Two modules assert on
    it: test_learning_toy_task (the reward rises) and test_soak_e2e (no process keeps growing); one
    run serves both, across pytest-xdist workers, as it costs about a minute of both cores. Return
    code: the tests' to check."""
    from verl.remote_backend.testing.soak import StepSampler

    root = tmp_path_factory.mktemp("thirty_steps")
    sampler = StepSampler(2)
    overrides = soak_overrides(
        model=gsm8k_assets["model"],
        train=gsm8k_assets["train"],
        test=gsm8k_assets["test"],
        ckpt_dir=root / "ckpt",
        steps=THIRTY_STEPS,
        rollout_n=4,
        lr=5e-3,
    )
    build = lambda: SampledRun(run_entry(overrides, workdir=root / "run", timeout_s=1400, monitor=sampler), sampler)
    return once_per_session(tmp_path_factory, "thirty-steps", build)


@dataclass(frozen=True)
class ArcticStandIn:
    """A running Arctic RL stand-in server (tests/arctic_standin): its port, base URL and process."""

    port: int
    url: str
    process: ServerProcess

    def calls(self) -> dict[str, int]:
        """Calls per endpoint since the server started (the stand-in's ``GET /_standin/calls``)."""
        import requests

        return requests.get(f"{self.url}/_standin/calls", timeout=10).json()

    def jobs(self) -> dict:
        """The jobs the server holds now (Arctic's ``GET /status``)."""
        import requests

        return requests.get(f"{self.url}/status", timeout=10).json()["jobs"]


@pytest.fixture(scope="session")
def standin_server(tmp_path_factory) -> ArcticStandIn:
    """One Arctic RL stand-in server for the session, started with the adapter's own launcher
    (1 training, 1 sampling and 1 log-prob "GPU", colocated). Starting one imports Arctic, DeepSpeed
    and torch (tens of seconds on 2 cores), so the modules that talk to an already running server
    share it; each creates its own jobs and destroys them, and reads call counts as differences.
    Tests that launch, kill or freeze a server start their own."""
    from arctic_standin.harness import free_port, start_standin

    port = free_port()
    process = start_standin(port, str(tmp_path_factory.mktemp("arctic_standin") / "logs"), log_prob_gpus=1)
    try:
        yield ArcticStandIn(port, f"http://127.0.0.1:{port}", process)
    finally:
        process.stop()
    assert not process.alive()


# ---------------------------------------------------------------- tiers
#: Tier folders: the tier of a test in them that is not marked ``slow`` (``slow`` is always e2e). A
#: file lives in the folder of its heaviest test: ``pytest tests/unit`` runs unit tests only,
#: ``tests/integration`` no e2e test, ``tests/e2e`` the files that run verl's trainer or a
#: multi-minute engine (with their quicker neighbours, which need the same module fixtures).
FOLDERTIERS = {"unit": "unit", "integration": "integration", "e2e": "integration"}
#: Folders of one kind of test across tiers: a module there states its tier (``TEST_TIER``, default unit).
CROSS_TIER_FOLDERS = ("faults",)


def _default_tier(item) -> str:
    folder = item.path.parent.name
    if folder in FOLDERTIERS:
        if hasattr(item.module, "TEST_TIER"):
            raise pytest.UsageError(
                f"{item.path}: a file in tests/{folder}/ takes its tier from the folder (drop TEST_TIER)"
            )
        return FOLDERTIERS[folder]
    if folder in CROSS_TIER_FOLDERS:
        return getattr(item.module, "TEST_TIER", "unit")
    raise pytest.UsageError(
        f"{item.path}: every test file lives in a tier folder ({', '.join(f'tests/{f}/' for f in FOLDERTIERS)}) "
        f"or in {', '.join(f'tests/{f}/' for f in CROSS_TIER_FOLDERS)}"
    )


def pytest_collection_modifyitems(config, items):
    """Every test gets exactly one tier marker (``-m unit`` / ``integration`` / ``e2e``): tests
    marked ``slow`` are the e2e tier; otherwise a test's own tier marker, else its folder's tier
    (:data:`FOLDERTIERS`). A test whose tier is heavier than its folder's is refused: the folders
    are what a developer runs by path."""
    for item in items:
        explicit = [tier for tier in TIERS if item.get_closest_marker(tier)]
        if item.get_closest_marker("slow"):
            tier = "e2e"
        else:
            tier = explicit[0] if explicit else _default_tier(item)
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.module.__name__}.TEST_TIER={tier!r}: expected one of {TIERS}")
        if set(explicit) - {tier}:
            raise pytest.UsageError(f"{item.nodeid}: marked {explicit} but its tier is {tier!r} (one tier per test)")
        folder = item.path.parent.name
        if folder in FOLDERTIERS and folder != "e2e" and TIERS.index(tier) > TIERS.index(folder):
            raise pytest.UsageError(f"{item.nodeid}: a {tier} test in tests/{folder}/ (move its file to tests/{tier}/)")
        if tier not in explicit:
            item.add_marker(tier)
    _slow_modules_first(items)


def _slow_modules_first(items: list) -> None:
    """Order whole modules by how many slow tests they hold, most first (a stable sort: ties and
    the modules with none keep their order, and so do the tests within a module).

    Under pytest-xdist's ``--dist loadfile`` (``scripts/run_tests.sh``) files are dealt out in this
    order, so the long files (the conformance kit, the Tinker server, the slow faults) start first
    and the short ones fill both workers at the end, instead of a multi-minute file running alone
    after everything else is done."""
    slow_count: dict = {}
    for item in items:
        slow_count.setdefault(item.path, 0)
        if item.get_closest_marker("slow"):
            slow_count[item.path] += 1
    items.sort(key=lambda item: -slow_count[item.path])


# ---------------------------------------------------------------- parallel workers (pytest-xdist)
def pytest_sessionfinish(session) -> None:
    """On a pytest-xdist worker: hand this worker's fault ledger to the controller."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["fault_ledger"] = FAULT_LEDGER.as_dict()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """On the pytest-xdist controller: add up the workers' fault ledgers."""
    ledger = getattr(node, "workeroutput", {}).get("fault_ledger")
    if ledger:
        FAULT_LEDGER.add(ledger)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """The fault-injection summary (tests/faults): every injected fault and how it ended."""
    if FAULT_LEDGER.injected:
        terminalreporter.write_sep("=", "fault-injection summary")
        for name, verdict, seconds in FAULT_LEDGER.cases:
            terminalreporter.write_line(f"  {verdict:<24} {seconds:6.2f}s  {name}")
        terminalreporter.write_line(FAULT_LEDGER.line())
