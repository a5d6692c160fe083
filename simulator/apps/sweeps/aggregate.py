"""A sweep as one tidy table, and its standard plots: `fairsim-aggregate SWEEP_DIR`.

One row per job x client (plus the client "all"): the job's folder and status, its
configuration (the config groups chosen, every override, the seed), the run's figures
(throughput, fairness, throttling, KV use) and the client's (latency percentiles, service,
fluidity). Failed and unfinished jobs keep one row with their error, so nothing is lost.
Writes SWEEP_DIR/sweep.parquet and sweep.csv; sweep_intervals.csv (per setting, each plotted
metric's mean over the seeds and its 95% bootstrap confidence interval); and with plots:
sweep_metrics.png (metrics against a load column, one line per policy, the interval as a band),
sweep_service.png (per-client service rate over time, one panel per policy) and
sweep_fluidity.png (fluidity-index CDFs).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from matplotlib.figure import Figure

from simulator.apps.common.command import run_command
from simulator.apps.common.hydra_jobs import job_folders
from simulator.core.errors import ConfigError
from simulator.metrics import fairness, latency
from simulator.report.pictures import client_colours, client_groups, save_png
from simulator.report.run_folder import read_status
from simulator.report.veeksha import REQUEST_ROWS_FILE

GROUPS = ("policy", "workload", "engine", "cost_model", "experiment")
RUN_METRICS = {  # column: path in summary.json
    "throughput_tokens_per_s": ("throughput_tokens_per_s",),
    "kv_utilisation_mean": ("kv_utilisation", "mean"),
    "end_time": ("end_time",),
    "max_diff": ("fairness", "max_diff"),
    "avg_diff": ("fairness", "avg_diff"),
    "jain_index": ("fairness", "jain_index"),
    "fluid_token_rate": ("qoe", "fluid_token_rate"),
    "throttled_requests": ("throttled_requests",),
    "throttled_interactions": ("throttled_interactions",),
    "wasted_tokens": ("wasted_tokens",),
    **{
        f"{s}_requests": ("status_counts", s)
        for s in ("completed", "rejected", "refused", "failed")
    },
    "in_flight_requests": ("status_counts", "in_flight"),
}
LATENCY = ("ttft", "tpot", "e2e", "tbt")
STATS = ("mean", "p50", "p90", "p99")
PLOTTED = ("throughput_tokens_per_s", "jain_index", "ttft_mean", "fluidity_mean")
TITLES = {  # each plotted column's title, with its unit
    "throughput_tokens_per_s": "throughput (tokens/s)",
    "jain_index": "Jain index of service (1 = equal)",
    "ttft_mean": "mean time to first token (s)",
    "fluidity_mean": "mean fluidity-index (0-1)",
}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.", ":")


def _scalar(text: str) -> Any:
    """An override's value as YAML reads it (numbers become numbers, lists stay text)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (int, float, str, bool)) or value is None else text


def job_config(folder: Path) -> dict[str, Any]:
    """The config groups chosen, every override, and the seed of one job."""
    hydra_dir = folder / ".hydra"
    out: dict[str, Any] = {}
    if not all((hydra_dir / f).exists() for f in ("hydra.yaml", "overrides.yaml", "config.yaml")):
        return out  # a folder Hydra did not finish setting up
    hydra_cfg = yaml.safe_load((hydra_dir / "hydra.yaml").read_text())
    choices = hydra_cfg["hydra"]["runtime"]["choices"]
    for group in GROUPS:
        out[group] = choices.get(group)
    for item in yaml.safe_load((hydra_dir / "overrides.yaml").read_text()) or []:
        key, _, value = str(item).partition("=")
        out[key.lstrip("+~")] = _scalar(value)
    config = yaml.safe_load((hydra_dir / "config.yaml").read_text())
    out["seed"] = config.get("seed")
    return out


