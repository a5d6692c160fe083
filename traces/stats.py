"""`fairsim-trace-stats PATH [--format NAME] [--plot FILE]`: what a trace file holds, as JSON.

The format is detected from the file (JSONL: mooncake; CSV header: azure, vidur, vtc_real, or
Etalon's length-only `lengths`; a folder or .tar.gz: a ServeGen pool, summarised as the requests
it generates at `--rate` over `--duration`) or named with --format. A bad file exits with status
2 and one line naming the file, row and field.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from traces.files import resolve_path
from traces.loaders import LOADERS, load, load_lengths
from traces.schema import Trace, TraceError
from traces.servegen import ServeGenPool

FORMATS = (*LOADERS, "lengths", "servegen")
HEADERS = {
    "TIMESTAMP": "azure",
    "arrived_at": "vidur",
    "arrival_s": "vtc_real",
    "num_prefill_tokens": "lengths",
}
PERCENTILES = (50, 90, 99)


def detect_format(path: str | Path) -> str:
    p = Path(path)
    if p.is_dir() or p.name.endswith((".tar.gz", ".tgz", ".tar")):
        return "servegen"
    if p.suffix.lower() == ".jsonl":
        return "mooncake"
    if p.suffix.lower() in (".parquet", ".pq"):
        return "table"
    with resolve_path(p).open("rb") as f:
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fairsim-trace-stats", description=__doc__.split("\n")[0])
    ap.add_argument("path")
    ap.add_argument("--format", choices=FORMATS, help="default: detected from the file")
    ap.add_argument("--plot", metavar="PNG", help="save arrival rate and length histograms")
    ap.add_argument("--sort", action="store_true", help="sort unsorted timestamps")
    ap.add_argument("--rate", type=float, default=5.0, help="servegen: target requests/s")
    ap.add_argument("--duration", type=float, default=3600.0, help="servegen: seconds")
    args = ap.parse_args(argv)
    try:
        fmt = args.format or detect_format(args.path)
        trace: Trace | None
        if fmt == "lengths":
            trace = None
            prompt, output = load_lengths(args.path)
            stats = lengths_stats(prompt, output, args.path)
        else:
            if fmt == "servegen":
                trace = ServeGenPool(args.path, args.rate, args.duration).build(0)
            else:
                options = {"sort": True} if args.sort else {}
                trace = load(args.path, fmt, **options)
            stats = trace_stats(trace)
            prompt, output = trace.prompt_len, trace.output_len
        stats = {"format": fmt, **stats}
        if args.plot:
            plot(trace, prompt, output, args.plot)
            stats["plot"] = args.plot
    except (TraceError, ValueError, OSError) as err:
        print(f"fairsim-trace-stats: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(stats))
    return 0


def cli() -> None:
    sys.exit(main())


if __name__ == "__main__":
    cli()
