"""Scheduling policies: the `Policy` protocol the engines call, and one module per family."""

from policies.base import BasePolicy, Policy
from policies.fcfs import FCFS
from policies.rpm import RPM
from policies.vtc import LCF, VTC

__all__ = ["FCFS", "LCF", "RPM", "VTC", "BasePolicy", "Policy"]
