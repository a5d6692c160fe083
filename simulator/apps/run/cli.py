"""`fairsim`: compose the Hydra config, run it, write the run folder, print a per-client table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from simulator.api.run import run_config, what_ran
from simulator.apps.common import hydra_jobs
from simulator.apps.sweeps.replications import FILE, format_replications, run_replications
from simulator.report.console import (
    DEFAULT_ROWS,
    format_fairness,
    format_qoe,
    format_slos,
    format_summary,
)
from simulator.report.html import REPORT_FILE
from simulator.report.progress import StreamingReporter


@hydra.main(version_base="1.3", config_path="pkg://conf", config_name="config")
def _main(cfg: DictConfig) -> None:
    out_dir = HydraConfig.get().runtime.output_dir
    hydra_jobs.run_job("fairsim", cfg, out_dir, lambda: _run(cfg, out_dir))


def what_runs(cfg: DictConfig) -> str:
    """One line naming the configs that run (as Hydra chose them) and the seed."""
    return "fairsim: " + " ".join(f"{k}={v}" for k, v in what_ran(cfg).items())


def job_line(summary: dict[str, Any], out_dir: str) -> str:
    """A sweep job's result in one line: requests served, throughput, fairness."""
    counts, fairness = summary["status_counts"], summary.get("fairness", {})
    diff = fairness.get("max_diff")
    return (
        f"fairsim: job done: {counts['completed']} of {summary['requests']} requests completed, "
        f"{summary['throughput_tokens_per_s']:.1f} tokens/s, Max Diff "
        f"{'-' if diff is None else f'{diff:.2f}'} tok/s; {out_dir}"
    )


def _run(cfg: DictConfig, out_dir: str) -> None:
    sweep_job = HydraConfig.get().mode == RunMode.MULTIRUN  # one line per job, nothing more
    if not sweep_job:
        print(what_runs(cfg), flush=True)
    elif not any(o.startswith("compare_with=") for o in HydraConfig.get().overrides.task):
        cfg.compare_with = None  # a sweep compares its jobs; a second policy each doubles the work
    if int(cfg.get("replications") or 1) > 1:
        result = run_replications(cfg, out_dir)
        print(format_replications(result))
        print(f"run folders: {out_dir}/replication=<i>; statistics: {out_dir}/{FILE}")
        return
    progress = StreamingReporter() if cfg.get("progress") and not sweep_job else None
    _, outputs = run_config(cfg, out_dir, progress)
    if sweep_job:  # the tables are in the job's folder; fairsim-aggregate gathers them
        print(job_line(outputs.summary, out_dir))
        return
    rows = cfg.get("console_rows", DEFAULT_ROWS)
    print(format_summary(outputs.summary, rows))
    print()
    print(format_fairness(outputs.summary, rows))
    if "qoe" in outputs.summary:
        print()
        print(format_qoe(outputs.summary, rows))
    if outputs.summary.get("slo_results", {}).get("results"):
        print()
        print(format_slos(outputs.summary["slo_results"]))
    print(f"run folder: {out_dir} (in a browser: {Path(out_dir, REPORT_FILE)})")


def main() -> None:
    hydra_jobs.run_hydra_command("fairsim", _main)
