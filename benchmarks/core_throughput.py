"""Core engine benchmark: 100,000 Poisson requests with ShareGPT-like lengths.

The pool (80,000 tokens) lets the engine batch 100-140 requests; at 2.4 requests/s the engine
runs at its capacity, so a queue builds and the scheduler is consulted at nearly every finish.
The per-token timeline is recorded and materialised (the token table is built, as a run folder
would write it). The same run is repeated with fast-forward off, and the ratio reported. Target
on a 2-core x86 VM with 24 GB: wall <= 10 s and peak memory <= 1 GB. Prints one JSON object last.

Fast-forward gains little here: a batch of ~140 requests averaging ~270 output tokens has a
finish every ~2 decode steps, and every finish may change the schedule.

Usage: python benchmarks/core_throughput.py [--requests N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import time
from dataclasses import replace

import numpy as np

from cost_models import LinearStepCost
from policies import FCFS
from simulator.engines import SLoRAConfig, simulate
from traces import ClientSpec, LogNormal, Poisson, SyntheticWorkload

COST = LinearStepCost(  # conf/cost_model/a10g_llama7b.yaml
    prefill_per_token=0.00021367273378674318,
    prefill_per_request=0.0004517903229351921,
    decode_base=0.01629528795883067,
    decode_per_seq=0.0002449615538388592,
    decode_per_context_token=2.018058626237552e-06,
    step_overhead=0.004,
)


def one_run(trace, cfg):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    timeline = simulate(trace, FCFS(), COST, cfg)
    t1 = time.perf_counter()
    tokens = timeline.token_times()
    t2 = time.perf_counter()
    return t2 - t0, t1 - t0, timeline, tokens


def digest(timeline, tokens) -> str:  # type: ignore[no-untyped-def]
    """SHA-256 over the token table, the step records and the finish times: equal digests
    across commits mean bit-identical timelines."""
    h = hashlib.sha256()
    for a in (*tokens, timeline.steps["end"], timeline.steps["batch_size"], timeline.finished_at):
        h.update(memoryview(np.ascontiguousarray(a)))  # the arrays' bytes, without a copy
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=2.4, help="requests/s (about the capacity)")
    args = ap.parse_args()
    workload = SyntheticWorkload(
        [
            ClientSpec(
                "chat",
                Poisson(args.rate),
                LogNormal(median=200, sigma=1.0, max_value=2048),
                LogNormal(median=180, sigma=0.9, max_value=1024),
            )
        ],
        duration=args.requests / args.rate,
    )
    trace = workload.build(0)
    cfg = SLoRAConfig(pool_tokens=80_000, batch_max_tokens=8192)
    wall, sim_wall, timeline, tokens = one_run(trace, cfg)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    timeline_sha256 = digest(timeline, tokens)
    n_tokens = tokens[0].shape[0]
    del tokens
    batch = timeline.steps["batch_size"][timeline.steps["kind"] == 1]
    wall_slow, _, _, _ = one_run(trace, replace(cfg, fast_forward=False))
    print(
        json.dumps(
            {
                "requests": len(trace),
                "output_tokens": int(n_tokens),
                "simulated_s": round(float(timeline.info["end_time"]), 1),
                "mean_decode_batch": round(float(batch.mean()), 1),
                "wall_s": round(wall, 3),
                "simulate_s": round(sim_wall, 3),
                "token_table_s": round(wall - sim_wall, 3),
                "requests_per_s": round(len(trace) / wall, 1),
                "tokens_per_s": round(n_tokens / wall, 1),
                "peak_mb": round(peak_mb, 1),
                "wall_s_fast_forward_off": round(wall_slow, 3),
                "speedup_fast_forward": round(wall_slow / wall, 2),
                "timeline_sha256": timeline_sha256,
            }
        )
    )


if __name__ == "__main__":
    main()
