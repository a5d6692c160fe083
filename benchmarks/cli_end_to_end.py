"""The whole `fairsim` command, as a user runs it, in a subprocess: wall time, peak memory, and
where the time goes.

`--workload azure` (default) runs Vidur's Azure conversation workload on 2 replicas of the
vLLM-style engine (Llama-2-7B / A100-80GB, Vidur operator profile), FCFS, no comparison run,
every default output (run folder, QoE summary, Veeksha files). `--workload core` runs the core
benchmark's 100,000-request S-LoRA workload through the CLI. `--workload overload` runs the
default policy and comparison on poisson_chat with every request arriving in the first second
(`--requests`, default a million: the memory target, <= 2 GB; measured 623 s and 1,901 MB on
a 2-core x86 VM with 24 GB). Target for azure there: <= 5 s and <= 500 MB for the whole process.

`peak_mb` is the largest process's peak resident set; `peak_pss_tree_mb` samples the sum over
the command and its children (`TreeMemory`). The split comes from the CLI's own phase log
(`hydra.verbose=fairsim.timing`): start-up (process start to the run starting: interpreter,
imports, Hydra), then each phase of `run_config` (load, overload check, comparison, simulate,
tables; metrics: the QoE scores, while the plots' child writes the Veeksha rows, distributions
and miss curve; write: the run folder, then waiting for that child). The azure workload's trace
ships with fairsim (--path reads another). Prints one JSON object last.

`--runs N` runs the command N times and prints each figure's median (and the wall time's range);
`--baseline REV` runs the code of a git revision too, from a temporary worktree, alternating with
this one, and adds its figures and `wall_ratio` (this median over the baseline's): on a machine
whose speed drifts, only runs interleaved like this compare.

Usage: python benchmarks/cli_end_to_end.py [--workload azure|core|overload] [--path CSV]
       [--requests N] [--keep DIR] [--runs N] [--baseline REV]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = {
    "azure": [
        "engine=vllm",
        "cost_model=vidur_profile",
        "cost_model.gpu=a100-80gb",
        "workload=vidur",
        "cluster.replicas=2",
        "policy=fcfs",
        "compare_with=null",
        "progress=false",
    ],
    "core": [  # benchmarks/core_throughput.py's workload: 100,000 requests at 2.4/s, 80k-token pool
        "workload=poisson_chat",
        "workload.rate_scale=2.4",
        "workload.duration=41666.67",
        "engine.pool_tokens=80000",
        "engine.batch_max_tokens=8192",
        "policy=fcfs",
        "compare_with=null",
        "progress=false",
    ],
    "overload": [  # the memory target's run: every request arrives in the first second (--requests)
        "workload=poisson_chat",
        "workload.duration=1",
        "progress=false",
    ],
}
PHASE = re.compile(r"phase (.+?) ([0-9.]+)(?: peak ([0-9.]+) MB)?$")


class TreeMemory(threading.Thread):
    """The largest sum of proportional set sizes (Linux's PSS: a page shared by n processes
    counts 1/n in each) over a process and its children, sampled every 0.1 s: `peak_mb` is the
    largest single process, which leaves out a child's own memory (the plots' child). None
    where /proc is not available."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.stop = pid, threading.Event()
        self.peak_mb: float | None = 0.0 if Path("/proc", str(pid)).exists() else None

    def run(self) -> None:
        while self.peak_mb is not None and not self.stop.wait(0.1):
            total = sum(_pss_kb(p) for p in _tree(self.pid)) / 1024
            self.peak_mb = max(self.peak_mb, round(total, 1))


def _tree(pid: int) -> list[int]:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return [pid]
    return [pid, *(p for c in children for p in _tree(int(c)))]


