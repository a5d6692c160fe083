"""Console tables of a run: the per-client summary, replicas, fairness beside a comparison, QoE."""

from __future__ import annotations

from typing import Any


def _fmt(x: Any, digits: int = 3) -> str:
    return "-" if x is None or x != x else f"{x:.{digits}f}"


def format_summary(summary: dict[str, Any]) -> str:
    """A readable per-client table plus the run's totals."""
    head = (
        f"{'client':<12}{'requests':>9}{'done':>7}{'out tok':>10}"
        f"{'TTFT mean':>11}{'TTFT p99':>10}{'TPOT mean':>11}{'E2E mean':>10}"
    )
    lines = [head, "-" * len(head)]
    for client, s in summary["latency"].items():
        if client == "all":
            lines.append("-" * len(head))
        lines.append(
            f"{client:<12}{s['requests']:>9}{s['completed']:>7}{s['output_tokens']:>10}"
            f"{_fmt(s['ttft']['mean']):>11}{_fmt(s['ttft']['p99']):>10}"
            f"{_fmt(s['tpot']['mean'], 4):>11}{_fmt(s['e2e']['mean']):>10}"
        )
    counts = ", ".join(f"{k} {v}" for k, v in summary["status_counts"].items())
    lines += [
        "",
        f"requests: {counts}",
        f"throughput (prompt+output of completed / last finish): "
        f"{_fmt(summary['throughput_tokens_per_s'], 1)} tokens/s",
        f"KV pool use: mean {_fmt(100 * summary['kv_utilisation']['mean'], 1)}%, "
        f"peak {_fmt(100 * summary['kv_utilisation']['peak'], 1)}% of "
        f"{summary['pool_tokens']} tokens",
        "times in seconds",
    ]
    vllm = summary.get("vllm")
    if vllm is not None:
        lines.insert(
            -1,
            f"vLLM engine: {vllm['preemptions']} preemptions ({vllm['preempted_requests']} "
            f"requests), prefix-cache hit rate {_fmt(100 * vllm['prefix_hit_rate'], 1)}% "
            "of admitted prompt tokens",
        )
    replicas = summary.get("replicas") or []
    if len(replicas) > 1:
        lines.insert(-1, format_replicas(replicas))
    inter = summary.get("interactions")
    if inter is not None:
        lat = inter["interaction_latency"]
        lines.insert(
            -1,
            f"interactions: throttled {summary['throttled_interactions']} "
            f"({summary['throttled_requests']} calls), wasted prompt tokens "
            f"{summary['wasted_tokens']}, completed {inter['service_provided']} of "
            f"{inter['interactions_ended']} ended, completion time mean {_fmt(lat['mean'])}",
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


def format_fairness(summary: dict[str, Any]) -> str:
    """Per-client service and the VTC paper's fairness figures, beside the comparison policy's."""
    policy = summary["config"].get("policy", {}).get("_target_", "policy").rsplit(".", 1)[-1]
    runs = [(policy, summary["fairness"])]
    other = summary.get("comparison")
    if other is not None:
        name = other["policy"].upper()
        ours = summary["config"].get("cluster", {}).get("dispatcher")
        if other.get("dispatcher", ours) != ours:  # e.g. FCFS on one shared queue
            name += f" ({other['dispatcher']})"
        runs.append((name, other))
    width = max(14, *(len(name) + 2 for name, _ in runs))
    head = f"{'fairness (w_p=1, w_q=2)':<28}" + "".join(f"{name:>{width}}" for name, _ in runs)
    lines = [head, "-" * len(head)]
    clients = list(runs[0][1]["service_per_client"])
    for c in clients:
        cells = "".join(f"{f['service_per_client'].get(c, 0.0):>{width}.0f}" for _, f in runs)
        lines.append(f"{'service ' + c:<28}" + cells)
    lines.append(f"{'  (received by t = ' + _fmt(runs[0][1]['service_until'], 0) + ' s)':<28}")
    for key, label in (
        ("max_diff", "Max Diff (tok/s)"),
        ("avg_diff", "Avg Diff (tok/s)"),
        ("jain_index", "Jain index of service"),
        ("throughput_tokens_per_s", "throughput (tok/s)"),
        ("rejected", "rejected requests"),
    ):
        lines.append(f"{label:<28}" + "".join(f"{_fmt(f[key], 2):>{width}}" for _, f in runs))
    lines.append(
        "Max/Avg Diff: the paper's service difference over 60 s windows (docs/metrics.md §4)"
    )
    return "\n".join(lines)


def format_qoe(summary: dict[str, Any]) -> str:
    """One line per client of the fluidity-index, then the run's fluid token rate."""
    q = summary["qoe"]
    d = q["deadlines"]
    ttft = d["ttft"] if not isinstance(d["ttft"], dict) else "prefill curve + slack"
    lines = [f"fluidity-index (D_p {ttft} s, D_d {d['tbt']} s; completed requests)"]
    for client, f in [*q["fluidity_per_client"].items(), ("all", q["fluidity"])]:
        lines.append(f"  {client:<12} mean {_fmt(f['mean'])}  p10 {_fmt(f['p10'])}")
    lines.append(f"fluid token generation rate: {_fmt(q['fluid_token_rate'], 1)} tokens/s")
    return "\n".join(lines)
