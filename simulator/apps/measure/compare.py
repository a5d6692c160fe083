"""`fairsim-compare RUN_A RUN_B ...`: runs side by side, measured (fairsim-bench) or simulated.

Per latency metric (TTFT, inter-token latency, TPOT, E2E, normalized E2E; completed requests):
count, mean and quantiles of each run, and against the first run the two-sample
Kolmogorov-Smirnov statistic and the Wasserstein distance (in seconds). Then throughput, each
client's service, the fairness figures and fluidity from the runs' summaries. Writes
comparison.json (every figure) and cdf.png (the distributions overlaid) to --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from simulator.apps.common.command import run_command
from simulator.core.errors import ConfigError
from simulator.metrics.latency import per_request_latency, tbt_values
from simulator.report.run_folder import (
    IncompleteRunError,
    MalformedRunError,
    RunOutputs,
    json_safe,
    load_run,
    write_text_atomically,
)

METRICS = {  # name -> label
    "ttft": "TTFT (s)",
    "itl": "inter-token latency (s)",
    "tpot": "TPOT (s)",
    "e2e": "E2E latency (s)",
    "normalized_e2e": "normalized E2E (s/token)",
}
QUANTILES = (0.5, 0.9, 0.99)


def samples(run: RunOutputs) -> dict[str, np.ndarray]:
    """Each latency metric's values over the run's completed requests."""
    done = run.requests[run.requests["status"] == "completed"]
    assert run.tokens is not None  # load_run reads every table
    tokens = run.tokens[run.tokens["request_id"].isin(done["request_id"])]
    per = per_request_latency(done, tokens)
    out = {k: per[k].to_numpy() for k in ("ttft", "tpot", "e2e", "normalized_e2e")}
    out["itl"] = tbt_values(tokens)
    return {k: v[np.isfinite(v)] for k, v in out.items()}


def describe(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {
            "count": 0,
            "mean": float("nan"),
            **{f"p{int(100 * q)}": float("nan") for q in QUANTILES},
        }
    qs = np.quantile(values, QUANTILES)
    return {
        "count": int(values.size),
        "mean": float(values.mean()),
        **{f"p{int(100 * q)}": float(v) for q, v in zip(QUANTILES, qs)},
    }


def distance(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """How far distribution b is from a: KS statistic and Wasserstein-1 distance."""
    from scipy.stats import ks_2samp, wasserstein_distance

    if a.size == 0 or b.size == 0:
        return {"ks": float("nan"), "wasserstein": float("nan")}
    return {
        "ks": float(ks_2samp(a, b).statistic),
        "wasserstein": float(wasserstein_distance(a, b)),
    }


def summary_figures(summary: dict[str, Any]) -> dict[str, Any]:
    fairness = summary.get("fairness", {})
    qoe = summary.get("qoe", {})
    return {
        "requests": summary.get("requests"),
        "status_counts": summary.get("status_counts"),
        "throughput_tokens_per_s": summary.get("throughput_tokens_per_s"),
        "max_diff": fairness.get("max_diff"),
        "avg_diff": fairness.get("avg_diff"),
        "jain_index": fairness.get("jain_index"),
        "service_per_client": fairness.get("service_per_client", {}),
        "fluidity_mean": (qoe.get("fluidity") or {}).get("mean"),
        "fluid_token_rate": qoe.get("fluid_token_rate"),
    }


def labels_of(folders: list[Path]) -> list[str]:
    """The folders' names, with their parents where names repeat."""
    names = [f.name for f in folders]
    if len(set(names)) == len(names):
        return names
    return [
        str(Path(f.parent.name, f.name)) if names.count(f.name) > 1 else f.name for f in folders
    ]


