"""The verl releases this plugin runs on, and the glue that differs between them.

Everything else in the package is written against what the supported releases share; the few
places where they differ (where verl's task runner lives, how its stock entry runs, where the
trainer keeps its rollout replicas) are answered by one module per release, chosen here by the
installed verl version, never by a flag. Importing the package with any other verl fails here,
naming the supported versions, and so does a verl that ships its own ``verl.remote_backend``
(upstream's seam: verl's ``release/v0.7.1`` branch, pull request #7102), whose files and ours
would overwrite each other.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from types import ModuleType

__all__ = [
    "OWN_SUBPACKAGE_PATHS",
    "SUPPORTED_VERL_VERSIONS",
    "installed_verl_version",
    "require_supported_verl",
    "verl_files_in_own_subpackages",
    "verl_glue",
]

#: verl release -> module of this package holding that release's glue. The tested releases only:
#: a release in between (0.8.0, 0.9.0) may differ in ways no test here has seen.
SUPPORTED_VERL_VERSIONS: dict[str, str] = {"0.7.1": "v0_7", "0.9.1": "v0_9"}


def installed_verl_version() -> str:
    """``verl.__version__`` of the verl this process imports (e.g. ``"0.9.1"``)."""
    import verl

    return str(getattr(verl, "__version__", "unknown"))


#: The folders this distribution installs under verl's import path (as paths in a wheel's RECORD).
#: No file of the ``verl`` distribution may live there.
OWN_SUBPACKAGE_PATHS: tuple[str, ...] = (
    "verl/remote_backend/",
    "verl/workers/remote_client/",
    "verl/workers/rollout/remote_rollout/",
)


def verl_files_in_own_subpackages() -> list[str]:
    """The files the installed ``verl`` distribution itself lists (its RECORD) under this package's
    folders, sorted; ``[]`` for a PyPI verl. Non-empty means a verl with upstream's own
    remote-backend seam: pip writes both distributions' files to the same paths without a word."""
    # RECORD itself, not ``files()``: that skips paths missing on disk, and a clash is a clash either way.
    paths = (line.split(",", 1)[0].strip('"') for line in _verl_record().splitlines())
    return sorted(path for path in paths if path.startswith(OWN_SUBPACKAGE_PATHS) and "__pycache__" not in path)


@functools.cache  # the package's __init__ and the entry point both check; the file does not change
def _verl_record() -> str:
    """The installed ``verl`` distribution's RECORD ("" when verl runs from a source tree, not installed)."""
    try:
        return importlib.metadata.distribution("verl").read_text("RECORD") or ""
    except importlib.metadata.PackageNotFoundError:
        return ""


def require_supported_verl() -> str:
    """The installed verl's version, checked (cheap: reads verl's file list, imports no glue).
    ``verl.remote_backend`` and the entry point call it on import, so an unsupported verl fails
    there and not mid-run.

    Raises:
        ImportError: the installed verl ships its own ``verl.remote_backend`` (upstream's seam), or is
            not a supported release; the message names the conflict or the releases, and the fix.
    """
    version = installed_verl_version()
    clashing = verl_files_in_own_subpackages()
    if clashing:
        shown = ", ".join(clashing[:4]) + (f" and {len(clashing) - 4} more" if len(clashing) > 4 else "")
        raise ImportError(
            f"verl-remote-backend cannot share an environment with this verl {version}: the verl "
            f"distribution ships its own remote-backend seam ({shown}; verl's release/v0.7.1 branch and "
            f"pull request #7102 do), at the same paths as this package's files, so each install "
            f"overwrites the other's files and uninstalling either deletes the other's. Fix: install a "
            f"PyPI release of verl and then this package again: `pip install --force-reinstall --no-deps "
            f"verl=={list(SUPPORTED_VERL_VERSIONS)[-1]}` (or verl==0.7.1), then `pip install --force-reinstall "
            f"--no-deps verl-remote-backend`; or, to use upstream's seam instead, `pip uninstall "
            f"verl-remote-backend` and reinstall that verl."
        )
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
