"""The run folder's pictures of a run over time: `service_over_time.png` (each client's
cumulative and windowed service, the VTC paper's figure) and `kv_and_batch.png` (KV-pool use,
running batch and waiting queue).

What is drawn is computed here from the run's tables (`run_pictures`, small arrays on a time
grid) and drawn by `draw_run_pictures`, which a run's plotting child process can do while the
run writes its other files (simulator/report/background.py). Every figure's title names the run
(`run_title`); clients keep one colour across the run's figures (`client_colours`).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from simulator.metrics.fairness import cumulative_service, served_intervals
from simulator.report.console import natural_key

GRID_POINTS = 400  # time points of each curve: finer than a figure's pixels need
MAX_LINES = 8  # clients drawn one by one; past that the largest 7 and the rest together
SERVICE_WINDOW = 60.0  # seconds: the VTC paper's window for service rates
SERVICE_FILE = "service_over_time.png"
KV_FILE = "kv_and_batch.png"
FLEET_FILE = "replicas_over_time.png"  # an elastic fleet's runs only


def save_png(fig: Any, path: Path, dpi: int = 90) -> None:
    """The figure as a PNG of at most 256 colours: a third of matplotlib's file size for the same
    picture (service_over_time.png: 73 kB -> 26 kB), so report.html, which embeds every picture,
    keeps the default run's folder under 2 MB."""
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    buffer.seek(0)
    with Image.open(buffer) as image:
        image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT).save(path, "PNG")


def run_title(what_ran: dict[str, Any] | None) -> str:
    """'policy=vtc · workload=vtc_overload · engine=slora ...' from the summary's `what_ran`."""
    if not what_ran:
        return "fairsim run"
    return " · ".join(f"{k}={v}" for k, v in what_ran.items() if v is not None)


def client_groups(names: list[str], sizes: dict[str, float]) -> dict[str, list[str]]:
    """Label -> clients drawn as one line: each client while there are at most MAX_LINES, else
    the MAX_LINES - 1 largest by `sizes` and one line for the others together."""
    ordered = sorted(names, key=natural_key)
    if len(ordered) <= MAX_LINES:
        return {c: [c] for c in ordered}
    largest = sorted(ordered, key=lambda c: -sizes.get(c, 0.0))[: MAX_LINES - 1]
    keep = [c for c in ordered if c in set(largest)]
    rest = [c for c in ordered if c not in set(largest)]
    return {**{c: [c] for c in keep}, f"other {len(rest)} clients": rest}


def client_colours(labels: list[str]) -> dict[str, Any]:
    """One colour per line label, in order (tab10), grey for the grouped rest."""
    palette = [f"C{i}" for i in range(10)]  # matplotlib's default cycle (tab10)
    return {
        label: "0.45" if label.startswith("other ") else palette[i % len(palette)]
        for i, label in enumerate(labels)
    }


@dataclass(frozen=True)
class RunPictures:
    """What the two figures draw, on one time grid."""

    title: str
    times: np.ndarray
    cumulative: pd.DataFrame  # service received since 0, a column per line label
    rates: pd.DataFrame  # service per second over a window centred on each time
    window: float  # the rates' window, seconds
    last_arrival: float
    kv_share: np.ndarray  # share of the KV pool in use (all replicas together)
    running: np.ndarray  # requests in the running batch (all replicas)
    waiting: np.ndarray  # requests arrived and not yet admitted
    pool_tokens: int
    replicas: int
    fleet: np.ndarray | None = None  # an elastic fleet: [time, ready, loading, draining] rows


