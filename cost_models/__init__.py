"""How long a GPU step takes: the `StepCostModel` seam and its implementations."""

from cost_models.base import CostModelError, StepCostModel
from cost_models.fitted import FittedCost
from cost_models.hardware import GPUS, MODELS, GPUSpec, ModelSpec
from cost_models.linear import ConstantStepCost, LinearStepCost
from cost_models.roofline import RooflineCost
from cost_models.table import ProfileError, TableStepCost
from cost_models.vidur_profile import VidurProfileCost

__all__ = [
    "GPUS",
    "MODELS",
    "ConstantStepCost",
    "CostModelError",
    "FittedCost",
    "GPUSpec",
    "LinearStepCost",
    "ModelSpec",
    "ProfileError",
    "RooflineCost",
    "StepCostModel",
    "TableStepCost",
    "VidurProfileCost",
]
