"""RayTasksLauncher: a Hydra sweep's jobs as Ray tasks, one per job, results returned in job order."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)


def run_one_job(
    idx: int,
    overrides: Sequence[str],
    hydra_context: HydraContext,
    config: DictConfig,
    task_function: TaskFunction,
    singleton_state: Dict[Any, Any],
) -> JobReturn:
    """One sweep job inside a Ray worker: the job's config composed from the sweep's, then Hydra's ``run_job``
    (its own working directory under the sweep folder, its logging, its callbacks)."""
    setup_globals()
    Singleton.set_state(singleton_state)
    sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
        sweep_config.hydra.job.num = idx
    HydraConfig.instance().set_config(sweep_config)
    return run_job(
        hydra_context=hydra_context,
        config=sweep_config,
        task_function=task_function,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )


class RayTasksLauncher(Launcher):
    """Launches every job of a sweep as a Ray task reserving ``num_cpus_per_job`` CPUs, on the Ray instance at
    ``address`` (a local one started for the sweep when it is null), and waits for all of them. A job that
    raises fails the sweep as it would under joblib; the other jobs' results stay on disk."""

    def __init__(
        self,
        address: Optional[str] = None,
        num_cpus_per_job: float = 1.0,
        init: Optional[Dict[str, Any]] = None,
        keep_alive: bool = False,
    ) -> None:
        if float(num_cpus_per_job) <= 0:
            raise ValueError(f"hydra.launcher.num_cpus_per_job must be > 0, got {num_cpus_per_job!r}")
        self.address, self.num_cpus_per_job, self.keep_alive = (
            address,
            float(num_cpus_per_job),
            bool(keep_alive),
        )
        self.init = (
            OmegaConf.to_container(init, resolve=True) if isinstance(init, DictConfig) else dict(init or {})
        )
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.task_function, self.hydra_context = config, task_function, hydra_context

    def _connect(self):
        """Ray, initialised for this sweep; whether this launcher started it (and so may stop it)."""
        try:
            import ray
        except ImportError as e:
            raise ImportError(
                "hydra/launcher=ray needs Ray: pip install 'dllm-offload-sim[ray]' (in a checkout: pip install -e '.[ray]')"
            ) from e
        if ray.is_initialized():
            return ray, False
        kwargs = {"include_dashboard": False, "log_to_driver": True, **self.init}
        ray.init(address=self.address, **kwargs)
        return ray, self.address is None

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.task_function is not None and self.hydra_context is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        ray, started = self._connect()
        log.info(
            f"Ray ({ray.get_runtime_context().gcs_address}) is launching {len(job_overrides)} jobs, "
            f"{self.num_cpus_per_job:g} CPU each; sweep output dir: {sweep_dir}"
        )
        for idx, overrides in enumerate(job_overrides):
            log.info(f"\t#{initial_job_idx + idx} : {' '.join(filter_overrides(overrides))}")
        task = ray.remote(num_cpus=self.num_cpus_per_job, max_retries=0)(run_one_job)
        state = Singleton.get_state()
        try:
            refs = [
                task.remote(
                    initial_job_idx + idx,
                    list(overrides),
                    self.hydra_context,
                    self.config,
                    self.task_function,
                    state,
                )
                for idx, overrides in enumerate(job_overrides)
            ]
            runs = ray.get(refs)
        finally:
            if started and not self.keep_alive:
                ray.shutdown()
        assert all(isinstance(r, JobReturn) for r in runs)
        return runs
