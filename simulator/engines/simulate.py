"""`simulate`: the one call that runs a trace through an engine and returns its timeline."""

from __future__ import annotations

from cost_models.base import StepCostModel
from simulator.core.seam import Policy
from simulator.core.timeline import SpillPlan, Timeline
from simulator.engines.dispatch import ClusterConfig
from simulator.engines.forked import process_groups, run_in_processes
from simulator.engines.runner import Progress, Runner
from simulator.engines.slora import SLoRAConfig
from simulator.engines.step_model import EngineConfig
from traces.schema import Trace


def simulate(
    trace: Trace,
    policy: Policy,
    cost_model: StepCostModel,
    engine: EngineConfig | None = None,
    cluster: ClusterConfig | None = None,
    progress: Progress | None = None,
    spill: SpillPlan | None = None,
) -> Timeline:
    """Run `trace` under `policy` on the configured engine (S-LoRA by default), on
    `cluster.replicas` replicas behind its dispatcher, and return one timeline (requests and
    steps carry their replica). With `spill`, step records go to disk as the run goes. Replicas
    that run alone may be simulated in forked processes at once (`cluster.processes`)."""
    engine = SLoRAConfig() if engine is None else engine
    runner = Runner(trace, policy, cost_model, engine, cluster, progress=progress, spill=spill)
    groups = process_groups(runner)
    return run_in_processes(runner, groups) if len(groups) > 1 else runner.close()
