"""Scheduling policies: the `Policy` protocol the engines call, and one module per family."""

from policies.base import BasePolicy, Policy
from policies.fcfs import FCFS

__all__ = ["FCFS", "BasePolicy", "Policy"]
