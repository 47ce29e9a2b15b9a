"""Puts verl's trainer configs on the search path of ``python -m verl.remote_backend.main_ppo``.

The entry config's defaults start with verl's ``ppo_trainer``. Declaring its location as a
``hydra.searchpath`` in the yaml would let a user's own ``hydra.searchpath=[...]`` override
(how Snowflake's plugin adds its config directory) replace it; a search-path plugin is applied
whatever the command line says. Other Hydra applications are left alone.
"""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

VERL_TRAINER_CONFIG = "pkg://verl.trainer.config"
_OUR_CONFIG = ("pkg://verl.remote_backend.config", "verl/remote_backend/config")


class VerlTrainerConfigSearchPath(SearchPathPlugin):
    """Appends ``pkg://verl.trainer.config`` when the primary config is this package's."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        paths = [element.path or "" for element in search_path.get_path()]
        ours = any(path.rstrip("/").endswith(_OUR_CONFIG) for path in paths)
        if ours and VERL_TRAINER_CONFIG not in paths:
            search_path.append(provider="verl-remote-backend", path=VERL_TRAINER_CONFIG)
