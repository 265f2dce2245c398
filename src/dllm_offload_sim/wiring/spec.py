"""A simulator job's configuration, validated once into typed records.

:func:`job_spec` reads every field a ``dllm-sim`` job uses beyond its wiring (the trace, the profile and each
policy's class, which :mod:`wiring.build` builds) and raises :class:`ConfigError` naming the field and value of
the first bad one, before anything is loaded or simulated. The simulator takes the records it returns, never the
config: :class:`SimSettings` (how every run of the job simulates), :class:`PlannedRun` (one policy at one cache)
and :class:`JobSpec` (the whole job). ``simulate()``'s keyword arguments build the same :class:`SimSettings`, so a
call from Python is checked by the same code as a config.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from dllm_offload_sim.wiring.build import (
    DEFAULT_CACHE,
    int_field,
    int_list_field,
    policy_config,
    policy_label,
    policy_names,
)
from dllm_offload_sim.wiring.errors import ConfigError


def bool_field(name: str, value) -> bool:
    """``value`` of config field ``name`` as a bool; anything else (``"yes"``, 1) is a :class:`ConfigError`."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    return value


@dataclass(frozen=True)
class SimSettings:
    """How every run of a job simulates: requests decoded in lockstep (``sim.batch_size``), leading requests
    replayed unmeasured (``sim.warmup_requests``), the paper's dummy warm-up (``sim.dummy_warmup``), experts the
    host CPU runs at once (``hw.cpu_workers``), the seed handed to policies (``seed``) and whether the per-forward
    and per-layer tables are kept (``sim.per_forward``). Constructing one checks every field."""

    batch_size: int = 1
    warmup_requests: int = 0
    dummy_warmup: bool = False
    cpu_workers: int = 1
    seed: int = 0
    per_forward: bool = False

    def __post_init__(self):
        int_field("sim.batch_size", self.batch_size, 1)
        int_field("sim.warmup_requests", self.warmup_requests, 0)
        bool_field("sim.dummy_warmup", self.dummy_warmup)
        int_field("hw.cpu_workers", self.cpu_workers, 1)
        int_field("seed", self.seed)
        bool_field("sim.per_forward", self.per_forward)

    @classmethod
    def of(cls, cfg) -> SimSettings:
        """The settings of a composed ``conf/config.yaml``."""
        sim = cfg.sim
        return cls(
            batch_size=sim.batch_size,
            warmup_requests=sim.warmup_requests,
            dummy_warmup=sim.get("dummy_warmup", False),
            cpu_workers=cfg.hw.cpu_workers,
            seed=cfg.seed,
            per_forward=sim.get("per_forward", False),
        )


@dataclass(frozen=True)
class PlannedRun:
    """One simulation a job makes: the policy's label in the table, its config, the cache."""

    label: str
    policy: DictConfig
    cache: int


@dataclass(frozen=True)
class JobSpec:
    """A whole ``dllm-sim`` job: its runs in table order, the policy speedups are computed against
    (``table.baseline``), worker processes for the table (``table.jobs``, 0 = one per core) and its settings."""

    runs: tuple[PlannedRun, ...]
    baseline: str | None
    jobs: int
    settings: SimSettings


def job_spec(cfg) -> JobSpec:
    """``cfg`` (a composed ``conf/config.yaml``) checked and read into a :class:`JobSpec`."""
    table = cfg.get("table") or {}
    jobs = int_field("table.jobs", table.get("jobs", 1) or 0) if table else 1
    if jobs < 0:
        raise ConfigError(f"table.jobs must be >= 0 (0 = one per CPU core), got {jobs}")
    return JobSpec(tuple(plan_runs(cfg)), table.get("baseline") if table else None, jobs, SimSettings.of(cfg))


def plan_runs(cfg, group: str = "table") -> list[PlannedRun]:
    """Every simulation of the job: ``policy=NAME`` alone at ``cache`` (default 40), else ``GROUP.policies`` x
    ``GROUP.caches`` (``cache=N`` replaces the caches); ``group`` is ``table`` (``dllm-sim``'s main job) or
    ``validate`` (``dllm-validate``'s sweep). Unknown policies, empty lists and a baseline that is no policy are
    refused."""
    if cfg.get("policy") is not None:
        from hydra.core.hydra_config import HydraConfig

        try:
            hc = HydraConfig.get()
            label = hc.runtime.choices.get("policy") or "policy"
            several = [o for o in hc.overrides.task if o.startswith("policy=[")]
        except ValueError:  # composed without Hydra's runtime (the Python API)
            label, several = policy_label(cfg.policy, cfg.get("policy_dirs") or []), []
        if several:  # Hydra merges the configs of several policies into one: not a run anyone means
            listed = several[0].split("=", 1)[1]
            raise ConfigError(
                f"{several[0]}: one run takes one policy. For a table of several: "
                f"'{group}.policies={listed}' (without policy=); for one job each: "
                f"-m policy={listed.strip('[]')}"
            )
        cache = int_field("cache", cfg.cache if cfg.cache is not None else DEFAULT_CACHE, 0)
        return [PlannedRun(label, cfg.policy, cache)]
    node = cfg[group]
    what = "the main job" if group == "table" else "the sweep"
    caches = (
        [int_field("cache", cfg.cache, 0)]
        if cfg.cache is not None
        else int_list_field(f"{group}.caches", node.caches, 0)
    )
    if not caches:
        raise ConfigError(
            f"{group}.caches is empty: {what} needs at least one cache (e.g. {group}.caches=[40,100])"
        )
    policies = list(node.policies or [])
    if not policies:
        raise ConfigError(
            f"{group}.policies is empty: {what} needs at least one policy "
            f"(e.g. '{group}.policies=[naive_lru,oled]', or policy=NAME for one)"
        )
    dirs = cfg.get("policy_dirs") or []
    runs = [PlannedRun(name, policy_config(name, dirs), c) for name in policies for c in caches]
    base = node.get("baseline")
    if base is not None and base not in policies and base not in policy_names(dirs):
        raise ConfigError(
            f"{group}.baseline={base!r} is not a policy ({group}.policies: {policies}): the speedup column "
            f"would be empty; name one of them"
        )
    return runs
