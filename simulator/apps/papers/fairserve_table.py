"""The FairServe paper's claims, measured: `fairsim-fairserve-table`.

For each experiment (fairserve_overload, fairserve_sustained, fairserve_no_overload) and each
policy (FairServe, its variants FS(W), FS(W+L), FS(W+O), the interaction-aware RPM baseline,
VTC) it prints throttled calls and interactions, wasted prompt tokens, benign users' interaction
completion time and TTFT (users whose name has no "abuser"), and token throughput. User limits
are 10 per minute for FairServe and RPM alike; nothing is tuned per row. Beside throttled
calls, throttled interactions and wasted tokens it prints the paper's figure where the paper
published one: its artifact run, which `fairserve_overload` is shaped like (FairServe §6.2,
Fig. 8a-b: RPM with a user limit of 10 rejected 2,843 calls in 1,996 interactions and wasted about
108k prompt tokens; FairServe rejected 79 calls and wasted none; VTC rejected none).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from simulator.api.run import compose_config, simulate_config
from simulator.apps.common.command import run_command
from simulator.apps.sweeps.replications import (
    add_replications_option,
    interval_cell,
    paper_replication,
    paper_suite_heading,
)
from simulator.metrics import interactions
from simulator.metrics.latency import token_throughput

EXPERIMENTS = ("fairserve_overload", "fairserve_sustained", "fairserve_no_overload")
POLICIES = ("fairserve", "fs_w", "fs_wl", "fs_wo", "rpm_interaction", "vtc")
# the paper's published figures: (experiment, policy) -> {metric: value}
PAPER: dict[tuple[str, str], dict[str, float]] = {
    ("fairserve_overload", "rpm_interaction"): {
        "throttled_requests": 2843,
        "throttled_interactions": 1996,
        "wasted_tokens": 108_000,
    },
    ("fairserve_overload", "fairserve"): {"throttled_requests": 79, "wasted_tokens": 0},
    ("fairserve_overload", "vtc"): {
        "throttled_requests": 0,
        "throttled_interactions": 0,
        "wasted_tokens": 0,
    },
}


def measure(
    experiment: str,
    policy: str,
    seed: int | None = None,
    extra: Sequence[str] = (),
    replication: int | None = None,
) -> dict[str, float]:
    """One row of the table; `extra` are further Hydra overrides (e.g. workload.rate_scale=2);
    `replication` i runs it as paper-suite replication i (the suites' jitter, stream i)."""
    overrides = [f"experiment={experiment}", f"policy={policy}", *extra]
    if seed is not None:
        overrides.append(f"seed={seed}")
    cfg = compose_config(overrides)
    if replication is not None:
        cfg = paper_replication(cfg, replication)
    timeline = simulate_config(cfg)
    requests = timeline.requests_frame()
    throttled = interactions.throttling(requests)
    latency = interactions.interaction_latency(requests, users="!abuser")
    benign = ~requests["user"].astype(str).str.contains("abuser", regex=False)
    ttft = (requests["first_token_at"] - requests["arrival"])[benign]
    return {
        "throttled_requests": throttled["throttled_requests"],
        "throttled_interactions": throttled["throttled_interactions"],
        "wasted_tokens": throttled["wasted_tokens"],
        "benign_interaction_s": latency["mean"],
        "benign_interaction_p90_s": latency["p90"],
        "benign_ttft_s": float(ttft.mean()),
        "tokens_per_s": token_throughput(requests),
    }


def _published(paper: dict[str, float], key: str, width: int) -> str:
    return f"{paper[key]:>{width}.0f}" if key in paper else " " * width


def main(argv: list[str] | None = None) -> None:
    run_command("fairsim-fairserve-table", lambda: _main(argv))


def _main(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", action="append", choices=EXPERIMENTS)
    parser.add_argument("--policy", action="append", choices=POLICIES)
    parser.add_argument("--seed", type=int, help="the workload's seed (default: the experiment's)")
    parser.add_argument(
        "overrides", nargs="*", help="Hydra overrides for every row, e.g. workload.rate_scale=2"
    )
    add_replications_option(parser)
    args = parser.parse_args(argv)
    cells = [(e, p) for e in args.experiment or EXPERIMENTS for p in args.policy or POLICIES]
    if args.replications > 1:
        print_intervals(cells, args.replications, args.seed, args.overrides)
        return
    head = (
        f"{'experiment':<23}{'policy':<17}{'thr calls':>10}{'paper':>7}{'thr inter':>10}"
        f"{'paper':>7}{'wasted':>8}{'paper':>8}"
        f"{'benign inter s':>15}{'p90':>7}{'benign TTFT':>12}{'tok/s':>8}"
    )
    print(head)
    for experiment, policy in cells:
        m = measure(experiment, policy, args.seed, args.overrides)
        paper = PAPER.get((experiment, policy), {})
        print(
            f"{experiment:<23}{policy:<17}{m['throttled_requests']:>10}"
            f"{_published(paper, 'throttled_requests', 7)}{m['throttled_interactions']:>10}"
            f"{_published(paper, 'throttled_interactions', 7)}{m['wasted_tokens']:>8}"
            f"{_published(paper, 'wasted_tokens', 8)}"
            f"{m['benign_interaction_s']:>15.1f}{m['benign_interaction_p90_s']:>7.1f}"
            f"{m['benign_ttft_s']:>12.2f}{m['tokens_per_s']:>8.0f}",
            flush=True,
        )
    print("paper: FairServe's published figures (its artifact run; blank: none published)")


def print_intervals(
    cells: list[tuple[str, str]], n: int, seed: int | None, extra: Sequence[str]
) -> None:
    """Each (experiment, policy) run n times with the paper-suite jitter (seeds 0 .. n-1):
    median [p5, p95] of throttled calls and interactions and wasted tokens beside the paper's."""
    print(paper_suite_heading(n))
    keys = ("throttled_requests", "throttled_interactions", "wasted_tokens")
    print(
        f"{'experiment':<23}{'policy':<17}" + "".join(f"{k:>28} {'paper':>8} {'':>3}" for k in keys)
    )
    for experiment, policy in cells:
        runs = [measure(experiment, policy, seed, extra, i) for i in range(n)]
        paper = PAPER.get((experiment, policy), {})
        cells_text = "".join(
            interval_cell([float(m[k]) for m in runs], paper.get(k), digits=0) for k in keys
        )
        print(f"{experiment:<23}{policy:<17}{cells_text}", flush=True)