def _get(d: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def _client_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    service = _get(summary, ("fairness", "service_per_client")) or {}
    fluid = _get(summary, ("qoe", "fluidity_per_client")) or {}
    for client, lat in summary.get("latency", {}).items():
        row: dict[str, Any] = {
            "client": client,
            "requests": lat.get("requests"),
            "completed": lat.get("completed"),
            "output_tokens": lat.get("output_tokens"),
        }
        for metric in LATENCY:
            for stat in STATS:
                row[f"{metric}_{stat}"] = _get(lat, (metric, stat))
        row["service"] = sum(service.values()) if client == "all" else service.get(client)
        f = _get(summary, ("qoe", "fluidity")) if client == "all" else fluid.get(client)
        for stat in ("mean", "p10", "p50"):
            row[f"fluidity_{stat}"] = _get(f, (stat,))
        rows.append(row)
    return rows


def aggregate(sweep_dir: str | Path) -> pd.DataFrame:
    """The tidy table of a sweep (see the module docstring)."""
    sweep_dir = Path(sweep_dir)
    folders = job_folders(sweep_dir)
    if not folders:
        raise ConfigError(f"{sweep_dir}: no job folders (folders with .hydra/) under it")
    rows = []
    for folder in folders:
        job = read_status(folder) or {}
        summary_path = folder / "summary.json"
        status = job.get("status", "unfinished")  # never a summary.json without the mark
        head = {"job": str(folder.relative_to(sweep_dir)), "status": status}
        head["error"] = job.get("error")
        head.update(job_config(folder))
        if status != "completed" or not summary_path.exists():
            rows.append(head)
            continue
        summary = json.loads(summary_path.read_text())
        head.update({k: _get(summary, path) for k, path in RUN_METRICS.items()})
        rows.extend({**head, **client} for client in _client_rows(summary))
    return pd.DataFrame(rows)


def write_aggregate(sweep_dir: str | Path, table: pd.DataFrame) -> tuple[Path, Path]:
    sweep_dir = Path(sweep_dir)
    parquet, csv = sweep_dir / "sweep.parquet", sweep_dir / "sweep.csv"
    # mixed-type override columns (e.g. numbers and text) are stored as text in Parquet
    stored = table.copy()
    for col in stored.columns:
        if pd.api.types.is_object_dtype(stored[col]):
            stored[col] = stored[col].map(lambda v: None if v is None else str(v))
    stored.to_parquet(parquet, index=False)
    table.to_csv(csv, index=False)
    return parquet, csv


def load_column(table: pd.DataFrame) -> str | None:
    """The column to put on the x axis: workload.rate_scale if swept, else the first numeric
    override that varies (not the seed) among completed jobs."""
    # overrides of config values have dotted keys; metric and group columns do not
    candidates = [c for c in table.columns if "." in c]
    if "workload.rate_scale" in candidates:
        candidates.insert(0, "workload.rate_scale")
    done = table[table.status == "completed"]
    for col in candidates:
        values = pd.to_numeric(done[col], errors="coerce")
        if values.notna().all() and values.nunique() > 1:
            return col
    return None


def seed_intervals(table: pd.DataFrame, metrics: Sequence[str] = PLOTTED) -> pd.DataFrame:
    """Per setting (a job's overrides without its seed), client "all": each metric's mean over
    the seeds and the 95% bootstrap interval of that mean (scipy's `bootstrap`, BCa, 2,000
    resamples, a fixed random state so the file is reproducible). With one seed the interval is
    NaN; with identical values it is that value."""
    done = table[(table.status == "completed") & (table.client == "all")]
    rows = []
    for setting, part in done.groupby(done.job.str.rsplit("/seed=", n=1).str[0], sort=True):
        head = {"setting": setting, "policy": part.policy.iloc[0], "seeds": len(part)}
        for metric in metrics:
            values = pd.to_numeric(part[metric], errors="coerce").dropna().to_numpy(dtype=float)
            low, high = _bootstrap_mean(values)
            mean = float(values.mean()) if values.size else float("nan")
            rows.append({**head, "metric": metric, "mean": mean, "ci_low": low, "ci_high": high})
    return pd.DataFrame(rows)


def _bootstrap_mean(values: np.ndarray) -> tuple[float, float]:
    if values.size < 2:
        return float("nan"), float("nan")
    if np.ptp(values) == 0:  # no spread: the bootstrap has nothing to resample
        return float(values[0]), float(values[0])
    from scipy import stats  # 0.5 s to import: only when aggregating

    res = stats.bootstrap((values,), np.mean, n_resamples=2000, random_state=0, method="BCa")
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def plot_metrics(table: pd.DataFrame, x: str, out: Path, metrics: Sequence[str] = PLOTTED) -> Path:
    """Each metric (client "all") against `x`, one line per policy: the mean over seeds and its
    95% bootstrap interval as a band."""
    bands = seed_intervals(table, metrics)
    done = table[(table.status == "completed") & (table.client == "all")]
    settings = done.job.str.rsplit("/seed=", n=1).str[0]
    bands["x"] = bands.setting.map(dict(zip(settings, pd.to_numeric(done[x]), strict=True)))
    fig = Figure(figsize=(4.2 * len(metrics), 3.4))
    axes = fig.subplots(1, len(metrics), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        groups = bands[bands.metric == metric].groupby("policy", sort=True)
        for k, (policy, part) in enumerate(groups):
            part = part.sort_values("x")
            # a marker and a dash pattern each, drawn a little transparent: a line that lies
            # on another (two policies alike) still shows
            style = {"marker": MARKERS[k % len(MARKERS)], "linestyle": LINESTYLES[k % 4]}
            (line,) = ax.plot(part.x, part["mean"], label=str(policy), alpha=0.85, **style)
            ax.fill_between(part.x, part.ci_low, part.ci_high, color=line.get_color(), alpha=0.15)
        ax.set_xlabel(x)
        ax.set_title(TITLES.get(metric, metric), fontsize=10)
        ax.grid(alpha=0.3)
    axes[0][0].legend(title="policy (mean, 95% CI over seeds)", fontsize=8)
    fig.tight_layout()
    save_png(fig, out)
    return out


def _representatives(table: pd.DataFrame, x: str | None) -> pd.DataFrame:
    """One completed job per policy: the highest load, the lowest seed."""
    done = table[(table.status == "completed") & (table.client == "all")].copy()
    if x is not None:
        done[x] = pd.to_numeric(done[x])
        done = done[done[x] == done[x].max()]
    return done.sort_values(["policy", "seed", "job"]).groupby("policy", sort=True).head(1)


def plot_service(sweep_dir: Path, table: pd.DataFrame, x: str | None, out: Path) -> Path:
    """Per-client service rate (w_p = 1, w_q = 2; 60 s windows, shorter for short runs) over
    time, one panel per policy."""
    jobs = _representatives(table, x)
    fig = Figure(figsize=(4.5 * len(jobs), 3.6))
    axes = fig.subplots(1, len(jobs), squeeze=False, sharey=True)
    for ax, (_, job) in zip(axes[0], jobs.iterrows()):
        folder = sweep_dir / job["job"]
        requests = pd.read_parquet(folder / "requests.parquet")
        tokens = pd.read_parquet(folder / "tokens.parquet")
        end = float(np.nanmax(requests["finished_at"])) if len(requests) else 0.0
        ticks = np.linspace(0.0, end, 60) if end > 0 else np.zeros(1)
        window = min(60.0, max(end / 10, 1.0))  # the paper's 60 s, narrower for short runs
        rates = fairness.service_rates(fairness.served_intervals(requests, tokens), ticks, window)
        groups = client_groups(list(rates.columns), rates.sum().to_dict())
        colours = client_colours(list(groups))
        for label, clients in groups.items():
            ax.plot(rates.index, rates[clients].sum(axis=1), label=label, color=colours[label])
        ax.set_title(f"policy={job['policy']}\n{job['job']}", fontsize=8)
        ax.set_xlabel(f"simulated time (s); {window:.3g} s windows")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("service rate (weighted tokens/s)")
    axes[0][0].legend(fontsize=7, title="client", title_fontsize=7)
    fig.tight_layout()
    save_png(fig, out)
    return out


def request_fluidity(folder: Path) -> pd.Series | None:
    """Per-request fluidity-index of one run: from its Veeksha files if written, else from its
    tokens with the run's own constant deadlines (None when D_p came from a prefill curve)."""
    path = folder / "metrics" / REQUEST_ROWS_FILE
    if path.exists():
        return pd.read_json(path, lines=True)["fluidity_index"].dropna()
    deadlines = _get(json.loads((folder / "summary.json").read_text()), ("qoe", "deadlines"))
    if not deadlines or not isinstance(deadlines.get("ttft"), (int, float)):
        return None
    requests = pd.read_parquet(folder / "requests.parquet")
    done = requests[requests.status == "completed"]
    tokens = pd.read_parquet(folder / "tokens.parquet")
    flu = latency.request_fluidity(
        done,
        latency.tokens_of(tokens, done.request_id),
        ttft_deadline=float(deadlines["ttft"]),
        tbt_deadline=float(deadlines["tbt"]),
        exact=str(deadlines.get("arithmetic", "")).startswith("exact"),
    )
    return flu["fluidity"]


def plot_fluidity(sweep_dir: Path, table: pd.DataFrame, x: str | None, out: Path) -> Path | None:
    """CDF of the per-request fluidity-index, one line per policy."""
    fig = Figure(figsize=(5, 3.6))
    ax = fig.subplots()
    drawn = 0
    for k, (_, job) in enumerate(_representatives(table, x).iterrows()):
        values = request_fluidity(sweep_dir / job["job"])
        if values is None or values.empty:
            continue
        values = values.sort_values()
        share = np.arange(1, len(values) + 1) / len(values)
        ax.step(values, share, label=str(job["policy"]), linestyle=LINESTYLES[k % 4], alpha=0.85)
        drawn += 1
    if not drawn:
        return None
    ax.set_xlabel("fluidity-index (share of tokens on time)")
    ax.set_ylabel("share of requests at or below")
    ax.set_title("fluidity-index per policy" + (f", at the highest {x}" if x else ""), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(title="policy", fontsize=8)
    fig.tight_layout()
    save_png(fig, out)
    return out


def main(argv: list[str] | None = None) -> None:
    run_command("fairsim-aggregate", lambda: _main(argv))


def _main(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--x", help="the load column (default: workload.rate_scale if swept)")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    table = aggregate(args.sweep_dir)
    parquet, csv = write_aggregate(args.sweep_dir, table)
    counts = table.drop_duplicates("job")["status"].value_counts().to_dict()
    print(f"{len(table)} rows from {sum(counts.values())} jobs {counts}: {parquet}, {csv}")
    if (table.status == "completed").any():
        intervals = args.sweep_dir / "sweep_intervals.csv"
        seed_intervals(table).to_csv(intervals, index=False)
        print(f"means over seeds with 95% bootstrap intervals: {intervals}")
    if args.no_plots or not (table.status == "completed").any():
        return
    x = args.x or load_column(table)
    if x is not None and x not in table.columns:
        raise ConfigError(f"--x {x!r} is not a column of the sweep; columns: {list(table)}")
    plots = {
        "sweep_metrics.png": (
            plot_metrics(table, x, args.sweep_dir / "sweep_metrics.png") if x else None,
            "no load column swept (give --x)",
        ),
        "sweep_service.png": (
            plot_service(args.sweep_dir, table, x, args.sweep_dir / "sweep_service.png"),
            "no job served a request",
        ),
        "sweep_fluidity.png": (
            plot_fluidity(args.sweep_dir, table, x, args.sweep_dir / "sweep_fluidity.png"),
            "no job completed a request with constant deadlines",
        ),
    }
    for name, (path, why_not) in plots.items():
        print(f"plot: {path}" if path is not None else f"no {name}: {why_not}")
