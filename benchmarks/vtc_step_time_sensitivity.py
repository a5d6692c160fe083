"""How far the VTC overload suite's service differences move with the step time, and how long
one cycle of its batches lasts, in the artifact's logs and in fairsim.

In the two-client overload suite (Tables 4 and 5) VTC serves the clients in alternating batches
of 20 requests; the Max / Avg Diff and Diff Var the paper prints are that alternation seen
through 60 s windows. This prints, for Tables 4 and 5's VTC rows, one unjittered run with every
term of the row's cost model scaled by each `--scales` factor (1.0: the shipped model), beside the
published figures. With `--logs` (the artifact's result logs, shipped as test data in
tests/data/vtc_artifact) it also prints, under FCFS and VTC, in the logs and in fairsim: the
median time between the prefill batches of 10 or more requests that start each cycle (and its
range from the fifth cycle on), the most common batch sizes, and the share of those large
batches that hold one client's requests only. Prints one JSON object last.

Usage: python benchmarks/vtc_step_time_sensitivity.py [--scales 0.99,1,1.01] [--logs DIR]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import numpy as np

from simulator.api import compose_config, simulate_config
from simulator.apps.papers.vtc_tables import ROWS, artifact_log_requests, measure

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


def batches(first_tokens: np.ndarray, clients: np.ndarray) -> dict[str, float | list[int]]:
    """The prefill batches (first tokens within SAME_BATCH of each other): the median time
    between the starts of those of 10 or more requests (one per cycle), the most common sizes,
    and the share of the large ones that hold one client's requests only."""
    order = np.argsort(first_tokens, kind="stable")
    f, c = first_tokens[order], clients[order]
    starts = np.concatenate([[0], np.flatnonzero(np.diff(f) > SAME_BATCH) + 1])
    sizes = np.diff(np.concatenate([starts, [len(f)]]))
    large = [i for i in range(len(starts)) if sizes[i] >= 10]
    one_client = [len(set(c[starts[i] : starts[i] + sizes[i]].tolist())) == 1 for i in large]
    common = Counter(sizes.tolist()).most_common(4)
    cycles = np.diff(f[starts][sizes >= 10])
    steady = cycles[4:]  # from the fifth cycle on
    return {
        "cycle_s": round(float(np.median(cycles)), 3),
        "cycle_range_s": [round(float(steady.min()), 2), round(float(steady.max()), 2)],
        "common_batch_sizes": sorted(size for size, _ in common),
        "large_batches_of_one_client": round(float(np.mean(one_client)), 3),
    }


def cycles(logs: Path) -> dict[str, dict[str, dict[str, float | list[int]]]]:
    out = {}
    for policy, folder in (("fcfs", "FCFS"), ("vtc", "VTC")):
        logged, _ = artifact_log_requests(logs / folder / "all_results_overload.jsonl.gz")
        logged = logged.dropna(subset=["first_token_at"])
        cfg = compose_config(
            ["experiment=vtc_overload", f"policy={policy}", "workload.duration=600"]
        )
        requests = simulate_config(cfg).requests_frame().dropna(subset=["first_token_at"])
        out[policy] = {
            "artifact": batches(
                logged.first_token_at.to_numpy(), logged.client.astype(str).to_numpy()
            ),
            "fairsim": batches(
                requests.first_token_at.to_numpy(), requests.client.astype(str).to_numpy()
            ),
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
        for policy, sides in result["cycle"].items():  # type: ignore[union-attr]
            for side, facts in sides.items():
                print(f"{policy} {side:8s} " + "  ".join(f"{k} {v}" for k, v in facts.items()))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
