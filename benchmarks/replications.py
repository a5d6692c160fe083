"""Replications benchmark (target: 20 replications of one VTC suite in <= 60 s on a 2-core x86
VM with 24 GB, in parallel).

Runs, each as a user would, in a subprocess (whole process: start-up, every run folder, the
statistics):
1. `fairsim experiment=vtc_overload policy=vtc replications=20 engine.step_jitter_cv=0.02`
   (replication_jobs: one per CPU), the figure the target is about;
2. the same with `replication_jobs=1` (serial), and
3. one replication alone (`replications=1`), the baseline for the ratios.
Prints one JSON object last.

Usage: python benchmarks/replications.py [--replications N]
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

SUITE = ["experiment=vtc_overload", "policy=vtc", "engine.step_jitter_cv=0.02", "progress=false"]


def timed(overrides: list[str]) -> float:
    with tempfile.TemporaryDirectory() as folder:
        command = [str(Path(sys.executable).parent / "fairsim"), *SUITE, *overrides]
        command.append(f"hydra.run.dir={folder}")
        t0 = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replications", type=int, default=20)
    n = parser.parse_args().replications
    one = timed(["replications=1", "compare_with=null"])
    parallel = timed([f"replications={n}", "compare_with=null"])
    serial = timed([f"replications={n}", "replication_jobs=1", "compare_with=null"])
    print(
        f"one run: {one:.1f} s\n"
        f"{n} replications, {os.cpu_count()} processes: {parallel:.1f} s (target <= 60 s), "
        f"{parallel / one:.1f}x one run\n"
        f"{n} replications, serial: {serial:.1f} s ({serial / parallel:.2f}x the parallel)"
    )
    print(
        json.dumps(
            {
                "replications": n,
                "cpus": os.cpu_count(),
                "one_run_s": round(one, 2),
                "parallel_s": round(parallel, 2),
                "serial_s": round(serial, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
