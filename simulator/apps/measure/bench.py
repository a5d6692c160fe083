"""`fairsim-bench`: replay a workload against a real OpenAI-compatible endpoint and score the
measured run with the metrics of a simulation.

Configured like `fairsim` (workload=, seed, qoe=, slos) plus the `target:` block
(`TargetConfig`). The run folder is a simulation's: requests.parquet (client-side send, first
token and finish times; status with the reason of every 429, HTTP error, timeout or dropped
connection; `scheduled_at`, `http_status`, `reported_tokens`), tokens.parquet (the client-side
time of every token), summary.json and the Veeksha files. steps.parquet is empty: a client sees
no engine steps (`fairsim-calibrate` infers them).
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pandas as pd
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig

from cost_models.base import StepCostModel
from simulator.api.config_check import build_block
from simulator.api.run import build_trace, finish_run, write_scored_run
from simulator.apps.common import hydra_jobs
from simulator.apps.common.command import EXIT_MEASUREMENT_FAILED
from simulator.apps.common.event_loop import run_loop
from simulator.apps.common.tokenizer import load_tokenizer
from simulator.apps.measure.bench_client import Received, Replay, TargetConfig, preflight
from simulator.core.timeline import STEP_COLUMNS, Timeline
from simulator.engines.step_model import EngineConfig
from simulator.report.console import DEFAULT_ROWS, format_fairness, format_qoe, format_summary
from simulator.report.html import REPORT_FILE
from simulator.report.progress import StreamingReporter
from traces.schema import Trace


def measured_timeline(trace: Trace, rec: Received, info: dict[str, Any]) -> Timeline:
    """A measured run as a Timeline: each request's tokens are one run on a token clock made of
    their receive times; no steps and no known memory pool."""
    counts = np.array([len(t) for t in rec.tokens], dtype=np.int64)
    clock = np.fromiter((x for t in rec.tokens for x in t), dtype=np.float64, count=counts.sum())
    has = np.flatnonzero(counts > 0)
    steps: dict[str, np.ndarray] = {k: np.empty(0, dtype=np.int64) for k in STEP_COLUMNS}
    steps.update(start=np.empty(0), end=np.empty(0), kind=np.empty(0, dtype=np.int8))
    steps["replica"] = np.empty(0, dtype=np.int64)
    ends = np.concatenate([rec.finished_at[~np.isnan(rec.finished_at)], clock, [0.0]])
    return Timeline(
        trace=trace,
        arrival=rec.sent_at,
        status=rec.status,
        reason=rec.reason,
        admitted_at=np.full(len(trace), np.nan),
        first_token_at=rec.first_token_at,
        finished_at=rec.finished_at,
        generated=counts,
        steps=steps,
        token_runs={
            "row": has,
            "index": np.zeros(has.shape[0], dtype=np.int64),
            "count": counts[has],
            "tick": (np.cumsum(counts) - counts)[has],
        },
        token_clock=clock,
        pool_tokens=0,
        info={"engine": "measured", "end_time": float(ends.max()), **info},
        request_columns={
            "scheduled_at": rec.scheduled_at,
            "http_status": rec.http_status,
            "reported_tokens": rec.reported_tokens,
        },
    )


async def measure(
    cfg: DictConfig, trace: Trace, target: TargetConfig
) -> tuple[str, Received, dict[str, float]]:
    model = await preflight(target)
    print(
        f"fairsim-bench: {len(trace)} requests to {target.url} (model {model}, "
        f"{target.endpoint}, at most {target.max_concurrency} at once)",
        flush=True,
    )
    count = load_tokenizer(target.tokenizer, "target.tokenizer") if target.tokenizer else None
    replay = Replay(trace, target, model, int(cfg.seed), count)
    progress = StreamingReporter() if cfg.get("progress") else None
    received = await replay.run(progress)
    return model, received, replay.clock()


def bench(cfg: DictConfig, out_dir: str) -> dict[str, Any]:
    """Replay, then write the run folder; returns the summary."""
    for name in ("httpx", "httpx2"):  # a log line per request would bury the progress
        logging.getLogger(name).setLevel(logging.WARNING)
    target = build_block(cfg, "target", TargetConfig)
    trace = build_trace(cfg)
    result: list[tuple[str, Received, dict[str, float]]] = []

    async def main() -> None:
        result.append(await measure(cfg, trace, target))

    run_loop(main())
    model, received, clock = result[0]
    info = {"target": target.url, "model": model}
    timeline = measured_timeline(trace, received, info)

    def engine_parts() -> tuple[StepCostModel, EngineConfig]:
        cost = instantiate(cfg.cost_model, _convert_="all")
        return cost, instantiate(cfg.engine, _convert_="all")

    outputs = write_scored_run(timeline, out_dir, cfg, engine_parts)
    outputs.summary["clock"] = clock
    finish_run(outputs, out_dir)
    return outputs.summary


def _run(cfg: DictConfig, out_dir: str) -> float:
    """Measure and print the results; returns the share of requests that failed or whose
    clients gave up (inference-perf counts both as failures)."""
    summary = bench(cfg, out_dir)
    rows = cfg.get("console_rows", DEFAULT_ROWS)
    print(format_summary(summary, rows))
    print()
    print(format_fairness(summary, rows))
    if "qoe" in summary:
        print()
        print(format_qoe(summary, rows))
    print(f"run folder: {out_dir} (in a browser: {Path(out_dir, REPORT_FILE)})")
    failed, total = summary["status_counts"]["failed"], summary["requests"]
    gave_up = int((summary.get("client_timeouts") or {}).get("requests", 0))
    if failed or gave_up:
        what = []
        if failed:
            reasons = "; ".join(
                f"{n} {reason}" for reason, n in failed_reasons(Path(out_dir)).most_common(3)
            )
            what.append(f"{failed} of {total} requests failed ({reasons})")
        if gave_up:
            what.append(f"clients gave up on {gave_up} of {total} (client_timeout)")
        print(
            f"fairsim-bench: {'; '.join(what)}; the latency and fairness figures describe the "
            f"{summary['status_counts']['completed']} that completed",
            file=sys.stderr,
        )
    return (failed + gave_up) / total if total else 0.0


def failed_reasons(folder: Path) -> Counter[str]:
    requests = pd.read_parquet(folder / "requests.parquet", columns=["status", "reason"])
    return Counter(requests.loc[requests["status"] == "failed", "reason"].astype(str))


# the keys of config.yaml a measurement never reads, and why
UNREAD = {
    **dict.fromkeys(
        ("policy", "cluster", "gateway"),
        "fairsim-bench measures the target as it serves (its own scheduling, replicas and "
        "gateway); these keys configure simulations (fairsim, fairsim-serve)",
    ),
    "compare_with": "fairsim-bench measures one target: to compare a simulated policy, run "
    "`fairsim` on the same workload",
    **dict.fromkeys(
        ("replications", "replicate_workload", "replication_jobs"),
        "fairsim-bench measures once: repeat it (a sweep: fairsim-bench -m seed=0,1,2)",
    ),
}


@hydra.main(version_base="1.3", config_path="pkg://conf", config_name="bench")
def _main(cfg: DictConfig) -> None:
    out_dir = HydraConfig.get().runtime.output_dir
    failed: list[float] = []
    hydra_jobs.run_job(
        "fairsim-bench", cfg, out_dir, lambda: failed.append(_run(cfg, out_dir)), unread=UNREAD
    )
    allowed = float(cfg.target.get("max_failed_share", 0.1))
    if failed and failed[0] > allowed and HydraConfig.get().mode != RunMode.MULTIRUN:
        print(
            f"fairsim-bench: the measurement failed: {failed[0]:.0%} of requests failed, more "
            f"than target.max_failed_share={allowed} allows (exit {EXIT_MEASUREMENT_FAILED})",
            file=sys.stderr,
        )
        sys.exit(EXIT_MEASUREMENT_FAILED)


def main() -> None:
    hydra_jobs.run_hydra_command("fairsim-bench", _main)


if __name__ == "__main__":
    main()
