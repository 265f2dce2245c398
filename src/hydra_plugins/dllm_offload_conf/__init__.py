"""The user's own config groups for ``dllm-sim`` and ``dllm-validate``: a ``conf/`` folder in the working folder
(``conf/policy/fifo.yaml``, ``conf/hw/mybox.yaml``, ...) joins the search path after the shipped configs, so
``policy=fifo`` finds it without ``hydra.searchpath``. Other Hydra applications are left alone."""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

USER_CONF = "conf"  # relative to the working folder


class UserConfSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        ours = any("dllm_offload_sim" in str(p.path) for p in search_path.get_path())
        if ours and Path(USER_CONF).is_dir():
            search_path.append(provider="dllm-offload-sim-user", path=f"file://{USER_CONF}")
