"""Hardware profiles (versioned JSON files of measured or estimated costs) and the cost model."""

from hwprofile.cost_model import CostModel
from hwprofile.profile import HardwareProfile, ProfileError, load_profile

__all__ = ["CostModel", "HardwareProfile", "ProfileError", "load_profile"]
