"""Measured vLLM runs driven by inference-perf, and the same experiments simulated.

A run folder holds `exp-config.yaml` (model, tensor_parallelism, max_model_len,
max_num_batched_tokens, max_num_seqs), `profile.yaml` (the inference-perf config as run) and
`results/summary_lifecycle_metrics.json` with `stage_<k>_lifecycle_metrics.json` (measured
distributions, seconds). Next to the runs, `model_configs/<model>/config.json` holds each model's
Hugging Face config. Each experiment is simulated by the one `fairsim` command a user runs
(`experiment_overrides`): the profile as the workload, vLLM's settings, the fitted or roofline
cost model on the run's model config, GPU and tensor-parallel degree.

Metrics, as the published comparisons define them: E2E and TTFT mean and p90 over the
successful requests, and ITL = (mean E2E - mean TTFT) / (mean output length - 1).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from simulator.core.errors import ConfigError
from simulator.core.requests import COMPLETED
from simulator.core.timeline import Timeline

METRICS = ("e2e_mean", "e2e_p90", "ttft_mean", "ttft_p90", "itl")

# The runs whose measurements may set constants (the others are validation): the four
# Llama-2-7B runs, Llama-2-70B general and reasoning, Mixtral-8x7B reasoning, CodeLlama-34B
# general and reasoning.
TRAINING = (
    "llama-2-7b-tp1-codegen",
    "llama-2-7b-tp1-roleplay",
    "llama-2-7b-tp1-reasoning",
    "llama-2-7b-tp1-general",
    "llama-2-70b-tp4-general",
    "llama-2-70b-hf-tp4-reasoning",
    "mixtral-8x7b-v0-1-tp2-reasoning",
    "codellama-34b-tp2-general",
    "codellama-34b-tp2-reasoning",
)


@dataclass(frozen=True)
class MeasuredRun:
    """One measured run: where its files are and what it measured, overall and per stage."""

    name: str  # the folder's name less its timestamp, e.g. llama-2-7b-tp1-codegen
    folder: Path
    model: str  # the Hugging Face id
    model_config: Path
    tp: int
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    stage_ends: tuple[float, ...]  # seconds since the run's start at which each stage ends
    measured: dict[str, float]  # METRICS over the whole run
    stages: tuple[dict[str, float], ...]  # METRICS per stage
    failed: int  # requests that failed: inference-perf's client gave up on them (its timeout)

    @property
    def training(self) -> bool:
        return self.name in TRAINING

    @property
    def overloaded(self) -> bool:
        """Requests failed: the server fell so far behind that clients gave up."""
        return self.failed > 0


def measured_metrics(stats: dict[str, Any]) -> dict[str, float]:
    """METRICS of an inference-perf lifecycle-metrics file (seconds)."""
    latency = stats["successes"]["latency"]
    e2e, ttft = latency["request_latency"], latency["time_to_first_token"]
    out = float(stats["successes"]["output_len"]["mean"])
    return {
        "e2e_mean": float(e2e["mean"]),
        "e2e_p90": float(e2e["p90"]),
        "ttft_mean": float(ttft["mean"]),
        "ttft_p90": float(ttft["p90"]),
        "itl": (float(e2e["mean"]) - float(ttft["mean"])) / (out - 1),
    }


def load_run(folder: Path) -> MeasuredRun:
    """A measured run from its folder (the training and validation runs' layout)."""
    exp = yaml.safe_load((folder / "exp-config.yaml").read_text())
    profile = json.loads((folder / "profile.yaml").read_text())
    results = folder / "results"
    summary = json.loads((results / "summary_lifecycle_metrics.json").read_text())
    stages, ends, t = [], [], 0.0
    for k, stage in enumerate(profile["load"]["stages"]):
        t += float(stage["duration"])
        ends.append(t)
        stats = json.loads((results / f"stage_{k}_lifecycle_metrics.json").read_text())
        stages.append(measured_metrics(stats))
    model = str(exp["model"])
    return MeasuredRun(
        name=folder.name.split("-", 2)[2],
        folder=folder,
        model=model,
        model_config=folder.parent.parent / "model_configs" / model.split("/")[-1] / "config.json",
        tp=int(exp["tensor_parallelism"]),
        max_model_len=int(exp["max_model_len"]),
        max_num_batched_tokens=int(exp["max_num_batched_tokens"]),
        max_num_seqs=int(exp["max_num_seqs"]),
        stage_ends=tuple(ends),
        measured=measured_metrics(summary),
        stages=tuple(stages),
        failed=int(summary.get("failures", {}).get("count", 0)),
    )


def load_runs(root: str | Path) -> list[MeasuredRun]:
    """Every run under `root` (a folder of run folders), in name order."""
    base = Path(root)
    folders = sorted(p.parent for p in base.glob("*/exp-config.yaml"))
    if not folders:
        raise ConfigError(f"{root}: no measured run (a folder with exp-config.yaml) inside")
    return [load_run(f) for f in folders]


def experiment_overrides(
    run: MeasuredRun, cost_model: str = "fitted", gpu: str = "h100"
) -> list[str]:
    """The `fairsim` overrides of this experiment: exactly what a user types."""
    return [
        "workload=inference_perf",
        f"workload.path={run.folder / 'profile.yaml'}",
        "engine=vllm",
        f"engine.max_num_seqs={run.max_num_seqs}",
        f"engine.max_num_batched_tokens={run.max_num_batched_tokens}",
        f"engine.max_model_len={run.max_model_len}",
        "engine.gpu_memory_utilization=0.9",
        f"cost_model={cost_model}",
        f"cost_model.model={run.model_config}",
        f"cost_model.gpu={gpu}",
        f"cost_model.tp={run.tp}",
        "cost_model.dtype=bf16",
        "compare_with=null",
    ]


def simulated_metrics(
    timeline: Timeline, since: float = 0.0, until: float = np.inf
) -> dict[str, float]:
    """METRICS of the completed requests sent in [since, until)."""
    arrival = timeline.arrival
    done = (timeline.status == COMPLETED) & (arrival >= since) & (arrival < until)
    e2e = timeline.finished_at[done] - arrival[done]
    ttft = timeline.first_token_at[done] - arrival[done]
    out = float(timeline.trace.output_len[done].mean())
    return {
        "e2e_mean": float(e2e.mean()),
        "e2e_p90": float(np.percentile(e2e, 90)),
        "ttft_mean": float(ttft.mean()),
        "ttft_p90": float(np.percentile(ttft, 90)),
        "itl": (float(e2e.mean()) - float(ttft.mean())) / (out - 1),
    }


def signed_error(simulated: float, measured: float) -> float:
    """(simulated - measured) / measured, in percent."""
    return 100.0 * (simulated - measured) / measured
