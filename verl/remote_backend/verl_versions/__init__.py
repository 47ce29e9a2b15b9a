"""The verl releases this plugin runs on, and the glue that differs between them.

Everything else in the package is written against what the supported releases share; the few
places where they differ (where verl's task runner lives, how its stock entry runs, where the
trainer keeps its rollout replicas) are answered by one module per release, chosen here by the
installed verl version, never by a flag. Importing the package with any other verl fails here,
naming the supported versions.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["SUPPORTED_VERL_VERSIONS", "installed_verl_version", "require_supported_verl", "verl_glue"]

#: verl release -> module of this package holding that release's glue. The tested releases only:
#: a release in between (0.8.0, 0.9.0) may differ in ways no test here has seen.
SUPPORTED_VERL_VERSIONS: dict[str, str] = {"0.7.1": "v0_7", "0.9.1": "v0_9"}


def installed_verl_version() -> str:
    """``verl.__version__`` of the verl this process imports (e.g. ``"0.9.1"``)."""
    import verl

    return str(getattr(verl, "__version__", "unknown"))


def require_supported_verl() -> str:
    """The installed verl's version, checked (cheap: imports no glue). ``verl.remote_backend`` calls
    it on import, so an unsupported verl fails there and not mid-run.

    Raises:
        ImportError: the installed verl is not a supported release; the message names them and the fix.
    """
    version = installed_verl_version()
    if version not in SUPPORTED_VERL_VERSIONS:
        supported = " and ".join(SUPPORTED_VERL_VERSIONS)
        raise ImportError(
            f"verl-remote-backend supports verl {supported}; this environment has verl {version}. "
            f"Install a supported release, e.g. `pip install verl=={list(SUPPORTED_VERL_VERSIONS)[-1]}`."
        )
    return version


def verl_glue() -> ModuleType:
    """The glue module for the installed verl (``v0_7`` or ``v0_9``); both define the same names.

    Raises:
        ImportError: the installed verl is not a supported release (:func:`require_supported_verl`).
    """
    return importlib.import_module(f"{__name__}.{SUPPORTED_VERL_VERSIONS[require_supported_verl()]}")
