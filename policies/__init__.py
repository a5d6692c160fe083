"""Scheduling policies, one module per family, on the seam of simulator/core/seam.py."""

from policies.andes import Andes
from policies.base import BasePolicy
from policies.drr import DRR
from policies.fairserve import FairServe, RPMInteraction
from policies.fcfs import FCFS
from policies.flows import WFQ, RoundRobin
from policies.lpm import DLPM, LPM
from policies.priority import Priority
from policies.rpm import RPM
from policies.vtc import LCF, VTC
from simulator.core.seam import Policy

__all__ = [
    "Andes",
    "DLPM",
    "DRR",
    "FCFS",
    "LCF",
    "LPM",
    "RPM",
    "VTC",
    "WFQ",
    "BasePolicy",
    "FairServe",
    "Policy",
    "Priority",
    "RoundRobin",
    "RPMInteraction",
]
