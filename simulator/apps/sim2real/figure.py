"""The sim-to-real report's figure: the signed error of each validation run, fairsim's fitted
and roofline models beside BLIS trained-physics' published errors on the same runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from simulator.apps.sim2real.runs import MeasuredRun
from simulator.report.pictures import save_png

FIGURE_FILE = "sim2real_errors.png"  # written beside the report that shows it
PANELS = (("e2e_mean", "mean E2E"), ("ttft_mean", "mean TTFT"), ("itl", "ITL"))


def short_name(run: str) -> str:
    """'llama-2-70b-hf-tp4-codegen' -> 'llama-2-70b codegen': the model and the profile."""
    parts = run.replace("-hf-", "-").split("-")
    model = "-".join(p for p in parts[:-1] if not p.startswith("tp"))
    return f"{model.removesuffix('-v0-1')} {parts[-1]}"


def draw_errors(
    runs: list[MeasuredRun],
    errors: dict[str, dict[str, dict[str, float]]],
    peer: dict[str, dict[str, float]],
    peer_name: str,
    path: Path,
) -> None:
    """One panel per headline metric; per validation run the signed error (%) of each cost
    model in `errors` and of `peer` (published) where it has the run; the median absolute error
    of each over those runs in the legend."""
    from matplotlib.figure import Figure

    shown = [r.name for r in runs if not r.training and r.name in peer]
    series = {f"fairsim {cost}": errors[cost] for cost in errors} | {
        f"{peer_name} (published)": peer
    }
    fig = Figure(figsize=(13, 5.2))
    axes = fig.subplots(1, len(PANELS), sharey=False)
    x = np.arange(len(shown))
    width = 0.8 / len(series)
    for ax, (metric, label) in zip(axes, PANELS, strict=True):
        for k, (name, table) in enumerate(series.items()):
            values = np.array([table[run][metric] for run in shown])
            median = float(np.median(np.abs(values)))
            ax.bar(
                x + (k - (len(series) - 1) / 2) * width,
                values,
                width,
                label=f"{name}: median |error| {median:.1f}%",
                color=f"C{k}",
            )
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_title(f"{label}: signed error (%)", fontsize=10)
        ax.set_xticks(x, [short_name(r) for r in shown], fontsize=7, rotation=30, ha="right")
        ax.set_ylabel("(simulated - measured) / measured, %")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.33))
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(
        f"vLLM on H100, the {len(shown)} validation runs (no coefficient fitted to them)",
        fontsize=11,
    )
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.38, top=0.88, wspace=0.3)
    save_png(fig, path)
