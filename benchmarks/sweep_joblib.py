"""A policy sweep: 5 policies x 10 loads x 3 seeds of the VTC overload suite (150 jobs) with
the joblib launcher, then `fairsim-aggregate` over it.

Target: the sweep completes in <= 180 s on a 2-core x86 VM with 24 GB. Jobs run with
`compare_with=null veeksha_metrics=false progress=false` (a sweep compares policies itself; the
Veeksha files are per-run extras). `--baseline` also runs the seed-0 slice (50 jobs) with Hydra's
sequential launcher in this process's session and reports the parallel speed-up on that slice.
Prints one JSON object last.

Usage: python benchmarks/sweep_joblib.py [--out DIR] [--baseline]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLICIES = "fcfs,rpm,lcf,vtc,fairserve"
LOADS = ",".join(f"{x / 10:g}" for x in range(2, 21, 2))  # 0.2 .. 2.0
FAIRSIM = [sys.executable, "-c", "from simulator.apps.run.cli import main; main()"]
QUIET = ["compare_with=null", "veeksha_metrics=false", "progress=false"]


def run_sweep(out: Path, *overrides: str) -> tuple[float, int]:
    start = time.perf_counter()
    proc = subprocess.run(
        [*FAIRSIM, "-m", f"policy={POLICIES}", f"workload.rate_scale={LOADS}", *overrides]
        + [*QUIET, f"hydra.sweep.dir={out}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"sweep failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, len(list(out.glob("**/job.json")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="sweep folder (default: a fresh temporary one)")
    parser.add_argument("--baseline", action="store_true")
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="fairsim-sweep-"))
    wall, jobs = run_sweep(root / "joblib", "hydra/launcher=joblib", "seed=0,1,2")
    start = time.perf_counter()
    aggregate = [sys.executable, "-c", "from simulator.apps.sweeps.aggregate import main; main()"]
    subprocess.run(
        [*aggregate, str(root / "joblib")],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    result = {
        "jobs": jobs,
        "wall_s": round(wall, 1),
        "jobs_per_s": round(jobs / wall, 3),
        "target_wall_s": 180,
        "aggregate_s": round(time.perf_counter() - start, 1),
        "cpus": os.cpu_count(),
        "sweep_dir": str(root / "joblib"),
    }
    if args.baseline:
        seq_wall, seq_jobs = run_sweep(root / "sequential", "seed=0")
        slice_wall = wall * seq_jobs / jobs  # the joblib sweep's time per job, on this slice
        result.update(
            sequential_jobs=seq_jobs,
            sequential_wall_s=round(seq_wall, 1),
            speedup_vs_sequential=round(seq_wall / slice_wall, 2),
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
