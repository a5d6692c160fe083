"""The Python API: compose a config, build its trace and parts, simulate it, run it into a run
folder. Every command, notebook and test builds on these; they sit below the commands
(`simulator.apps`) and above the report, metrics, engines and core layers."""

from simulator.api.config_check import build_block, check_config
from simulator.api.run import (
    build_trace,
    compose_config,
    instantiate_parts,
    run_config,
    simulate_config,
    unfit,
)

__all__ = [
    "build_block",
    "build_trace",
    "check_config",
    "compose_config",
    "instantiate_parts",
    "run_config",
    "simulate_config",
    "unfit",
]