def _pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:  # it ended meanwhile
        pass
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="azure")
    ap.add_argument("--path", type=Path, help="azure: another trace in Vidur's format")
    ap.add_argument("--keep", type=Path, help="write the run folder here (default: a temp dir)")
    ap.add_argument(
        "--requests",
        type=float,
        default=1e6,
        help="overload: about this many requests (poisson_chat's rate_scale); target at 1e6: "
        "the run finishes within 2 GB",
    )
    ap.add_argument("--runs", type=int, default=1, help="run the command this many times")
    ap.add_argument(
        "--baseline",
        metavar="REV",
        help="also run the code of this git revision (a temporary worktree), alternating with "
        "this one, and print its figures and the ratio of the median wall times",
    )
    args = ap.parse_args()
    if args.runs < 1:
        sys.exit(f"--runs must be >= 1, got {args.runs}")
    if args.keep is not None and (args.runs > 1 or args.baseline):
        sys.exit("--keep keeps one run's folder: give it without --runs or --baseline")
    overrides = list(WORKLOADS[args.workload])
    if args.workload == "overload":
        overrides.append(f"workload.rate_scale={args.requests:g}")
    if args.workload == "azure" and args.path is not None:
        if not args.path.exists():
            sys.exit(f"{args.path}: not found (the Azure conversation trace in Vidur's format)")
        overrides.append(f"workload.path={args.path.resolve()}")
    with contextlib.ExitStack() as stack:
        trees = {"current": ROOT}
        if args.baseline:
            trees = {"baseline": stack.enter_context(worktree(args.baseline)), "current": ROOT}
            for tree in trees.values():  # both start from bytecode, as an installed package does
                compile_tree(tree)
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for i in range(args.runs):
            for name in list(trees) if i % 2 == 0 else list(reversed(trees)):  # alternate
                with tempfile.TemporaryDirectory() as tmp:
                    folder = args.keep or Path(tmp) / "run"
                    runs[name].append(measure(trees[name], overrides, folder))
    current = medians(runs["current"])
    out: dict[str, object] = {"workload": args.workload, "runs": args.runs, **current}
    if args.baseline:
        base = medians(runs["baseline"])
        out["baseline"] = {"rev": args.baseline, **base}
        out["wall_ratio"] = round(current["wall_s"] / base["wall_s"], 3)
    print(json.dumps(out))


# `fairsim` as its console script runs it, in this tree or a baseline revision from before the
# command moved to simulator.apps.run.cli
FAIRSIM_MAIN = (
    "try:\n    from simulator.apps.run.cli import main\n"
    "except ImportError:\n    from simulator.apps.cli import main\nmain()"
)


def measure(tree: Path, overrides: list[str], folder: Path) -> dict[str, float]:
    """One run of the command with the code of `tree`: wall time, peaks and the phases' times
    (each run's own: `os.wait4` gives the largest process of this run alone)."""
    command = [
        sys.executable,
        "-c",
        FAIRSIM_MAIN,
        *overrides,
        f"hydra.run.dir={folder}",
        "hydra.verbose=fairsim.timing",
    ]
    with tempfile.TemporaryFile("w+") as log_file:
        spawned = time.time()
        t0 = time.perf_counter()
        proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, cwd=tree)
        sampler = TreeMemory(proc.pid)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        sampler.stop.set()
        proc.returncode = os.waitstatus_to_exitcode(status)
        log_file.seek(0)
        log = log_file.read()
    if proc.returncode != 0:
        sys.exit(f"fairsim failed ({proc.returncode}) in {tree}:\n{log[-3000:]}")
    phases: dict[str, float] = {}
    peaks: dict[str, float] = {}
    for line in log.splitlines():
        m = PHASE.search(line)
        if m:
            name, value = m.group(1), float(m.group(2))
            if name == "start at":
                phases["start-up"] = value - spawned
            else:
                phases[name] = phases.get(name, 0.0) + value
                peaks[f"peak_mb_after_{name.replace(' ', '_')}"] = float(m.group(3))
    result = {"wall_s": round(wall, 3), "peak_mb": round(usage.ru_maxrss / 1024, 1)}
    if sampler.peak_mb is not None:
        result["peak_pss_tree_mb"] = sampler.peak_mb
    result.update({f"{k.replace(' ', '_')}_s": round(v, 3) for k, v in phases.items()})
    return {**result, **peaks}


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the runs (the runs themselves with more than one: a VM's
    speed drifts, so the spread says as much as the middle)."""
    fields = [k for k in runs[0] if all(k in r for r in runs)]
    out = {k: round(statistics.median(r[k] for r in runs), 3) for k in fields}
    if len(runs) > 1:
        out["wall_s_min"] = min(r["wall_s"] for r in runs)
        out["wall_s_max"] = max(r["wall_s"] for r in runs)
    return out


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """A temporary git worktree of this repository at `rev`, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="fairsim-baseline-"))
    tree = folder / "tree"
    add = ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), rev]
    made = subprocess.run(add, capture_output=True, text=True)
    if made.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        sys.exit(f"--baseline {rev}: no worktree ({made.stderr.strip()})")
    try:
        imported = subprocess.run(
            [sys.executable, "-c", "import simulator; print(simulator.__file__)"],
            capture_output=True,
            text=True,
            cwd=tree,
        ).stdout.strip()
        if not Path(imported).resolve().is_relative_to(tree.resolve()):
            sys.exit(f"--baseline {rev}: its folder's code is not the one imported ({imported})")
        yield tree
    finally:
        remove = ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)]
        subprocess.run(remove, capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def compile_tree(tree: Path) -> None:
    """Write the bytecode of fairsim's packages in `tree` (even under PYTHONDONTWRITEBYTECODE):
    otherwise a fresh worktree compiles every module at each start, 0.1-0.2 s."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    packages = ["simulator", "cost_models", "policies", "traces", "conf"]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *packages], cwd=tree, env=env)


if __name__ == "__main__":
    main()
