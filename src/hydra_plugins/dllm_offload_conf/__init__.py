"""The user's own config groups for ``dllm-sim`` and ``dllm-validate``: a ``conf/`` folder in the working folder
(``conf/policy/fifo.yaml``, ``conf/hw/mybox.yaml``, ...) joins the search path after the shipped configs, so
``policy=fifo`` finds it without ``hydra.searchpath``; and every model of the catalogue (``traces/catalogue/``) is a
``model=`` option (``model=qwen3-30b-a3b`` sets ``model.shape``) without a config file of its own. Other Hydra
applications are left alone."""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

USER_CONF = "conf"  # relative to the working folder


class UserConfSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        ours = any("dllm_offload_sim" in str(p.path) for p in search_path.get_path())
        if not ours:
            return
        if Path(USER_CONF).is_dir():
            search_path.append(provider="dllm-offload-sim-user", path=f"file://{USER_CONF}")
        register_catalogue_models()


def register_catalogue_models() -> None:
    """Each catalogue model as the ``model=`` option of its file's stem, where ``conf/model/`` has no file of it."""
    from hydra.core.config_store import ConfigStore

    from dllm_offload_sim.traces.catalogue import CATALOGUE_DIR

    shipped_conf = CATALOGUE_DIR.parent.parent / "conf" / "model"
    store = ConfigStore.instance()
    for f in sorted(CATALOGUE_DIR.glob("*.yaml")):
        if not (shipped_conf / f.name).is_file():
            store.store(
                group="model", name=f.stem, node={"shape": f.stem}, provider="dllm-offload-sim-catalogue"
            )
