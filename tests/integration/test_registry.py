"""RemoteBackendRegistry: lazy built-ins, third-party discovery, helpful errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from verl.remote_backend import BackendImportError, RemoteBackend, RemoteBackendRegistry, UnknownBackendError

pytestmark = pytest.mark.every_verl  # CI runs it on both releases (.ci/run)

# A complete backend whose module registers itself under NAME when imported.
BACKEND_MODULE_SOURCE = textwrap.dedent(
    """
    from verl.remote_backend import RemoteBackend, RemoteBackendRegistry

    @RemoteBackendRegistry.register({name!r})
    class {cls}(RemoteBackend):
        @classmethod
        def from_config(cls, main_config, *, handle=None):
            return cls()
        def reconnect_handle(self):
            return {{}}
        def destroy(self):
            return None
        async def compute_log_prob(self, data, *, ref, calculate_entropy, rollout_n, temperature, pad_token_id):
            return {{}}
        async def update_actor(self, data, *, actor_config, pad_token_id, rollout_n, temperature):
            return {{}}
        async def generate(self, prompt_ids, sampling_params):
            return {{}}
        async def update_weights(self):
            return None
        async def save_checkpoint(self, path=None, step=None):
            return None
        def requires_single_forwarder(self):
            return True
    """
)


def _write_backend_module(directory: Path, name: str, cls: str = "ThirdPartyBackend") -> str:
    module = f"vrb_test_{uuid.uuid4().hex[:8]}"
    (directory / f"{module}.py").write_text(BACKEND_MODULE_SOURCE.format(name=name, cls=cls))
    return module


def _run_python(code: str, *, env_extra: dict[str, str] | None = None, pythonpath: Path | None = None) -> dict:
    """Run ``code`` in a fresh interpreter (clean sys.modules); it prints one JSON line."""
    env = dict(os.environ, **(env_extra or {}))
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def isolated_registry(monkeypatch):
    """Let a test add names and MODULES entries without leaking them."""
    monkeypatch.setattr(RemoteBackendRegistry, "_classes", dict(RemoteBackendRegistry._classes))
    monkeypatch.setattr(RemoteBackendRegistry, "MODULES", dict(RemoteBackendRegistry.MODULES))
    monkeypatch.setattr(RemoteBackendRegistry, "INSTALL_HINTS", dict(RemoteBackendRegistry.INSTALL_HINTS))


def test_importing_the_package_pulls_in_no_heavy_backend_dependency():
    result = _run_python(
        """
        import json, sys
        import verl.remote_backend, verl.workers.remote_client, verl.workers.rollout.remote_rollout
        from verl.remote_backend import RemoteBackendRegistry
        names = RemoteBackendRegistry.list()
        heavy = [m for m in ("arctic_platform", "deepspeed", "vllm") if m in sys.modules]
        adapters = [m for m in sys.modules if m.startswith("verl.workers.remote_client.")]
        print(json.dumps({"heavy": heavy, "adapters": adapters, "names": names}))
        """
    )
    assert result["heavy"] == []
    assert result["adapters"] == []
    assert {"local", "arctic"} <= set(result["names"])


def test_adapter_module_is_imported_only_on_first_get(tmp_path, monkeypatch, isolated_registry):
    module = _write_backend_module(tmp_path, "lazy-one")
    monkeypatch.syspath_prepend(str(tmp_path))
    RemoteBackendRegistry.MODULES["lazy-one"] = module
    assert "lazy-one" in RemoteBackendRegistry.list()
    assert module not in sys.modules
    backend_cls = RemoteBackendRegistry.get("lazy-one")
    assert module in sys.modules
    assert backend_cls.__module__ == module and backend_cls.name == "lazy-one"
    assert RemoteBackendRegistry.get("lazy-one") is backend_cls
    assert isinstance(RemoteBackendRegistry.create("lazy-one", {}), RemoteBackend)


def test_backend_advertised_through_an_entry_point_is_found_by_name(tmp_path):
    # A real (metadata-only) distribution on sys.path: importlib.metadata finds it as pip would.
    module = _write_backend_module(tmp_path, "from-entry-point", cls="EntryPointBackend")
    dist_info = tmp_path / "vrb_test_plugin-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: vrb-test-plugin\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(
        f"[verl.remote_backends]\nfrom-entry-point = {module}:EntryPointBackend\n"
    )
    result = _run_python(
        f"""
        import json, sys
        from verl.remote_backend import RemoteBackendRegistry
        listed = "from-entry-point" in RemoteBackendRegistry.list()
        was_imported = {module!r} in sys.modules
        cls = RemoteBackendRegistry.get("from-entry-point")
        print(json.dumps({{"listed": listed, "was_imported": was_imported, "cls": cls.__name__, "name": cls.name}}))
        """,
        pythonpath=tmp_path,
    )
    assert result == {"listed": True, "was_imported": False, "cls": "EntryPointBackend", "name": "from-entry-point"}


def test_backend_imported_through_verl_use_external_modules_is_found_by_name(tmp_path):
    module = _write_backend_module(tmp_path, "from-env-hook", cls="EnvHookBackend")
    result = _run_python(
        f"""
        import json, sys
        import verl  # verl's own hook imports VERL_USE_EXTERNAL_MODULES here
        imported_by_verl = {module!r} in sys.modules
        from verl.remote_backend import RemoteBackendRegistry
        cls = RemoteBackendRegistry.get("from-env-hook")
        print(json.dumps({{"imported_by_verl": imported_by_verl, "cls": cls.__name__}}))
        """,
        env_extra={"VERL_USE_EXTERNAL_MODULES": module},
        pythonpath=tmp_path,
    )
    assert result == {"imported_by_verl": True, "cls": "EnvHookBackend"}


def test_unknown_name_lists_known_backends_and_how_to_register(isolated_registry):
    with pytest.raises(UnknownBackendError) as info:
        RemoteBackendRegistry.get("no-such-backend")
    message = str(info.value)
    assert "'no-such-backend'" in message
    assert "'local'" in message and "'arctic'" in message
    assert "@RemoteBackendRegistry.register" in message
    assert "VERL_USE_EXTERNAL_MODULES" in message and "verl.remote_backends" in message


def test_failing_adapter_import_reports_its_cause_and_the_install_hint(tmp_path, monkeypatch, isolated_registry):
    module = f"vrb_test_broken_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text("import arctic_platform_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    RemoteBackendRegistry.MODULES["arctic"] = module
    RemoteBackendRegistry.unregister("arctic")  # an earlier test may have imported the real adapter
    RemoteBackendRegistry._classes.pop("arctic", None)  # (a copy) an earlier test may have imported the real adapter
    with pytest.raises(BackendImportError) as info:
        RemoteBackendRegistry.get("arctic")
    message = str(info.value)
    assert module in message
    assert "No module named 'arctic_platform_that_is_not_installed'" in message
    assert "pip install 'verl-remote-backend[arctic]'" in message
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_module_that_does_not_register_its_name_is_reported(tmp_path, monkeypatch, isolated_registry):
    module = _write_backend_module(tmp_path, "some-other-name")
    monkeypatch.syspath_prepend(str(tmp_path))
    RemoteBackendRegistry.MODULES["expected-name"] = module
    with pytest.raises(UnknownBackendError, match=r"register\('expected-name'\)"):
        RemoteBackendRegistry.get("expected-name")


def test_a_plugin_class_takes_a_built_in_name_and_the_built_in_imported_later_leaves_it(
    tmp_path, monkeypatch, isolated_registry
):
    monkeypatch.setitem(RemoteBackendRegistry.MODULES, "vrb-builtin", "vrb_builtin_mod")

    class Builtin(RemoteBackend):  # stands for a built-in: its module is the MODULES entry
        pass

    Builtin.__module__ = "vrb_builtin_mod"

    class Plugin(RemoteBackend):
        pass

    RemoteBackendRegistry.register("vrb-builtin")(Builtin)
    RemoteBackendRegistry.register("vrb-builtin")(Plugin)  # the plugin takes the name over
    assert RemoteBackendRegistry.get("vrb-builtin") is Plugin
    RemoteBackendRegistry.register("vrb-builtin")(Builtin)  # re-imported built-in: the plugin keeps it
    assert RemoteBackendRegistry.get("vrb-builtin") is Plugin

    class OtherPlugin(RemoteBackend):
        pass

    with pytest.raises(ValueError, match="already registered"):  # two plugins still may not share a name
        RemoteBackendRegistry.register("vrb-builtin")(OtherPlugin)


def test_a_different_class_under_a_taken_name_is_refused(tmp_path, monkeypatch, isolated_registry):
    first = _write_backend_module(tmp_path, "taken", cls="First")
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__(first)
    second = _write_backend_module(tmp_path, "taken", cls="Second")
    with pytest.raises(ValueError, match=r"'taken' is already registered to .*First.*Second"):
        __import__(second)


def test_registering_the_same_class_twice_is_harmless(isolated_registry):
    class Twice(RemoteBackend):  # abstract is fine: registration does not instantiate
        pass

    RemoteBackendRegistry.register("twice")(Twice)
    RemoteBackendRegistry.register("twice")(Twice)
    assert RemoteBackendRegistry.get("twice") is Twice


def test_register_rejects_non_backend_classes(isolated_registry):
    with pytest.raises(TypeError, match="RemoteBackend subclass"):
        RemoteBackendRegistry.register("not-a-backend")(dict)


def test_readme_adapter_example_is_complete_and_registers_under_its_name(tmp_path, monkeypatch, isolated_registry):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Writing your own adapter", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    module = f"vrb_readme_example_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__(module)
    backend_cls = RemoteBackendRegistry.get("my-engine")
    assert backend_cls.__module__ == module
    assert not backend_cls.__abstractmethods__, "the README example leaves contract methods unimplemented"
    from verl.remote_backend import supports_resume

    assert supports_resume(backend_cls)
