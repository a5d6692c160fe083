"""Measured vLLM runs logged request by request (LLMServingSim's benchmark examples), replayed
with each request's own arrival and lengths.

A run folder `<GPU>/<model>/` holds `vllm/requests.jsonl` (per request: input_toks,
output_toks, and the engine's clock at queued_ts, first_token_ts, last_token_ts), `vllm/meta.json`
(vLLM's engine arguments, and in newer logs the KV block count) and `validation/summary.txt`
(LLMServingSim's own errors on the run). The times were taken inside the engine, from the
request's entry into vLLM's queue: the simulated times are taken from the same point, the
arrival plus the cost model's front-end latency.

Each run is simulated by the `fairsim` command a user runs on such a log
(`replay_overrides`): `workload=table` on requests.jsonl, arrivals at queued_ts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.core.errors import ConfigError
from simulator.core.requests import COMPLETED
from simulator.core.timeline import Timeline

REPLAY_METRICS = ("ttft_mean", "ttft_p90", "e2e_mean", "e2e_p90", "tpot_mean")

# the GPU each logged folder ran on (its name in the log), as fairsim names it
GPU_FOLDERS = {"RTX4090": "rtx-4090", "RTXPRO6000": "rtx-pro-6000", "H100": "h100",
               "H200": "h200", "B200": "b200", "A100": "a100-80gb", "L40S": "l40s",
               "L4": "l4"}  # fmt: skip
# vLLM's dtype argument, as cost_model.dtype names it
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16"}
# LLMServingSim's summary rows, as REPLAY_METRICS names them
SUMMARY_ROWS = {"TTFT Mean": "ttft_mean", "TTFT P90": "ttft_p90", "Latency Mean": "e2e_mean",
                "Latency P90": "e2e_p90", "TPOT Mean": "tpot_mean"}  # fmt: skip


@dataclass(frozen=True)
class ReplayedRun:
    """One logged run: where its requests are, vLLM's settings, what it measured."""

    name: str  # e.g. rtx-4090-llama-3.1-8b
    requests: Path
    gpu: str
    model: str  # fairsim's preset name of the model
    tp: int
    dtype: str
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int | None
    num_gpu_blocks: int | None  # logged by newer vLLM; else the pool is sized from memory
    gpu_memory_utilization: float
    kv_cache_dtype: str  # vLLM's, as cost_model.kv_cache_dtype takes it
    measured: dict[str, float]  # REPLAY_METRICS, seconds
    peer: dict[str, float]  # LLMServingSim's signed errors (%), from its summary


def measured_replay_metrics(rows: list[dict]) -> dict[str, float]:
    """REPLAY_METRICS of the logged requests, from their entry into vLLM's queue."""
    queued = np.array([r["queued_ts"] for r in rows], dtype=float)
    first = np.array([r["first_token_ts"] for r in rows], dtype=float)
    last = np.array([r["last_token_ts"] for r in rows], dtype=float)
    out = np.array([r["output_toks"] for r in rows], dtype=float)
    return _metrics(first - queued, last - queued, last - first, out)


def simulated_replay_metrics(timeline: Timeline, frontend_latency: float) -> dict[str, float]:
    """REPLAY_METRICS of the completed requests, from their arrival at the engine's queue."""
    done = timeline.status == COMPLETED
    entered = timeline.arrival[done] + frontend_latency
    first, last = timeline.first_token_at[done], timeline.finished_at[done]
    out = timeline.trace.output_len[done].astype(float)
    return _metrics(first - entered, last - entered, last - first, out)


def _metrics(ttft: np.ndarray, e2e: np.ndarray, decode: np.ndarray, out: np.ndarray) -> dict:
    several = out > 1  # TPOT: the decode time per token after the first, as the logs' tools
    return {
        "ttft_mean": float(ttft.mean()),
        "ttft_p90": float(np.percentile(ttft, 90)),
        "e2e_mean": float(e2e.mean()),
        "e2e_p90": float(np.percentile(e2e, 90)),
        "tpot_mean": float((decode[several] / (out[several] - 1)).mean()),
    }


def read_summary(path: Path) -> dict[str, float]:
    """LLMServingSim's signed errors (%) from its summary table ("TTFT Mean  vLLM  Sim  +0.6%")."""
    errors: dict[str, float] = {}
    for line in path.read_text().splitlines():
        for row, metric in SUMMARY_ROWS.items():
            if line.startswith(row + " "):
                errors[metric] = float(line.split()[-1].rstrip("%"))
    return errors