def compare(folders: list[Path]) -> dict[str, Any]:
    runs = []
    for f in folders:
        try:
            runs.append(load_run(f))
        except (IncompleteRunError, MalformedRunError) as err:
            raise ConfigError(str(err)) from None
    labels = labels_of(folders)
    values = [samples(r) for r in runs]
    metrics: dict[str, Any] = {}
    for m in METRICS:
        metrics[m] = {
            label: {**describe(v[m]), **({} if i == 0 else distance(values[0][m], v[m]))}
            for i, (label, v) in enumerate(zip(labels, values))
        }
    return {
        "runs": dict(zip(labels, (str(f) for f in folders))),
        "baseline": labels[0],
        "latency": metrics,
        "summary": {label: summary_figures(r.summary) for label, r in zip(labels, runs)},
        "_samples": dict(zip(labels, values)),
    }


def plot_cdfs(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS), 3.4))
    for ax, (m, label) in zip(axes, METRICS.items()):
        for run, values in result["_samples"].items():
            v = np.sort(values[m])
            if v.size:
                ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=run)
        ax.set_xlabel(label)
        ax.set_ylabel("CDF")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_comparison(result: dict[str, Any]) -> str:
    labels = list(result["runs"])
    width = max(14, *(len(x) + 2 for x in labels))
    lines = [f"baseline: {result['baseline']} (KS and Wasserstein are against it)"]
    head = f"{'metric':<24}{'run':<{width}}{'n':>7}" + "".join(
        f"{c:>10}" for c in ("mean", "p50", "p90", "p99", "KS", "W1")
    )
    lines += [head, "-" * len(head)]
    for m, label in METRICS.items():
        for i, run in enumerate(labels):
            s = result["latency"][m][run]
            ks = "" if i == 0 else _num(s["ks"], ".4f")
            w1 = "" if i == 0 else _num(s["wasserstein"], ".4f")
            lines.append(
                f"{(label if i == 0 else ''):<24}{run:<{width}}{s['count']:>7}"
                f"{_num(s['mean'], '.4f'):>10}{_num(s['p50'], '.4f'):>10}"
                f"{_num(s['p90'], '.4f'):>10}{_num(s['p99'], '.4f'):>10}{ks:>10}{w1:>10}"
            )
    lines += ["", f"{'':<24}" + "".join(f"{x:>{width}}" for x in labels)]
    rows = (
        ("throughput (tok/s)", "throughput_tokens_per_s", ".1f"),
        ("Max Diff (tok/s)", "max_diff", ".2f"),
        ("Avg Diff (tok/s)", "avg_diff", ".2f"),
        ("Jain index", "jain_index", ".3f"),
        ("fluidity mean", "fluidity_mean", ".3f"),
        ("fluid token rate", "fluid_token_rate", ".1f"),
    )
    for name, key, fmt in rows:
        cells = "".join(f"{_num(result['summary'][x][key], fmt):>{width}}" for x in labels)
        lines.append(f"{name:<24}{cells}")
    clients = sorted({c for x in labels for c in result["summary"][x]["service_per_client"]})
    for c in clients:
        cells = "".join(
            f"{_num(result['summary'][x]['service_per_client'].get(c), '.0f'):>{width}}"
            for x in labels
        )
        lines.append(f"{'service ' + c:<24}{cells}")
    return "\n".join(lines)


def _num(x: Any, fmt: str) -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "-"
    return format(x, fmt)


def write_outputs(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    public = {k: v for k, v in result.items() if not k.startswith("_")}
    write_text_atomically(out / "comparison.json", json.dumps(json_safe(public), indent=2) + "\n")
    plot_cdfs(result, out / "cdf.png")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="fairsim-compare",
        description="Compare run folders (measured or simulated) metric by metric.",
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run folders; the first is the baseline")
    parser.add_argument("--out", type=Path, default=Path("comparison"), help="output folder")
    args = parser.parse_args(argv)

    def job() -> None:
        if len(args.runs) < 2:
            raise ConfigError("fairsim-compare needs at least two run folders")
        result = compare(args.runs)
        write_outputs(result, args.out)
        print(format_comparison(result))
        print(f"comparison: {args.out}/comparison.json, {args.out}/cdf.png")

    run_command("fairsim-compare", job)
