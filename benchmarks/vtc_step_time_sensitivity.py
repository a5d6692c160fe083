"""How far the VTC overload suite's service differences move with the step time, and how long
one cycle of its batches lasts, in the artifact's logs and in fairsim.

In the two-client overload suite (Tables 4 and 5) VTC serves the clients in alternating batches
of 20 requests; the Max / Avg Diff and Diff Var the paper prints are that alternation seen
through 60 s windows. This prints, for Tables 4 and 5's VTC rows, one unjittered run with every
term of the row's cost model scaled by each `--scales` factor (1.0: as fitted), beside the
published figures. With `--logs` (the artifact's result logs, shipped as test data in
tests/data/vtc_artifact) it also prints the median time between the prefill batches of 10 or
more requests that start each cycle, under FCFS and VTC, in the logs and in fairsim.
Prints one JSON object last.

Usage: python benchmarks/vtc_step_time_sensitivity.py [--scales 0.99,1,1.01] [--logs DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import numpy as np

from simulator.api import compose_config, simulate_config
from simulator.apps.papers.vtc_tables import ROWS, measure

TERMS = (
    "prefill_per_token",
    "prefill_per_request",
    "decode_base",
    "decode_per_seq",
    "decode_per_context_token",
    "step_overhead",
)
SAME_BATCH = 0.01  # seconds: first tokens this close together came from one prefill step


def scaled(table: str, scales: list[float]) -> dict[str, dict[str, float]]:
    row = next(r for r in ROWS if r.table == table and r.label == "VTC")
    cost = compose_config(list(row.overrides)).cost_model
    out = {"published": {"max_diff": row.max_diff, "avg_diff": row.avg_diff}}
    out["published"]["diff_var"] = row.diff_var
    for k in scales:
        extra = tuple(f"cost_model.{t}={float(cost[t]) * k!r}" for t in TERMS)
        m = measure(row, extra)
        out[f"x{k:g}"] = {
            key: round(float(m[key]), 2) for key in ("max_diff", "avg_diff", "diff_var")
        }
    return out


def cycle(first_tokens: np.ndarray) -> float:
    """Median time between the starts of successive prefill batches of 10 or more requests."""
    f = np.sort(first_tokens)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(f) > SAME_BATCH) + 1])
    sizes = np.diff(np.concatenate([starts, [len(f)]]))
    return float(np.median(np.diff(f[starts][sizes >= 10])))


def cycles(logs: Path) -> dict[str, dict[str, float]]:
    out = {}
    for policy, folder in (("fcfs", "FCFS"), ("vtc", "VTC")):
        path = logs / folder / "all_results_overload.jsonl.gz"
        with gzip.open(path, "rt") as fh:
            responses = json.loads(fh.readline())["result"]["responses"]
        served = [r for r in responses if r["first_token_latency"] >= 0]
        logged = np.array([r["req_time"] + r["first_token_latency"] for r in served])
        cfg = compose_config(
            ["experiment=vtc_overload", f"policy={policy}", "workload.duration=600"]
        )
        requests = simulate_config(cfg).requests_frame()
        simulated = requests.first_token_at.dropna().to_numpy()
        out[policy] = {
            "artifact_s": round(cycle(logged), 3),
            "fairsim_s": round(cycle(simulated), 3),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", default="0.99,1,1.01")
    parser.add_argument("--logs", type=Path, help="the artifact's logs (tests/data/vtc_artifact)")
    args = parser.parse_args()
    scales = [float(s) for s in args.scales.split(",")]
    result: dict[str, object] = {}
    for table in ("4", "5"):
        result[f"table_{table}_vtc"] = rows = scaled(table, scales)
        for name, figures in rows.items():
            print(
                f"Table {table} VTC {name:10s} "
                + "  ".join(f"{k} {v:,.2f}" for k, v in figures.items())
            )
    if args.logs is not None:
        result["cycle"] = cycles(args.logs)
        for policy, c in result["cycle"].items():  # type: ignore[union-attr]
            print(f"cycle under {policy}: artifact {c['artifact_s']} s, fairsim {c['fairsim_s']} s")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