def run_pictures(
    requests: pd.DataFrame,
    steps: pd.DataFrame | Path,
    summary: dict[str, Any],
    title: str,
    tokens: pd.DataFrame | None = None,
) -> RunPictures:
    """The curves of a run's tables (`summary`: its end time and pool size; `steps`: the table,
    or a steps.parquet read a row group at a time). Without `tokens` (a run too large to hold
    them) a request still running at the end counts until the end of the run."""
    end = float(summary.get("end_time") or 0.0)
    for part in _step_parts(steps, ["end"]):
        if len(part):
            end = max(end, float(part["end"].max()))
    times = np.linspace(0.0, max(end, 1e-9), GRID_POINTS)
    intervals = served_intervals(requests, tokens)
    if tokens is None:  # in flight at the end: spread what it got so far up to the end
        intervals["end"] = intervals["end"].fillna(end)
    window = min(SERVICE_WINDOW, max(end, 1e-9) / 10)
    per_client = cumulative_service(intervals, times)
    groups = client_groups(list(per_client.columns), per_client.iloc[-1].to_dict())
    cumulative = pd.DataFrame({label: per_client[cs].sum(axis=1) for label, cs in groups.items()})
    around = cumulative_service(intervals, np.concatenate((times - window / 2, times + window / 2)))
    lo, hi = around.iloc[: times.shape[0]], around.iloc[times.shape[0] :]
    rates = pd.DataFrame(
        {
            label: (hi[cs].sum(axis=1).to_numpy() - lo[cs].sum(axis=1).to_numpy()) / window
            for label, cs in groups.items()
        },
        index=times,
    )
    pool = int(summary.get("pool_tokens") or 0)
    kv, running, replicas = _engine_state(steps, times)
    return RunPictures(
        title=title,
        times=times,
        cumulative=cumulative,
        rates=rates,
        window=window,
        last_arrival=float(requests["arrival"].max()) if len(requests) else 0.0,
        kv_share=kv / (pool * replicas) if pool > 0 else np.full(times.shape, np.nan),
        running=running,
        waiting=_waiting(requests, times),
        pool_tokens=pool,
        replicas=replicas,
        fleet=(
            np.array(summary["autoscaler"]["replicas_over_time"], dtype=float)
            if "autoscaler" in summary
            else None
        ),
    )


def _step_parts(steps: pd.DataFrame | Path, columns: list[str]) -> Iterator[pd.DataFrame]:
    """The steps table whole, or a steps.parquet file a row group at a time with only
    `columns` (and `replica` where it has one): the steps of a spilled run do not fit in
    memory (a day of 64 replicas records about 200M)."""
    if isinstance(steps, pd.DataFrame):
        yield steps
        return
    parts = pq.ParquetFile(steps)
    names = [c for c in ("replica", *columns) if c in parts.schema_arrow.names]
    for i in range(parts.num_row_groups):
        yield parts.read_row_group(i, columns=names).to_pandas()


def _engine_state(
    steps: pd.DataFrame | Path, times: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int]:
    """KV tokens in use and requests in the batch at each time, summed over replicas: each
    replica's values are those of its step running at that time (or the last one before; 0
    before its first). Read part by part, a later step wins a tie of starts, as in one table
    sorted stably by start."""
    latest: dict[int, np.ndarray] = {}  # per replica: the start of the step shown at each time
    kv_of: dict[int, np.ndarray] = {}
    running_of: dict[int, np.ndarray] = {}
    for part in _step_parts(steps, ["start", "kv_used", "batch_size"]):
        groups = part.groupby("replica", sort=True) if "replica" in part else [(0, part)]
        for replica, own in groups:
            own = own.sort_values("start", kind="stable")
            start = own["start"].to_numpy()
            at = np.searchsorted(start, times, side="right") - 1
            if replica not in latest:
                latest[replica] = np.full(times.shape[0], -np.inf)
                kv_of[replica], running_of[replica] = (
                    np.zeros(times.shape[0]),
                    np.zeros(times.shape[0]),
                )
            later = at >= 0
            later[later] = start[at[later]] >= latest[replica][later]
            latest[replica][later] = start[at[later]]
            kv_of[replica][later] = own["kv_used"].to_numpy()[at[later]]
            running_of[replica][later] = own["batch_size"].to_numpy()[at[later]]
    kv, running = np.zeros(times.shape[0]), np.zeros(times.shape[0])
    for replica in sorted(latest):
        kv += kv_of[replica]
        running += running_of[replica]
    return kv, running, max(len(latest), 1)


def _waiting(requests: pd.DataFrame, times: np.ndarray) -> np.ndarray:
    """Requests arrived by each time and not yet admitted (first admission); those the engine
    refused or a policy rejected never wait."""
    turned_away = requests["status"].isin(["rejected", "refused"]).to_numpy()
    arrival = np.sort(requests["arrival"].to_numpy()[~turned_away])
    admitted = requests["admitted_at"].to_numpy(dtype=float)[~turned_away]
    admitted = np.sort(admitted[~np.isnan(admitted)])
    arrived_by = np.searchsorted(arrival, times, side="right")
    return arrived_by - np.searchsorted(admitted, times, side="right")


# the run pictures' margins (fractions of the figure: room for the run's title, a panel title,
# two-line axis labels and tick labels), fixed rather than measured: tight_layout measured every
# label again, a quarter of the pictures' drawing time
STACKED_MARGINS = {"left": 0.11, "right": 0.98, "top": 0.88, "bottom": 0.08, "hspace": 0.15}


