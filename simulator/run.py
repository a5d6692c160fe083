"""Building a run from configuration objects and executing it: the Python API behind `fairsim`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from cost_models.base import StepCostModel
from policies.base import Policy
from simulator.engine import Progress, SLoRAConfig, SLoRAEngine
from simulator.outputs import RunOutputs, write_run
from simulator.timeline import Timeline
from traces.schema import Trace


def simulate(
    trace: Trace,
    policy: Policy,
    cost_model: StepCostModel,
    engine: SLoRAConfig | None = None,
    progress: Progress | None = None,
) -> Timeline:
    """Run `trace` through the S-LoRA engine under `policy` and return its timeline."""
    return SLoRAEngine(trace, policy, cost_model, engine or SLoRAConfig(), progress).run()


def build_trace(cfg: DictConfig) -> Trace:
    workload = instantiate(cfg.workload, _convert_="all")
    return workload.build(int(cfg.seed))


def run_config(
    cfg: DictConfig, out_dir: str | Path, progress: Progress | None = None
) -> tuple[Timeline, RunOutputs]:
    """Instantiate everything named in a composed config, run it, write the run folder."""
    trace = build_trace(cfg)
    policy = instantiate(cfg.policy, _convert_="all")
    cost = instantiate(cfg.cost_model, _convert_="all")
    engine = instantiate(cfg.engine, _convert_="all")
    timeline = simulate(trace, policy, cost, engine, progress)
    resolved: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    return timeline, write_run(timeline, out_dir, resolved)
