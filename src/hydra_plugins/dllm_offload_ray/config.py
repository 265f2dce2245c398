"""The Ray launcher's config node, stored in Hydra's ``hydra/launcher`` group as ``ray_tasks``
(``conf/hydra/launcher/ray.yaml`` extends it)."""

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class RayTasksLauncherConf:
    """Where the sweep's jobs run and what each one reserves."""

    _target_: str = "hydra_plugins.dllm_offload_ray.launcher.RayTasksLauncher"
    # null: start a Ray instance on this machine for the sweep; "auto" or "HOST:PORT": join that running cluster
    address: Optional[str] = None
    # CPUs each job reserves (a simulation is single-threaded); Ray runs as many jobs at once as CPUs allow
    num_cpus_per_job: float = 1.0
    # extra keyword arguments of ray.init (e.g. num_cpus for a local instance, runtime_env for a cluster)
    init: Dict[str, Any] = field(default_factory=dict)
    # leave the Ray instance running after the sweep (only matters for one this launcher started)
    keep_alive: bool = False


ConfigStore.instance().store(
    group="hydra/launcher", name="ray_tasks", node=RayTasksLauncherConf, provider="dllm-offload-sim"
)
