"""Hardware profiles (versioned JSON files of measured or estimated costs) and the cost model."""

from dllm_offload_sim.costmodel.cost_model import CostModel
from dllm_offload_sim.costmodel.profile import HardwareProfile, ProfileError, load_profile

__all__ = ["CostModel", "HardwareProfile", "ProfileError", "load_profile"]