def draw_run_pictures(folder: Path, pictures: RunPictures) -> None:
    """service_over_time.png and kv_and_batch.png in `folder` (and replicas_over_time.png for
    an elastic fleet)."""
    _draw_service(folder / SERVICE_FILE, pictures)
    _draw_engine(folder / KV_FILE, pictures)
    if pictures.fleet is not None:
        _draw_fleet(folder / FLEET_FILE, pictures)


def _draw_fleet(path: Path, p: RunPictures) -> None:
    from matplotlib.figure import Figure

    assert p.fleet is not None
    end = float(p.times[-1])
    rows = np.vstack([p.fleet, [end, *p.fleet[-1, 1:]]]) if len(p.fleet) else p.fleet
    fig = Figure(figsize=(8, 5))
    fleet_ax, queue_ax = fig.subplots(2, 1, sharex=True)
    held = rows[:, 1] + rows[:, 2] + rows[:, 3]
    fleet_ax.plot(rows[:, 0], held, color="tab:orange", drawstyle="steps-post",
                  label="holding a GPU (loading, ready or draining)")  # fmt: skip
    fleet_ax.plot(rows[:, 0], rows[:, 1], color="tab:blue", drawstyle="steps-post", label="ready")
    fleet_ax.set_ylabel("replicas")
    fleet_ax.legend(fontsize=8, loc="upper left")
    queue_ax.plot(p.times, p.waiting, color="tab:red", drawstyle="steps-post")
    queue_ax.set_ylabel("waiting\n(requests)")
    queue_ax.set_xlabel("simulated time (s)")
    for ax in (fleet_ax, queue_ax):
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    fleet_ax.set_title("Replicas over time (autoscaler)", fontsize=11)
    fig.suptitle(p.title, fontsize=8, color="0.3")
    fig.subplots_adjust(**STACKED_MARGINS)
    save_png(fig, path)


def _draw_service(path: Path, p: RunPictures) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 6))
    top, bottom = fig.subplots(2, 1, sharex=True)
    colours = client_colours(list(p.cumulative.columns))
    for label in p.cumulative.columns:
        top.plot(p.times, p.cumulative[label], color=colours[label], label=label)
        bottom.plot(p.times, p.rates[label], color=colours[label], label=label)
    for ax in (top, bottom):
        ax.axvline(p.last_arrival, color="0.6", linestyle=":", linewidth=1)
        ax.grid(alpha=0.3)
    top.set_ylabel("cumulative service\n(weighted tokens)")
    bottom.set_ylabel(f"service rate, {p.window:g} s window\n(weighted tokens/s)")
    bottom.set_xlabel("simulated time (s); dotted line: last arrival")
    if len(p.cumulative.columns):
        top.legend(fontsize=8, loc="upper left")
    else:  # no token was served: say so rather than draw empty axes without a word
        top.text(0.5, 0.5, "no service", ha="center", va="center", transform=top.transAxes)
    top.set_title("Service received per client", fontsize=11)
    fig.suptitle(p.title, fontsize=8, color="0.3")
    fig.text(
        0.01, 0.005, "service: prompt tokens x w_p + output tokens x w_q (VTC's price)",
        fontsize=7, color="0.4",
    )  # fmt: skip
    fig.subplots_adjust(**{**STACKED_MARGINS, "bottom": 0.1})  # (room for the note)
    save_png(fig, path)


def _draw_engine(path: Path, p: RunPictures) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 6.5))
    kv_ax, batch_ax, queue_ax = fig.subplots(3, 1, sharex=True)
    kv_ax.plot(p.times, 100 * p.kv_share, color="tab:blue", drawstyle="steps-post")
    kv_ax.set_ylim(0, 105)
    pool = f"{p.pool_tokens:,} tokens" + (f" x {p.replicas} replicas" if p.replicas > 1 else "")
    kv_ax.set_ylabel(f"KV pool in use (%)\nof {pool}")
    batch_ax.plot(p.times, p.running, color="tab:green", drawstyle="steps-post")
    batch_ax.set_ylabel("running batch\n(requests)")
    queue_ax.plot(p.times, p.waiting, color="tab:red", drawstyle="steps-post")
    queue_ax.set_ylabel("waiting queue\n(requests)")
    queue_ax.set_xlabel("simulated time (s)")
    for ax in (kv_ax, batch_ax, queue_ax):
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    kv_ax.set_title("Engine state over time", fontsize=11)
    fig.suptitle(p.title, fontsize=8, color="0.3")
    fig.subplots_adjust(**STACKED_MARGINS)
    save_png(fig, path)
