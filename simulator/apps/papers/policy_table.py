"""`fairsim-policy-table`: policies side by side on one workload and engine.

For each policy (default FCFS, VTC, LPM, DLPM, Andes) on an experiment (default
`dlpm_prefix_heavy`; `andes_overload` for Andes' claim): token throughput and its ratio to
VTC's, the prefix-cache hit rate, the VTC paper's service difference (Max / Avg Diff) and Jain's
index, the worst client's mean TTFT, and the mean Andes QoE (expected TTFT 1 s, 5 tokens/s
reading speed) and its ratio to FCFS's, beside the papers' published claims (the abstracts:
DLPM up to 2.87x VTC's throughput; Andes up to 3.2x FCFS's average QoE). Further Hydra overrides
apply to every row.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from simulator.api.run import compose_config, simulate_config
from simulator.apps.common.command import run_command
from simulator.metrics.fairness import fairness_summary, tick_span
from simulator.metrics.latency import andes_qoe, token_throughput
from simulator.metrics.replicas import engine_counts

POLICIES = ("fcfs", "vtc", "lpm", "dlpm", "andes")
# the papers' published claims, printed beside the measured ratios
PAPER = {
    "dlpm": "throughput up to 2.87x VTC's (Cao et al. 2025)",
    "andes": "average QoE up to 3.2x FCFS's (Liu et al. 2024)",
}


def measure(experiment: str, policy: str, extra: Sequence[str] = ()) -> dict[str, float]:
    cfg = compose_config([f"experiment={experiment}", f"policy={policy}", *extra])
    timeline = simulate_config(cfg)
    requests, tokens = timeline.requests_frame(), timeline.tokens_frame()
    fairness: dict[str, Any] = fairness_summary(
        requests, tokens, total=tick_span(timeline.info.get("end_time"))
    )
    done = requests[requests.status == "completed"]
    ttft = (done.first_token_at - done.arrival).groupby(done.client, observed=True).mean()
    hits = engine_counts(requests)["prefix_hit_rate"] if "cached_tokens" in requests else 0.0
    return {
        "tokens_per_s": token_throughput(requests),
        "prefix_hit_rate": hits,
        "max_diff": float(fairness["max_diff"]),
        "avg_diff": float(fairness["avg_diff"]),
        "jain_index": float(fairness["jain_index"]),
        "worst_client_ttft_s": float(ttft.max()) if len(ttft) else float("nan"),
        "andes_qoe": float(andes_qoe(done, tokens[tokens.request_id.isin(done.request_id)]).mean()),
    }


def format_table(rows: dict[str, dict[str, float]]) -> str:
    def ratio(policy: str, key: str, base: str) -> str:
        if base not in rows or not rows[base][key]:
            return f"{'-':>8}"
        return f"{rows[policy][key] / rows[base][key]:>7.2f}x"

    head = (
        f"{'policy':<8}{'tok/s':>8}{'vs VTC':>8}{'hit rate':>10}{'Max Diff':>10}{'Avg Diff':>10}"
        f"{'Jain':>7}{'worst TTFT s':>14}{'QoE':>7}{'vs FCFS':>9}  paper"
    )
    lines = [head, "-" * len(head)]
    for policy, m in rows.items():
        lines.append(
            f"{policy:<8}{m['tokens_per_s']:>8.0f}{ratio(policy, 'tokens_per_s', 'vtc')}"
            f"{m['prefix_hit_rate']:>10.2f}{m['max_diff']:>10.1f}{m['avg_diff']:>10.1f}"
            f"{m['jain_index']:>7.2f}{m['worst_client_ttft_s']:>14.2f}{m['andes_qoe']:>7.3f}"
            f" {ratio(policy, 'andes_qoe', 'fcfs')}  {PAPER.get(policy, '')}"
        )
    lines.append("QoE: the mean Andes QoE (expected TTFT 1 s, 5 tokens/s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    run_command("fairsim-policy-table", lambda: _main(argv))


def _main(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="dlpm_prefix_heavy")
    parser.add_argument("--policy", action="append", help=f"default: {', '.join(POLICIES)}")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every row")
    args = parser.parse_args(argv)
    rows = {}
    for policy in args.policy or POLICIES:
        rows[policy] = measure(args.experiment, policy, args.overrides)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
