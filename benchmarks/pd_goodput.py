"""Goodput of disaggregated prefill/decode pools against co-located replicas at equal GPU count,
as prompts lengthen: the question DistServe and Splitwise answer for real GPUs.

A model on H100 (`cost_model=fitted`: coefficients fitted to measured vLLM runs; Llama-2-7B
by default, `--tp` GPUs per replica), vLLM-style replicas (a 2,048-token budget with chunked
prefill, the KV pool sized as vLLM sizes it at 0.9 of GPU memory), Poisson arrivals of requests
with a fixed prompt length and 128 output tokens.
A request meets its SLOs when its TTFT <= `--ttft` and its TPOT <= `--tpot`; goodput is the
highest rate (req/s, found by bisection) at which at least 90% of requests meet both, per GPU.
Each layout serves the same requests: co-located (N replicas, least_requests) and
disaggregated (P prefill + D decode replicas, P + D = N, the KV moved at 25 GB/s per
transfer with 2 ms latency).

`--trace azure-code` or `azure-conv` serves Splitwise's own workloads instead: the first
`--requests` requests of the Azure 2023 coding or conversation trace (shipped with fairsim), their
lengths and arrival pattern, time scaled to each rate (those longer than the model's 4,096
tokens left out).

Prints one row per workload and layout and one JSON object last.

Usage: python benchmarks/pd_goodput.py [--replicas 2] [--model NAME] [--tp 1]
       [--prompts 256,1024,3072 | --trace azure-code|azure-conv] [--ttft 1.0] [--tpot 0.025]
       [--duration 120] [--requests 2000] [--whole-prompts]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from cost_models import FittedCost
from policies import FCFS
from simulator.core.requests import COMPLETED
from simulator.engines import ClusterConfig, VLLMConfig, simulate
from traces import ClientSpec, Fixed, Poisson, ScaleToRate, SyntheticWorkload, Trace
from traces.files import resolve_path
from traces.loaders import load_azure

OUTPUT = 128
ATTAINMENT = 0.9
ENGINE = VLLMConfig(max_num_batched_tokens=2048, gpu_memory_utilization=0.9, max_model_len=4096)
# the papers' baseline: vLLM before chunked prefill (a prompt computed whole, in one step)
WHOLE_PROMPTS = VLLMConfig(
    max_num_batched_tokens=4096,
    gpu_memory_utilization=0.9,
    max_model_len=4096,
    enable_chunked_prefill=False,
)


def azure_rows(name: str, requests: int) -> Trace:
    """The first `requests` requests of a shipped Azure 2023 trace that fit 4,096 tokens."""
    trace = load_azure(resolve_path(f"data:azure2023/{name.split('-')[1]}.csv"))
    fits = (trace.prompt_len + trace.output_len <= 4096).nonzero()[0][:requests]
    return trace.take(fits)


def workload(prompt: int | str, rate: float, args: argparse.Namespace) -> Trace:
    """Fixed lengths under Poisson arrivals, or an Azure trace time-scaled to `rate`."""
    if isinstance(prompt, str):
        return ScaleToRate(rate).apply(azure_rows(prompt, args.requests))
    spec = ClientSpec("chat", Poisson(rate), Fixed(prompt), Fixed(OUTPUT))
    return SyntheticWorkload([spec], duration=args.duration).build(0)


def attainment(
    prompt: int | str, rate: float, cluster: ClusterConfig, args: argparse.Namespace
) -> float:
    """The share of requests that met both SLOs (unfinished ones missed them)."""
    trace = workload(prompt, rate, args)
    engine = WHOLE_PROMPTS if args.whole_prompts else ENGINE
    cost = FittedCost(model=args.model, gpu="h100", tp=args.tp)
    tl = simulate(trace, FCFS(), cost, engine, cluster)
    done = tl.status == COMPLETED
    ttft = tl.first_token_at - tl.arrival
    one = trace.output_len <= 1  # TPOT of a one-token answer: 0
    tpot = (tl.finished_at - tl.first_token_at) / np.maximum(trace.output_len - 1, 1)
    tpot[one] = 0.0
    met = done & (ttft <= args.ttft) & (tpot <= args.tpot)
    return float(met.sum() / len(trace))


def goodput(prompt: int | str, cluster: ClusterConfig, args: argparse.Namespace) -> float:
    """The highest rate (req/s) with ATTAINMENT met, by bisection to 2% (0 if even 0.1 fails)."""
    lo, hi = 0.1, 1.0
    if attainment(prompt, lo, cluster, args) < ATTAINMENT:
        return 0.0
    while attainment(prompt, hi, cluster, args) >= ATTAINMENT:
        lo, hi = hi, hi * 2
    while hi / lo > 1.02:
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if attainment(prompt, mid, cluster, args) >= ATTAINMENT else (lo, mid)
    return lo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=2, help="replicas in every layout")
    ap.add_argument("--model", default="llama-2-7b", help="a model fairsim ships")
    ap.add_argument("--tp", type=int, default=1, help="GPUs per replica (tensor parallel)")
    ap.add_argument("--prompts", default="256,1024,3072")
    ap.add_argument("--trace", choices=["azure-code", "azure-conv"], help="instead of --prompts")
    ap.add_argument("--requests", type=int, default=2000, help="of the trace")
    ap.add_argument("--ttft", type=float, default=1.0, help="TTFT SLO, seconds")
    ap.add_argument("--tpot", type=float, default=0.025, help="TPOT SLO, seconds")
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of arrivals")
    ap.add_argument(
        "--whole-prompts",
        action="store_true",
        help="no chunked prefill (the papers' vLLM baseline): a prompt in one step",
    )
    args = ap.parse_args()
    n, gpus = args.replicas, args.replicas * args.tp
    layouts = {f"co-located x{n}": ClusterConfig(n, "least_requests")}
    for p in range(1, n):
        layouts[f"{p}P+{n - p}D"] = ClusterConfig(prefill_replicas=p, decode_replicas=n - p)
    start = time.perf_counter()
    rows = []
    loads: list[int | str] = (
        [args.trace] if args.trace else [int(x) for x in args.prompts.split(",")]
    )
    for prompt in loads:
        for name, cluster in layouts.items():
            g = goodput(prompt, cluster, args)
            rows.append({"prompt": prompt, "layout": name, "goodput_per_gpu": round(g / gpus, 3)})
            print(f"{prompt!s:>10}  {name:<16} goodput {g:7.2f} req/s  ({g / gpus:.2f} per GPU)")
    best: dict[int | str, dict[str, object]] = {}
    for prompt in loads:
        mine = [r for r in rows if r["prompt"] == prompt]
        co = next(r for r in mine if r["layout"].startswith("co-located"))["goodput_per_gpu"]
        top = max(mine, key=lambda r: r["goodput_per_gpu"])
        best[prompt] = {
            "best": top["layout"],
            "vs_colocated": round(top["goodput_per_gpu"] / co, 2) if co else np.inf,
        }
    print(
        json.dumps(
            {
                "slo": {"ttft_s": args.ttft, "tpot_s": args.tpot, "attainment": ATTAINMENT},
                "rows": rows,
                "best": {str(k): v for k, v in best.items()},
                "wall_s": round(time.perf_counter() - start, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
