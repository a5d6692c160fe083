"""Replications: one configuration run N times, differing only in their run-to-run random
streams: the step-time jitter and run speed (`engine.step_jitter_seed` = its base + i) and the
policy's own stream where it has one (`policy.seed` + i: VTC(±r)'s prediction errors); with
`replicate_workload=true`, in the workload seed too (`seed` + i). Each replication writes its own
run folder, `replication=<i>/`; the statistics of each run metric across them go to
`replications.json`: mean, standard deviation, p5 / p50 / p95, and the 95% confidence interval of
the mean (Student's t, N - 1 degrees of freedom). A deterministic engine (`step_jitter_cv=0` and
`run_speed_cv=0`), a policy that draws nothing and one workload give N identical runs, and the
file says so with zero spread.

Replications run in `replication_jobs` processes at once (null: one per CPU, at most N); every
replication is the same whatever ran beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from simulator.api.run import run_config
from simulator.core.errors import ConfigError
from simulator.report.run_folder import json_safe, write_text_atomically

# The step-time jitter the paper-suite tables use with --replications, the same for every table
# and never tuned per table: Vidur's public A100 / H100 operator profiles of Llama-2-7B (shipped,
# data:vidur_profiles) time each operator repeatedly; summing the per-operator standard
# deviations of a layer over its means (operators fully correlated within a step, an upper
# bound) gives a step-time CV of about 1% at the median and 2.4-2.5% at the 90th percentile for
# decode-sized batches (<= 512 tokens). 2% sits between: docs/metrics.md shows the computation.
PAPER_SUITE_JITTER_CV = 0.02

# run metric -> its path in summary.json
METRICS: dict[str, tuple[str, ...]] = {
    "throughput_tokens_per_s": ("throughput_tokens_per_s",),
    "completed": ("status_counts", "completed"),
    "rejected": ("status_counts", "rejected"),
    "max_diff": ("fairness", "max_diff"),
    "avg_diff": ("fairness", "avg_diff"),
    "jain_index": ("fairness", "jain_index"),
    "ttft_mean_s": ("latency", "all", "ttft", "mean"),
    "ttft_p99_s": ("latency", "all", "ttft", "p99"),
    "tpot_mean_s": ("latency", "all", "tpot", "mean"),
    "e2e_mean_s": ("latency", "all", "e2e", "mean"),
    "fluidity_mean": ("qoe", "fluidity", "mean"),
    "fluid_token_rate": ("qoe", "fluid_token_rate"),
}
FILE = "replications.json"


def vary_streams(cfg: DictConfig, i: int, workload: bool = False) -> DictConfig:
    """`cfg` with its run-to-run random streams moved by i: the step-time jitter seed and the
    policy's own stream where it has one (VTC(±r)'s prediction errors); with `workload`, the
    workload seed too."""
    rep = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(rep, dict)
    rep["engine"]["step_jitter_seed"] = int(rep["engine"].get("step_jitter_seed", 0)) + i
    if isinstance(rep.get("policy"), dict) and "seed" in rep["policy"]:
        rep["policy"]["seed"] = int(rep["policy"]["seed"]) + i
    if workload:
        rep["seed"] = int(rep["seed"]) + i
    return OmegaConf.create(rep)


def replication_config(cfg: DictConfig, i: int) -> DictConfig:
    """The i-th replication of `cfg`: its random streams (and, if asked, workload seed) moved by
    i."""
    rep = vary_streams(cfg, i, bool(cfg.get("replicate_workload")))
    rep.replications, rep.progress = 1, False
    return rep


def replication_configs(cfg: DictConfig, n: int, jobs: int) -> list[DictConfig]:
    """The n replications of `cfg`; when `jobs` > 1 run at once, each simulates its replicas
    in its own process (`cluster.processes=1`): the replications use the CPUs already."""
    configs = [replication_config(cfg, i) for i in range(n)]
    for c in configs if jobs > 1 and cfg.get("cluster") else ():
        c.cluster.processes = 1
    return configs


def paper_replication(cfg: DictConfig, i: int, run_speed_cv: float = 0.0) -> DictConfig:
    """Replication i of a paper-suite run: the suites' jitter and the testbed's run-to-run
    speed (where its logs measure one), its streams moved by i."""
    rep = vary_streams(cfg, i)
    rep.engine.step_jitter_cv = PAPER_SUITE_JITTER_CV
    rep.engine.run_speed_cv = run_speed_cv
    return rep


def paper_suite_heading(n: int, run_speed_cv: float = 0.0) -> str:
    """The line the papers' tables print above their replicated rows."""
    return (
        f"{n} replications per row, step-time jitter CV {PAPER_SUITE_JITTER_CV:g}, run speed CV "
        f"{run_speed_cv:g}; median [p5, p95]; the paper's value lies in [p5, p95], within 15% "
        "of the median, or out"
    )


def add_replications_option(parser: argparse.ArgumentParser) -> None:
    """The papers' tables' `--replications N`."""
    parser.add_argument(
        "--replications",
        type=int,
        default=1,
        help="N > 1: N runs per row with step-time jitter; prints median [p5, p95]",
    )


