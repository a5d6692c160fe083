"""Console tables of a run: the per-client summary, replicas, fairness beside a comparison, QoE.

Per-client tables show at most `max_rows` clients (the busiest, in natural order) and
say how many more there are; `max_rows=None` shows every client. The run folder holds them all.
"""

from __future__ import annotations

import re
from typing import Any

DEFAULT_ROWS = 20


def _fmt(x: Any, digits: int = 3) -> str:
    return "-" if x is None or x != x else f"{x:.{digits}f}"


def natural_key(name: str) -> list[Any]:
    """Sort key that reads digits as numbers: client2 before client10."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name)]


def shown_clients(requests_per_client: dict[str, int], max_rows: int | None) -> list[str]:
    """The clients a table shows, in natural order (client2 before client10): all, or the
    `max_rows` with the most requests (ties: the first in that order)."""
    names = sorted(requests_per_client, key=natural_key)
    if max_rows is None or len(names) <= max_rows:
        return names
    busiest = sorted(names, key=lambda c: -requests_per_client[c])[:max_rows]
    keep = set(busiest)
    return [c for c in names if c in keep]


def _more(total: int, shown: int) -> list[str]:
    if total == shown:
        return []
    return [
        f"... {total - shown} more clients (console_rows=null prints all; the run folder holds all)"
    ]


def _name_width(names: list[str], minimum: int = 12) -> int:
    return max(minimum, *(len(n) + 2 for n in names)) if names else minimum


def format_summary(summary: dict[str, Any], max_rows: int | None = DEFAULT_ROWS) -> str:
    """A readable per-client table plus the run's totals."""
    per_client = {c: s for c, s in summary["latency"].items() if c != "all"}
    shown = shown_clients({c: s["requests"] for c, s in per_client.items()}, max_rows)
    width = _name_width([*shown, "all"])
    head = (
        f"{'client':<{width}}{'requests':>9}{'done':>7}{'out tok':>10}"
        f"{'TTFT mean':>11}{'TTFT p99':>10}{'TPOT mean':>11}{'E2E mean':>10}"
    )
    lines = ["per client (times in seconds)", head, "-" * len(head)]
    rows = [(c, per_client[c]) for c in shown]
    for client, s in [*rows, ("all", summary["latency"]["all"])]:
        if client == "all":
            lines += _more(len(per_client), len(shown))
            lines.append("-" * len(head))
        lines.append(
            f"{client:<{width}}{s['requests']:>9}{s['completed']:>7}{s['output_tokens']:>10}"
            f"{_fmt(s['ttft']['mean']):>11}{_fmt(s['ttft']['p99']):>10}"
            f"{_fmt(s['tpot']['mean'], 4):>11}{_fmt(s['e2e']['mean']):>10}"
        )
    counts = ", ".join(f"{k} {v}" for k, v in summary["status_counts"].items())
    why = ", ".join(f"{n} {key}" for key, n in sorted(summary.get("reasons", {}).items()))
    lines += [
        "",
        f"requests: {counts}" + (f" (why not completed: {why})" if why else ""),
        *_gave_up(summary.get("client_timeouts")),
        f"throughput (prompt+output of completed / last finish): "
        f"{_fmt(summary['throughput_tokens_per_s'], 1)} tokens/s",
    ]
    if summary["pool_tokens"]:  # a measured run (fairsim-bench) knows no pool
        lines.append(
            f"KV pool use: mean {_fmt(100 * summary['kv_utilisation']['mean'], 1)}%, "
            f"peak {_fmt(100 * summary['kv_utilisation']['peak'], 1)}% of "
            f"{summary['pool_tokens']} tokens"
        )
    if summary["status_counts"].get("completed", 0) == 0:
        lines.append("no completed requests: latency, fairness and fluidity figures are empty (-)")
    vllm = summary.get("vllm")
    if vllm is not None:
        lines.append(
            f"vLLM engine: {vllm['preemptions']} preemptions ({vllm['preempted_requests']} "
            f"requests), prefix-cache hit rate {_fmt(100 * vllm['prefix_hit_rate'], 1)}% "
            f"of admitted prompt tokens, {vllm['recompute_avoided_tokens']} tokens of recompute "
            "avoided by hits after preemptions",
        )
        grown = vllm.get("block_size")
        if grown is not None:
            lines.append(
                f"KV blocks of {grown} tokens, not engine.block_size's: vLLM grows a block "
                "until one layer's page of it holds a recurrent layer's state"
            )
        moved = vllm.get("cpu_tier")
        if moved is not None:
            gb = {k: _fmt(v / 1e9, 2) for k, v in moved.items()}
            lines.append(
                f"CPU KV tier: hit rate {_fmt(100 * vllm['cpu_hit_rate'], 1)}% of admitted prompt "
                f"tokens, {vllm['swap_ins']} swap-ins; GB offloaded "
                f"{gb['cpu_kv_bytes_offloaded']}, loaded {gb['cpu_kv_bytes_loaded']}, swapped "
                f"out {gb['cpu_kv_bytes_swapped_out']}"
            )
    pd_block = summary.get("disaggregation")
    if pd_block is not None:
        wait, took = pd_block["decode_admission_wait"], pd_block["kv_transfer_time"]
        lines.append(
            f"prefill/decode pools: {pd_block['disaggregated_requests']} prompts computed on the "
            f"prefill pool, {pd_block['kv_transfers']} KV transfers, "
            f"{_fmt(pd_block['kv_bytes_moved'] / 1e9, 2)} GB moved; wait for a decode slot "
            f"mean {_fmt(wait['mean'], 4)} s, transfer mean {_fmt(took['mean'], 4)} s "
            f"(p99 {_fmt(took['p99'], 4)} s)"
        )
    tiers = summary.get("tiers")
    if tiers is not None:
        lines.append(format_tiers(tiers))
    fleet = summary.get("autoscaler")
    if fleet is not None:
        lines.append(
            f"autoscaler: {_fmt(fleet['gpu_seconds'] / 3600, 2)} GPU-hours, at most "
            f"{fleet['max_ready']} replicas ready, {fleet['under_provisioned_requests']} "
            "requests arrived while fewer were ready than wanted "
            f"({fleet['under_provisioned_completed']} of them completed)"
        )
    replicas = summary.get("replicas") or []
    if len(replicas) > 1:
        lines.append(format_replicas(replicas))
    inter = summary.get("interactions")
    if inter is not None:
        lat = inter["interaction_latency"]
        lines.append(
            f"interactions: throttled {summary['throttled_interactions']} "
            f"({summary['throttled_requests']} calls), wasted prompt tokens "
            f"{summary['wasted_tokens']}, completed {inter['service_provided']} of "
            f"{inter['interactions_ended']} ended, completion time mean {_fmt(lat['mean'])} s",
        )
    return "\n".join(lines)


