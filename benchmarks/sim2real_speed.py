"""How long one sim-to-real experiment takes: the whole `fairsim` process, as a user runs it, on
every measured vLLM run (simulator/apps/sim2real: the inference-perf runs' command, and the
request logs' replay command).

Each experiment runs twice, alternating: with every default output (run folder, pictures,
report.html, QoE scores, Veeksha files and plots) and lean (`pictures=false
veeksha_metrics=false ~qoe`: the run folder's tables, summary and report only, every figure the
sim-to-real comparison reads). Prints each experiment's wall seconds, the medians, and one JSON
object last.

The published comparison's figures, for scale (its machine, not this one): BLIS 5.7 s and
Vidur 8.6 s per experiment. Vidur is not run here: the release on the package index (0.0.26)
downloads its GPU profiles from the Hugging Face hub when it starts, and this benchmark runs
offline.

Usage: python benchmarks/sim2real_speed.py [--runs DIR] [--replays DIR] [--only NAME]
(default: the sim2real folders of FAIRSIM_DATA_DIR)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from simulator.apps.sim2real.replay import load_replayed_runs, replay_overrides
from simulator.apps.sim2real.runs import experiment_overrides, load_runs
from traces.files import resolve_path

LEAN = ["pictures=false", "veeksha_metrics=false", "~qoe"]
FAIRSIM = Path(sys.executable).with_name("fairsim")


def wall_seconds(overrides: list[str], folder: Path) -> float:
    """The whole process's wall time; a failed run stops the benchmark with its error."""
    start = time.perf_counter()
    done = subprocess.run(
        [str(FAIRSIM), *overrides, "progress=false", f"hydra.run.dir={folder}"],
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"fairsim {' '.join(overrides)}: exit {done.returncode}: {done.stderr.strip()}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="data:sim2real/inference_sim_training/default_args")
    parser.add_argument("--replays", default="data:sim2real/llmservingsim")
    parser.add_argument("--only", help="only the experiments whose name contains this")
    args = parser.parse_args()
    experiments = {
        run.name: experiment_overrides(run) for run in load_runs(resolve_path(args.runs, "data"))
    }
    for replay in load_replayed_runs(resolve_path(args.replays, "data")):
        experiments[f"{replay.name} (replayed)"] = replay_overrides(replay)
    if args.only:
        experiments = {k: v for k, v in experiments.items() if args.only in k}
    full, lean = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, overrides) in enumerate(experiments.items()):
            full[name] = wall_seconds(overrides, Path(tmp, f"{i}-full"))
            lean[name] = wall_seconds([*overrides, *LEAN], Path(tmp, f"{i}-lean"))
            print(f"{name:45s} every output {full[name]:5.2f} s   lean {lean[name]:5.2f} s")
    result = {
        "experiments": len(full),
        "median_s_every_output": round(statistics.median(full.values()), 2),
        "median_s_lean": round(statistics.median(lean.values()), 2),
        "target_median_s": 1.5,
        "per_experiment_s": {k: [round(full[k], 2), round(lean[k], 2)] for k in full},
    }
    print(
        f"median over {len(full)} experiments: {result['median_s_every_output']} s with every "
        f"output, {result['median_s_lean']} s lean (target 1.5 s)"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