def _run_one(cfg: DictConfig, folder: str) -> dict[str, Any]:
    _, outputs = run_config(cfg, folder)
    return outputs.summary


def run_replications(cfg: DictConfig, out_dir: str | Path) -> dict[str, Any]:
    """Run every replication into its folder under `out_dir`, then write and return the
    statistics (replications.json)."""
    n = int(cfg.replications)
    if n < 2:
        raise ConfigError(f"replications must be an integer >= 2 to replicate, got {n}")
    jobs = cfg.get("replication_jobs") or min(n, os.cpu_count() or 1)
    configs = replication_configs(cfg, n, jobs)
    folders = [str(Path(out_dir, f"replication={i}")) for i in range(n)]
    if jobs == 1:
        summaries = [_run_one(c, f) for c, f in zip(configs, folders, strict=True)]
    else:  # fresh interpreters: no state of this process is shared with a run
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            summaries = list(pool.map(_run_one, configs, folders))
    result = {
        "replications": n,
        "step_jitter_cv": float(cfg.engine.get("step_jitter_cv", 0.0)),
        "run_speed_cv": float(cfg.engine.get("run_speed_cv", 0.0)),
        "replicate_workload": bool(cfg.get("replicate_workload", False)),
        "folders": [Path(f).name for f in folders],
        "metrics": {
            name: spread([_get(s, path) for s in summaries]) for name, path in METRICS.items()
        },
    }
    result = json_safe(result)
    write_text_atomically(Path(out_dir, FILE), json.dumps(result, indent=2) + "\n")
    return result


def spread(values: list[float | None]) -> dict[str, Any]:
    """Mean, standard deviation (N - 1), p5 / p50 / p95 and the 95% t-interval of the mean of
    the finite values; NaN where there are none (or one, for the spread)."""
    from scipy import stats  # 0.5 s to import: not at every run's start-up

    x = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    out: dict[str, Any] = {"n": int(x.size), "values": [float(v) for v in x]}
    if x.size == 0:
        stat = dict.fromkeys(("mean", "std", "p5", "p50", "p95"), math.nan)
        return {**out, **stat, "ci95": [math.nan, math.nan]}
    p5, p50, p95 = (float(v) for v in np.percentile(x, [5, 50, 95]))
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if x.size > 1 else math.nan
    half = (
        float(stats.t.ppf(0.975, x.size - 1) * std / math.sqrt(x.size)) if x.size > 1 else math.nan
    )
    return {**out, "mean": mean, "std": std, "p5": p5, "p50": p50, "p95": p95,
            "ci95": [mean - half, mean + half]}  # fmt: skip


def _get(summary: dict[str, Any], path: tuple[str, ...]) -> float | None:
    node: Any = summary
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return float(node) if isinstance(node, (int, float)) else None


def format_replications(result: dict[str, Any]) -> str:
    """One line per metric: mean [95% CI], p5 / p50 / p95."""
    head = f"{'metric':<26}{'mean':>12}  {'95% CI of the mean':<26}{'p5':>11}{'p50':>11}{'p95':>11}"
    lines = [f"{result['replications']} replications (step_jitter_cv "
             f"{result['step_jitter_cv']:g}, run_speed_cv {result.get('run_speed_cv', 0.0):g}, "
             f"workload varied: {result['replicate_workload']})",
             head, "-" * len(head)]  # fmt: skip
    for name, s in result["metrics"].items():
        interval = f"[{_num(s['ci95'][0])}, {_num(s['ci95'][1])}]"
        lines.append(
            f"{name:<26}{_num(s['mean']):>12}  {interval:<26}"
            f"{_num(s['p5']):>11}{_num(s['p50']):>11}{_num(s['p95']):>11}"
        )
    return "\n".join(lines)


def _num(x: Any) -> str:
    return "-" if x is None or x != x else f"{x:.4g}"


def verdict(
    values: list[float], published: float | tuple[float, float], decimals: int | None = None
) -> str:
    """How a published figure compares with replications: `in` [p5, p95], else `15%` within
    15% of the median, else `out`. A range (low, high) is in when it overlaps [p5, p95]. With
    `decimals`, the figure stands for every value that rounds to it (0.95 covers 0.952)."""
    low, high = published if isinstance(published, tuple) else (published, published)
    slack = 0.5 * 10.0**-decimals if decimals is not None else 0.0
    p5, p50, p95 = np.percentile(values, [5, 50, 95])
    if low - slack <= p95 and p5 <= high + slack:
        return "in"
    nearest = min(max(p50, low), high)
    return "15%" if abs(nearest - p50) <= 0.15 * abs(p50) + slack else "out"


def interval_cell(values: list[float], paper: float | None, digits: int = 1) -> str:
    """`median [p5, p95]` of replications beside the paper's value and its `verdict`."""
    p5, p50, p95 = np.percentile(values, [5, 50, 95])
    cell = f"{p50:.{digits}f} [{p5:.{digits}f}, {p95:.{digits}f}]"
    if paper is None:
        return f"{cell:>28} {'':>8} {'':>3}"
    return f"{cell:>28} {paper:>8.{digits}f} {verdict(values, paper):>3}"
