"""What a trace file holds, as JSON (behind `fairsim-trace-stats PATH [--format] [--plot FILE]`).

The format is detected from the file (JSONL: mooncake; CSV header: azure, vidur, vtc_real, the
agentic coding sessions, or Etalon's length-only `lengths`; a folder or .tar.gz: a ServeGen pool,
summarised as the requests it generates at `--rate` over `--duration`) or named with --format. A
bad file exits with status 2 and one line naming the file, row and field.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from traces.files import resolve_path
from traces.loaders import LOADERS, load, load_lengths
from traces.schema import Trace
from traces.servegen import ServeGenPool

FORMATS = (*LOADERS, "lengths", "servegen")
HEADERS = {
    "TIMESTAMP": "azure",
    "arrived_at": "vidur",
    "arrival_s": "vtc_real",
    "t_abs_s": "agentic",
    "num_prefill_tokens": "lengths",
}
PERCENTILES = (50, 90, 99)


def detect_format(path: str | Path) -> str:
    p = Path(path)
    if p.is_dir() or p.name.endswith((".tar.gz", ".tgz", ".tar")):
        return "servegen"
    suffix = (p.with_suffix("") if p.suffix.lower() == ".gz" else p).suffix.lower()
    if suffix == ".jsonl":
        return "mooncake"
    if suffix in (".parquet", ".pq"):
        return "table"
    found = resolve_path(p)
    with (gzip.open if found.suffix.lower() == ".gz" else open)(found, "rb") as f:
        header = f.readline().decode("utf-8", errors="replace")
    columns = [c.strip() for c in header.split(",")]
    for column, fmt in HEADERS.items():
        if column in columns:
            return fmt
    return "table"


def length_stats(values: np.ndarray) -> dict[str, float]:
    out = {f"p{q}": float(np.percentile(values, q)) for q in PERCENTILES}
    return {**out, "mean": float(values.mean()), "max": int(values.max())}


def trace_stats(trace: Trace) -> dict[str, Any]:
    """Rows, duration, rate, inter-arrival CV, client shares, length percentiles."""
    gaps = np.diff(trace.arrival)
    counts = np.bincount(trace.client, minlength=trace.num_clients)
    duration = trace.duration
    return {
        "source": trace.source,
        "rows": len(trace),
        "duration_s": duration,
        "rate_per_s": (len(trace) - 1) / duration if duration > 0 else None,
        "interarrival_cv": float(gaps.std() / gaps.mean()) if gaps.size and gaps.mean() else None,
        "clients": {
            name: round(int(c) / len(trace), 6)
            for name, c in sorted(zip(trace.client_names, counts, strict=True), key=lambda x: -x[1])
        },
        "prompt_len": length_stats(trace.prompt_len),
        "output_len": length_stats(trace.output_len),
    }


def lengths_stats(prompt: np.ndarray, output: np.ndarray, source: str) -> dict[str, Any]:
    """The same keys for a length-only file (no times, no clients)."""
    return {
        "source": source,
        "rows": int(prompt.size),
        "duration_s": None,
        "rate_per_s": None,
        "interarrival_cv": None,
        "clients": {},
        "prompt_len": length_stats(prompt),
        "output_len": length_stats(output),
    }


def plot(trace: Trace | None, prompt: np.ndarray, output: np.ndarray, out: str | Path) -> None:
    fig = Figure(figsize=(12, 3.5))
    axes = fig.subplots(1, 3 if trace is not None else 2)
    axes = list(np.atleast_1d(axes))
    if trace is not None:
        ax = axes.pop(0)
        bins = max(1, int(np.ceil(trace.duration / 60)))
        counts, edges = np.histogram(trace.arrival, bins=bins)
        ax.step(edges[:-1], counts / np.diff(edges), where="post")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("arrival rate (req/s, 1-min bins)")
    for ax, values, label in zip(axes, (prompt, output), ("prompt", "output"), strict=True):
        ax.hist(values, bins=np.geomspace(1, max(2, values.max()) + 1, 50))
        ax.set_xscale("log")
        ax.set_xlabel(f"{label} tokens")
        ax.set_ylabel("requests")
    fig.tight_layout()
    fig.savefig(out, dpi=90)


def describe(
    path: str,
    fmt: str | None = None,
    plot_to: str | None = None,
    sort: bool = False,
    rate: float = 5.0,
    duration: float = 3600.0,
) -> dict[str, Any]:
    """What `fairsim-trace-stats` prints: the statistics of a trace file (a format detected from
    the file unless given), with a plot saved to `plot_to` when given."""
    fmt = fmt or detect_format(path)
    trace: Trace | None
    if fmt == "lengths":
        trace = None
        prompt, output = load_lengths(path)
        stats = lengths_stats(prompt, output, path)
    else:
        if fmt == "servegen":
            trace = ServeGenPool(path, rate, duration).build(0)
        else:
            trace = load(path, fmt, **({"sort": True} if sort else {}))
        stats = trace_stats(trace)
        prompt, output = trace.prompt_len, trace.output_len
    stats = {"format": fmt, **stats}
    if plot_to:
        plot(trace, prompt, output, plot_to)
        stats["plot"] = plot_to
    return stats
