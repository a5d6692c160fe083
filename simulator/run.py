"""Building a run from configuration objects and executing it: the Python API behind `fairsim`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from cost_models.base import StepCostModel
from policies.base import Policy
from simulator.engine import Progress, SLoRAConfig, SLoRAEngine
from simulator.fairness import fairness_summary, tick_span
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
    outputs = write_run(timeline, out_dir, resolved)
    other = cfg.get("compare_with")
    if other and other != policy.name:
        outputs.summary["comparison"] = compare(trace, other, cost, engine)
        Path(out_dir, "summary.json").write_text(json.dumps(outputs.summary, indent=2) + "\n")
    return timeline, outputs


def compare(
    trace: Trace, policy_name: str, cost: StepCostModel, engine: SLoRAConfig
) -> dict[str, Any]:
    """The same trace and engine under another policy (its conf/policy default): its fairness
    figures and throughput, for the side-by-side printout."""
    if GlobalHydra.instance().is_initialized():  # inside `fairsim` (hydra.main)
        policy_cfg = compose("config", overrides=[f"policy={policy_name}"]).policy
    else:
        with initialize_config_module("conf", version_base="1.3"):
            policy_cfg = compose("config", overrides=[f"policy={policy_name}"]).policy
    timeline = simulate(trace, instantiate(policy_cfg, _convert_="all"), cost, engine)
    requests, tokens = timeline.requests_frame(), timeline.tokens_frame()
    total = tick_span(timeline.info.get("end_time"))
    return {"policy": policy_name, **fairness_summary(requests, tokens, total=total)}
