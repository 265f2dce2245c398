"""The machine a run is timed on, as a config group (``conf/hw/``) builds it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dllm_offload_sim.costmodel.cost_model import CostModel
from dllm_offload_sim.costmodel.profile import resolve_shipped
from dllm_offload_sim.wiring.errors import ConfigError


@dataclass(frozen=True)
class Hardware:
    """A GPU host: the profile its costs come from, an optional PCIe bandwidth and decision-time override,
    and how many experts its CPU runs at the same time."""

    name: str
    profile: str  # a profile file path (has a suffix) or a shipped profile name such as ``h200-mini``
    pcie_gbps: float | None = None  # override the profiled H2D bandwidth (GB/s)
    cpu_workers: int = 1
    policy_us_per_layer: float | None = None  # charge this decision time per MoE layer; None: the profile's

    def __post_init__(self):
        if not self.profile:
            raise ConfigError(
                f"hw.profile must name a profile file or a shipped profile, got {self.profile!r}"
            )
        if int(self.cpu_workers) < 1:
            raise ConfigError(f"hw.cpu_workers must be >= 1, got {self.cpu_workers}")

    @property
    def profile_path(self) -> Path:
        """The profile's file (a shipped name resolved, a measured profile preferred over an estimated one)."""
        p = Path(self.profile)
        return p if p.suffix else resolve_shipped(self.profile)

    def cost_model(self) -> CostModel:
        return CostModel(
            str(self.profile_path), pcie_gbps=self.pcie_gbps, policy_us_per_layer=self.policy_us_per_layer
        )