def _gave_up(block: dict[str, int] | None) -> list[str]:
    """The clients that gave up (summary.json's `client_timeouts`), when any did."""
    if not block or not block["requests"]:
        return []
    return [
        f"clients gave up on {block['requests']} requests ({block['before_first_token']} before "
        f"their first token, {block['after_first_token']} after it); "
        f"{block['output_tokens_wasted']} output tokens were generated for them in vain"
    ]


def format_tiers(block: dict[str, Any]) -> str:
    """One line per SLO class: its requests, what the gateway turned away, its TTFT, and the
    service gap between its tenants (the `tiers` block of summary.json)."""
    lines = ["SLO class      requests   done  rejected  TTFT mean  TTFT p99  Max Diff  Jain"]
    for name, t in block["tiers"].items():
        fair = t.get("fairness") or {}
        lines.append(
            f"{name:<14}{t['requests']:>9}{t['completed']:>7}{sum(t['rejected'].values()):>10}"
            f"{_fmt(t['ttft_mean_s']):>11}{_fmt(t['ttft_p99_s']):>10}"
            f"{_fmt(fair.get('max_diff'), 2):>10}{_fmt(fair.get('jain_index'), 2):>6}"
        )
    reasons: dict[str, int] = {}
    for t in block["tiers"].values():
        for reason, n in t["rejected"].items():
            reasons[reason] = reasons.get(reason, 0) + n
    if reasons:
        lines.append("  rejected: " + ", ".join(f"{n} {r}" for r, n in sorted(reasons.items())))
    lines.append(
        "  (TTFT in seconds; Max Diff: the largest gap in service rate, tok/s, between the "
        "class's tenants; Jain: 1 = equal service; '-': one tenant)"
    )
    return "\n".join(lines)


def format_replicas(replicas: list[dict[str, Any]]) -> str:
    head = (
        f"{'replica':<9}{'requests':>9}{'done':>7}{'out tok':>10}{'tok/s':>10}"
        f"{'TTFT mean':>11}{'TTFT p99':>10}{'preempt':>9}{'KV mean':>9}"
    )
    lines = [head]
    for r in replicas:
        lines.append(
            f"{r['replica']:<9}{r['requests']:>9}{r['completed']:>7}{r['output_tokens']:>10}"
            f"{_fmt(r['throughput_tokens_per_s'], 1):>10}{_fmt(r['ttft_mean']):>11}"
            f"{_fmt(r['ttft_p99']):>10}{r['preemptions']:>9}"
            f"{_fmt(100 * r['kv_utilisation']['mean'], 1) + '%':>9}"
        )
    return "\n".join(lines)


