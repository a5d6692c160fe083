"""An autoscaled fleet serving one simulated day of a diurnal multi-tenant workload, at several
sizes: wall time, peak memory and requests simulated per second, and how they grow.

The target (the gateway and elastic-fleet issue): 64 replicas, 2M requests in one day, in
<= 5 minutes and <= 2 GB on a 2-core machine. Each size keeps that ratio — `replicas` replicas
at most, 2M x replicas / 64 requests over 86,400 s — so the load per replica is the same:
Llama-2-70B on H100 (tensor parallel 4, the fitted cost model) per replica, chat-like lengths
(median prompt 200, output 180 tokens), five tenants (one heavy) whose rates follow the day
(busiest at 14:00, +-60%), VTC flow control at the gateway, the autoscaler on in-flight
tokens (1,500 per replica: a latency target, so that the fleet follows the day at every size;
loading 60-180 s). Each size runs in a fresh process (peak memory is
its own); the cost per request is printed, and the exponent of wall time against requests
between the smallest and largest size. `--sizes 64` runs the issue's size itself.

Measured on the 2-core VM (2026-11-26; again 2026-11-27 once coupled replicas take runs of
decode steps): see docs/gateway.md ("Scale"). This times the simulation; the whole `fairsim`
process also writes the run folder, about as long again (docs/gateway.md, "The whole `fairsim`
process").

`--whole` runs each size as a user does instead, the whole `fairsim` process writing its run
folder with every default output, and prints its wall time, the simulate and write phases (from
the folder's cli.log), and the process's peak memory (docs/gateway.md, "The whole `fairsim`
process").

Usage: python benchmarks/fleet_day.py [--sizes 2,4,8] [--whole]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DAY = 86_400.0
FULL_REQUESTS, FULL_REPLICAS = 2_000_000, 64
SHARES = {"heavy": 0.4, "light1": 0.15, "light2": 0.15, "light3": 0.15, "interactive": 0.15}


def overrides(replicas: int) -> list[str]:
    rate = FULL_REQUESTS * replicas / FULL_REPLICAS / DAY  # requests per second, all tenants
    out = [
        "engine=vllm",
        "cost_model=fitted",
        "cost_model.model=llama-2-70b",
        "cost_model.gpu=h100",
        "cost_model.tp=4",
        "engine.gpu_memory_utilization=0.9",
        "workload=diurnal_tenants",
        f"workload.duration={DAY}",
        "policy=fcfs",
        "compare_with=null",
        "cluster.replicas=1",
        "cluster.dispatcher=least_requests",
        "cluster.autoscaler.enabled=true",
        "cluster.autoscaler.metric=in_flight_tokens",
        "cluster.autoscaler.target=1500",
        f"cluster.autoscaler.max_replicas={replicas}",
        "cluster.autoscaler.loading.distribution=uniform",
        "cluster.autoscaler.loading.low=60",
        "cluster.autoscaler.loading.high=180",
        "gateway.flow_control.enabled=true",
        "gateway.flow_control.fairness=vtc",
        "gateway.classes={interactive: critical}",
    ]
    for i, share in enumerate(SHARES.values()):
        arrival = f"workload.clients.{i}.arrival"
        out += [f"{arrival}.rate={rate * share}", f"{arrival}.period={DAY}",
                f"{arrival}.peak_at={DAY * 14 / 24}"]  # fmt: skip
    return out


def one(replicas: int) -> dict[str, float]:
    """Run one size in this process; returns its figures. As `fairsim` runs it: a run that may
    emit more tokens than `memory_budget_mb` holds in one table writes its step records and
    counter events to disk as it goes (every size here does)."""
    from simulator.api import build_trace, compose_config
    from simulator.api.run import instantiate_parts, token_budget
    from simulator.core.requests import COMPLETED
    from simulator.core.timeline import SpillPlan
    from simulator.engines import simulate

    cfg = compose_config(overrides(replicas))
    start = time.perf_counter()
    trace = build_trace(cfg)
    budget = token_budget(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        spill = None
        if int(trace.output_len.sum()) > budget:
            spill = SpillPlan(Path(tmp, ".spill"), max(1, budget // 16))
        timeline = simulate(trace, *instantiate_parts(cfg), spill=spill)
        wall = time.perf_counter() - start
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        fleet = timeline.info["fleet"]
        ready = [row for row in fleet["changes"] if row[2] == "ready"]  # type: ignore[index]
        return {
            "max_replicas": replicas,
            "requests": len(trace),
            "completed": int((timeline.status == COMPLETED).sum()),
            "wall_s": round(wall, 2),
            "requests_per_s": round(len(trace) / wall),
            "peak_mb": round(peak_mb, 1),
            "spilled": spill is not None,
            "gpu_hours": round(fleet["gpu_seconds"] / 3600, 1),  # type: ignore[operator]
            "replicas_started": len(ready),
        }


def whole(replicas: int) -> dict[str, float]:
    """One size through the `fairsim` command, its run folder written (then removed)."""
    fairsim = Path(sys.executable).with_name("fairsim")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp, "run")
        command = [str(fairsim), *overrides(replicas), "progress=false", f"hydra.run.dir={folder}",
                   "hydra.verbose=fairsim.timing"]  # fmt: skip
        start = time.perf_counter()
        with open(Path(tmp, "console"), "w") as console:
            child = subprocess.Popen(command, stdout=console, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(child.pid, 0)  # the child's own peak, not this one's
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode:
            sys.exit(f"fairsim exited {child.returncode}: {Path(tmp, 'console').read_text()}")
        phases = dict(re.findall(r"phase (\w+) ([0-9.]+)", (folder / "cli.log").read_text()))
        summary = json.loads((folder / "summary.json").read_text())
    return {
        "max_replicas": replicas,
        "requests": summary["requests"],
        "steps": summary["steps"],
        "wall_s": round(wall, 1),
        "simulate_s": round(float(phases["simulate"]), 1),
        "write_s": round(float(phases["write"]), 1),
        "peak_mb": round(usage.ru_maxrss / 1024),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,4,8", help="max replicas per size, e.g. 2,4,8")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: run one size
    parser.add_argument("--whole", action="store_true", help="the whole fairsim process")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return
    if args.whole:
        done = []
        for size in [int(s) for s in args.sizes.split(",")]:
            r = whole(size)
            done.append(r)
            print(
                f"{r['max_replicas']:>3} replicas at most, {r['steps']:>11,} steps: whole "
                f"{r['wall_s']:>7.1f} s (simulate {r['simulate_s']:.1f} s, write "
                f"{r['write_s']:.1f} s), peak {r['peak_mb']:>6,} MB"
            )
        print(json.dumps(done))
        return
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        out = subprocess.run(
            [sys.executable, __file__, "--one", str(size)], capture_output=True, text=True
        )
        if out.returncode:
            sys.exit(out.stderr)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(
            f"{r['max_replicas']:>3} replicas at most, {r['requests']:>9,} requests: "
            f"{r['wall_s']:>8.1f} s, {r['requests_per_s']:>6,} requests/s, peak "
            f"{r['peak_mb']:>7.1f} MB, {r['gpu_hours']} GPU-hours"
        )
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        k = math.log(b["wall_s"] / a["wall_s"]) / math.log(b["requests"] / a["requests"])
        full = b["wall_s"] * (FULL_REQUESTS / b["requests"]) ** k
        print(f"wall time grows as requests^{k:.2f}; at 64 replicas and 2M requests: ~{full:.0f} s")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
