"""Scheduling policies: the `Policy` protocol the engines call, and one module per family."""

from policies.base import BasePolicy, Policy
from policies.drr import DRR
from policies.fairserve import FairServe, RPMInteraction
from policies.fcfs import FCFS
from policies.priority import Priority
from policies.rpm import RPM
from policies.vtc import LCF, VTC

__all__ = [
    "DRR",
    "FCFS",
    "LCF",
    "RPM",
    "VTC",
    "BasePolicy",
    "FairServe",
    "Policy",
    "Priority",
    "RPMInteraction",
]