def load_replayed_run(folder: Path) -> ReplayedRun:
    """A logged run from its `<GPU>/<model>/` folder."""
    gpu_folder, model_folder = folder.parent.name, folder.name
    if gpu_folder not in GPU_FOLDERS:
        raise ConfigError(
            f"{folder}: GPU folder {gpu_folder!r} unknown; accepted: {', '.join(GPU_FOLDERS)}"
        )
    meta = json.loads((folder / "vllm" / "meta.json").read_text())
    kwargs, cache = meta["engine_kwargs"], meta.get("kv_cache", {})
    requests = folder / "vllm" / "requests.jsonl"
    rows = [json.loads(line) for line in requests.read_text().splitlines() if line.strip()]
    summary = folder / "validation" / "summary.txt"
    model = model_folder.lower()
    dtype = str(kwargs.get("dtype", "bfloat16"))
    if dtype not in DTYPES:
        raise ConfigError(
            f"{folder}/vllm/meta.json: engine_kwargs.dtype {dtype!r} unknown; accepted: "
            f"{', '.join(DTYPES)}"
        )
    if kwargs.get("quantization") is not None:  # the preset models are 16-bit checkpoints
        raise ConfigError(
            f"{folder}/vllm/meta.json: engine_kwargs.quantization {kwargs['quantization']!r}: "
            "only unquantized runs are replayed (null)"
        )
    return ReplayedRun(
        name=f"{GPU_FOLDERS[gpu_folder]}-{model}",
        requests=requests,
        gpu=GPU_FOLDERS[gpu_folder],
        model=model,
        tp=int(kwargs.get("tensor_parallel_size", 1)),
        dtype=DTYPES[dtype],
        max_num_seqs=int(kwargs["max_num_seqs"]),
        max_num_batched_tokens=int(kwargs["max_num_batched_tokens"]),
        max_model_len=None if kwargs.get("max_model_len") is None else int(kwargs["max_model_len"]),
        num_gpu_blocks=cache.get("num_gpu_blocks"),
        gpu_memory_utilization=float(cache.get("gpu_memory_utilization", 0.9)),  # vLLM's default
        kv_cache_dtype=str(kwargs.get("kv_cache_dtype", "auto")),
        measured=measured_replay_metrics(rows),
        peer=read_summary(summary) if summary.exists() else {},
    )


def load_replayed_runs(root: str | Path) -> list[ReplayedRun]:
    """Every logged run under `root` (`<GPU>/<model>/vllm/requests.jsonl`), in name order."""
    folders = sorted(p.parent.parent for p in Path(root).glob("*/*/vllm/requests.jsonl"))
    if not folders:
        raise ConfigError(f"{root}: no logged run (<GPU>/<model>/vllm/requests.jsonl) inside")
    return [load_replayed_run(f) for f in folders]


def replay_overrides(run: ReplayedRun, cost_model: str = "fitted") -> list[str]:
    """The `fairsim` overrides that replay this log: exactly what a user types."""
    pool = (
        f"engine.num_gpu_blocks={run.num_gpu_blocks}"
        if run.num_gpu_blocks
        else f"engine.gpu_memory_utilization={run.gpu_memory_utilization}"
    )
    kv_dtype = run.kv_cache_dtype
    return [
        "workload=table",
        f"workload.path={run.requests}",
        "workload.options.columns.arrival=queued_ts",
        "workload.options.columns.prompt_len=input_toks",
        "workload.options.columns.output_len=output_toks",
        "policy=fcfs",
        "engine=vllm",
        f"engine.max_num_seqs={run.max_num_seqs}",
        f"engine.max_num_batched_tokens={run.max_num_batched_tokens}",
        *([f"engine.max_model_len={run.max_model_len}"] if run.max_model_len else []),
        pool,
        f"cost_model={cost_model}",
        f"cost_model.model={run.model}",
        f"cost_model.gpu={run.gpu}",
        f"cost_model.tp={run.tp}",
        f"cost_model.dtype={run.dtype}",
        *([] if kv_dtype == "auto" else [f"cost_model.kv_cache_dtype={kv_dtype}"]),
        "compare_with=null",
    ]
