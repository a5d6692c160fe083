"""`fairsim` (`cli`). Importing the Python API from here (`simulator.apps.run`) still works: it
lives in `simulator.api`."""

from simulator.api.run import (
    build_trace,
    compose_config,
    instantiate_parts,
    run_config,
    simulate_config,
    unfit,
)

__all__ = [
    "build_trace",
    "compose_config",
    "instantiate_parts",
    "run_config",
    "simulate_config",
    "unfit",
]
