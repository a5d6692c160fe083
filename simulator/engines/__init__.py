"""Engines: the runner, the step models it hosts (S-LoRA, vLLM-style), dispatchers, KV memory."""

from simulator.engines.dispatch import DISPATCHERS, ClusterConfig
from simulator.engines.runner import Progress, ProgressSnapshot, Runner
from simulator.engines.simulate import simulate
from simulator.engines.slora import SLoRAConfig
from simulator.engines.vllm import VLLMConfig

__all__ = [
    "DISPATCHERS",
    "ClusterConfig",
    "Progress",
    "ProgressSnapshot",
    "Runner",
    "SLoRAConfig",
    "VLLMConfig",
    "simulate",
]
