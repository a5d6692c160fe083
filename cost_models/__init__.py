"""How long a GPU step takes: the `StepCostModel` seam and its implementations."""

from cost_models.base import StepCostModel
from cost_models.linear import ConstantStepCost, LinearStepCost
from cost_models.table import ProfileError, TableStepCost

__all__ = ["ConstantStepCost", "LinearStepCost", "ProfileError", "StepCostModel", "TableStepCost"]
