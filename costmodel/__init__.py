"""Hardware profiles (versioned JSON files of measured or estimated costs) and the cost model."""

from costmodel.cost_model import CostModel
from costmodel.profile import HardwareProfile, ProfileError, load_profile

__all__ = ["CostModel", "HardwareProfile", "ProfileError", "load_profile"]