def format_fairness(summary: dict[str, Any], max_rows: int | None = DEFAULT_ROWS) -> str:
    """Per-client service and the VTC paper's fairness figures, beside the comparison policy's."""
    policy = summary["config"].get("policy", {}).get("_target_", "policy").rsplit(".", 1)[-1]
    if "target" in summary["config"]:  # measured by fairsim-bench: the target's own scheduling
        policy = "measured"
    runs = [(policy, summary["fairness"])]
    other = summary.get("comparison")
    if other is not None:
        name = other["policy"].upper()
        ours = summary["config"].get("cluster", {}).get("dispatcher")
        if other.get("dispatcher", ours) != ours:  # e.g. FCFS on one shared queue
            name += f" ({other['dispatcher']})"
        runs.append((name, other))
    width = max(14, *(len(name) + 2 for name, _ in runs))
    service = runs[0][1]["service_per_client"]
    requests = {c: s["requests"] for c, s in summary["latency"].items() if c != "all"}
    shown = shown_clients({c: requests.get(c, 0) for c in service}, max_rows)
    label_width = _name_width(["service " + c for c in shown], 28)
    head = f"{'fairness (w_p=1, w_q=2)':<{label_width}}" + "".join(
        f"{name:>{width}}" for name, _ in runs
    )
    lines = [head, "-" * len(head)]
    for c in shown:
        cells = "".join(f"{f['service_per_client'].get(c, 0.0):>{width}.0f}" for _, f in runs)
        lines.append(f"{'service ' + c:<{label_width}}" + cells)
    lines += _more(len(service), len(shown))
    until = _fmt(runs[0][1]["service_until"], 0)
    lines.append(f"  (service received by t = {until} s, the last arrival)")
    for key, label, digits in (
        ("max_diff", "Max Diff (tok/s)", 2),
        ("avg_diff", "Avg Diff (tok/s)", 2),
        ("jain_index", "Jain index of service", 2),
        ("throughput_tokens_per_s", "throughput (tok/s)", 2),
        ("rejected", "rejected requests", 0),
    ):
        cells = "".join(f"{_fmt(f[key], digits):>{width}}" for _, f in runs)
        lines.append(f"{label:<{label_width}}" + cells)
    lines.append(
        "service: prompt tokens x w_p + output tokens x w_q (VTC's price); Max/Avg Diff: the "
        "largest/mean gap in service rate between backlogged clients over 60 s windows "
        "(docs/metrics.md §4); Jain index: 1 = equal service"
    )
    return "\n".join(lines)


def format_qoe(summary: dict[str, Any], max_rows: int | None = DEFAULT_ROWS) -> str:
    """One line per client of the fluidity-index, then the run's fluid token rate."""
    q = summary["qoe"]
    d = q["deadlines"]
    ttft = d["ttft"] if not isinstance(d["ttft"], dict) else "prefill curve + slack"
    lines = [f"fluidity-index (D_p {ttft} s, D_d {d['tbt']} s; completed requests)"]
    per_client = q["fluidity_per_client"]
    requests = {c: s["requests"] for c, s in summary["latency"].items() if c != "all"}
    shown = shown_clients({c: requests.get(c, 0) for c in per_client}, max_rows)
    width = _name_width([*shown, "all"])
    for client in shown:
        f = per_client[client]
        lines.append(f"  {client:<{width}} mean {_fmt(f['mean'])}  p10 {_fmt(f['p10'])}")
    lines += ["  " + line for line in _more(len(per_client), len(shown))]
    f = q["fluidity"]
    lines.append(f"  {'all':<{width}} mean {_fmt(f['mean'])}  p10 {_fmt(f['p10'])}")
    lines.append(f"fluid token generation rate: {_fmt(q['fluid_token_rate'], 1)} tokens/s")
    lines.append(
        "fluidity-index: the share of a request's tokens that met their deadlines, D_p for "
        "the first token, D_d for each later one (1 = every token on time; Etalon's metric)"
    )
    return "\n".join(lines)


def format_slos(results: dict[str, Any]) -> str:
    """One line per SLO with its observed value and PASS/FAIL, then the verdict."""
    lines = ["SLOs"]
    for r in results["results"]:
        sign = "<=" if r["lower_is_better"] else ">="
        verdict = "PASS" if r["met"] else "FAIL"
        needs = f"needs {sign} {r['threshold']:g}"
        lines.append(f"  {verdict}  {r['name']}: observed {_fmt(r['observed_value'], 4)} ({needs})")
    lines.append(f"  {'all SLOs met' if results['all_slos_met'] else 'some SLOs missed'}")
    return "\n".join(lines)
