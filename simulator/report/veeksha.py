"""Veeksha-compatible metric files in `<run folder>/metrics/` (docs/metrics.md §7).

So that tools written for Veeksha's performance evaluator read a fairsim run unchanged. In the
simulator a request is dispatched the moment it arrives, so `scheduler_ready_at` and
`scheduler_dispatched_at` are the arrival, `client_picked_up_at` is the admission (start of the
prefill step) and `session_id` is the client. Extra keys (fluidity, deadline misses) are added;
none of Veeksha's keys is renamed.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from simulator.metrics import fluidity, latency
from simulator.metrics.fluidity import Ragged
from simulator.metrics.pooled import WeightedValues
from simulator.metrics.prefill_curve import PrefillCurve
from simulator.metrics.qoe import QoEConfig, request_fluidity
from simulator.metrics.slo import SLO, evaluate_slos
from simulator.report.pictures import client_colours, client_groups, save_png
from simulator.report.run_folder import json_safe

DISTRIBUTION_METRICS = ("ttfc", "tbc", "tpot", "e2e", "normalized_e2e", "fluidity")
MISS_CURVE_FILE = "deadline_miss_rate_at_tbt_targets.csv"
# Veeksha's per-request rows, gzip-compressed: the default run's 1,620 rows with their decode
# gaps take 9.4 MB as plain JSON and 0.3 MB compressed (pandas.read_json(path, lines=True) and
# zcat read it as it is); each append adds a gzip member, which readers join
REQUEST_ROWS_FILE = "request_level_metrics.jsonl.gz"
# gzip level 4: at scale compressing is most of the time these rows take, and level 4 halves it
# for a file a few per cent larger (60 MB of a one-day fleet run's rows: 1.32 s at level 6, 0.64 s
# at 4, 10.6 and 10.9 MB; the default run's 9.4 MB: 0.25 and 0.29 MB; level 3 and below lose the
# long matches and give 0.80 MB; python benchmarks/write_formats.py --rows-file on each run's)
ROWS_COMPRESSION = 4
PERCENTILES = (50, 90, 95, 99)  # of each distribution's statistics
RATE_TOLERANCE = 0.15  # Veeksha's health check: observed arrival rate within 15% of configured
LENGTH_TOLERANCE = 15  # tokens


def _dump(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(json_safe(obj), indent=2) + "\n")


def _distribution_row(v: np.ndarray) -> dict[str, float]:
    """The statistics of values without NaN (`latency.without_nan`)."""
    if v.size == 0:
        return {k: float("nan") for k in ("p50", "p90", "p95", "p99", "min", "max", "mean")}
    # one call selects the four ranks together (the same values as four calls, a third of the
    # time on the Azure run's 4M gaps)
    row = {f"p{p}": float(x) for p, x in zip(PERCENTILES, np.percentile(v, PERCENTILES))}
    return {**row, "min": float(v.min()), "max": float(v.max()), "mean": float(v.mean())}


def request_level_columns(
    requests: pd.DataFrame,
    tokens: pd.DataFrame,
    cfg: QoEConfig,
    curve: PrefillCurve | None,
    fluidity_table: pd.DataFrame | None = None,
) -> dict[str, np.ndarray]:
    """Veeksha's per-request fields of every completed request, in arrival order, as columns
    (`write_request_level_metrics` adds each one's decode gaps). `fluidity_table`:
    `request_fluidity` of these tables, when the caller has it already."""
    done = requests[requests.status == "completed"]
    done_tokens = latency.tokens_of(tokens, done.request_id)
    ids = done.request_id.to_numpy()
    lat = latency.per_request_latency(done, done_tokens, "veeksha").reindex(ids)
    if fluidity_table is None:
        fluidity_table = request_fluidity(done, done_tokens, cfg, curve)
    flu = fluidity_table.reindex(ids)
    prompt = done.prompt_len.to_numpy()
    emitted = done.tokens_emitted.to_numpy()
    columns = {
        "request_id": ids,
        "session_id": done.client.astype(str).to_numpy(),
        "scheduler_ready_at": done.arrival.to_numpy(),
        "scheduler_dispatched_at": done.arrival.to_numpy(),
        "client_picked_up_at": done.admitted_at.to_numpy(),
        "client_completed_at": done.finished_at.to_numpy(),
        "num_delta_prompt_tokens": prompt,
        "num_total_prompt_tokens": prompt,
        "num_output_tokens": emitted,
        "num_requested_output_tokens": done.output_len.to_numpy(),
        "num_total_tokens": prompt + emitted,
        "is_stream": np.ones(ids.shape[0], dtype=bool),
        "tpot": lat.tpot.to_numpy(),
        "ttfc": lat.ttft.to_numpy(),
        "end_to_end_latency": lat.e2e.to_numpy(),
        "normalized_end_to_end_latency": lat.normalized_e2e.to_numpy(),
        "output_throughput": lat.output_throughput.to_numpy(),
        "fluidity_index": flu.fluidity.to_numpy(),
        "missed_deadlines": flu.missed.to_numpy(),
        "total_deadlines": flu.total.to_numpy(),
    }
    return columns


def write_request_level_metrics(
    path: Path, columns: dict[str, np.ndarray], decode_gaps: Ragged, append: bool = False
) -> None:
    """One JSON object per request of `request_level_columns` (NaN written as null), its decode
    gaps under `tbc`, gzip-compressed: `decode_gaps` holds those of the same requests by
    increasing request_id, as `inter_token_gaps` gives them (`append`: after the requests
    already in the file)."""
    ids = columns["request_id"]
    if decode_gaps.lengths.shape[0] != ids.shape[0]:
        raise ValueError(
            f"{ids.shape[0]} request rows but decode gaps of {decode_gaps.lengths.shape[0]}"
        )
    by_id = np.split(decode_gaps.values, np.cumsum(decode_gaps.lengths)[:-1])
    tbc = [by_id[i] for i in np.searchsorted(np.sort(ids), ids).tolist()]
    names = list(columns)
    rows = zip(*(columns[name].tolist() for name in names), tbc, strict=True)
    option = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE
    with (
        path.open("ab" if append else "wb") as raw,
        # no name and time 0 in the header: the same run gives the same bytes
        gzip.GzipFile("", "wb", ROWS_COMPRESSION, raw, mtime=0) as f,
    ):
        for values in rows:
            row = dict(zip(names, values[:-1], strict=True))
            row["tbc"] = values[-1]
            f.write(orjson.dumps(row, option=option))


def prefill_stats(prompt_len: np.ndarray, ttfc: np.ndarray) -> dict[str, Any]:
    """TTFC grouped by prompt length (Veeksha's prefill_stats.json): numpy's mean, median, std,
    min, max and linear percentiles of each group."""
    order = np.argsort(prompt_len, kind="stable")
    p, t = prompt_len[order], ttfc[order]
    starts = np.flatnonzero(np.concatenate(([True], p[1:] != p[:-1]))) if p.size else p
    ends = [*starts[1:].tolist(), p.shape[0]] if p.size else []
    groups = {}
    for lo, hi in zip(starts.tolist(), ends, strict=True):
        g = t[lo:hi]
        # 41% of the Azure run's 2,339 lengths occur once: skipping numpy there and sharing one
        # percentile call takes the whole from 0.23 s to 0.09 s
        if g.size == 1:  # every statistic is the value (std 0, or NaN if not finite)
            x = float(g[0])
            mean = median = low = high = p90 = p99 = x
            std = 0.0 if np.isfinite(x) else float("nan")
        else:
            mean, std, median = float(g.mean()), float(g.std()), float(np.median(g))
            low, high = float(g.min()), float(g.max())
            p90, p99 = (float(v) for v in np.percentile(g, [90, 99]))  # as one call per p
        groups[str(p[lo])] = {
            "count": int(g.size),
            "mean": mean,
            "median": median,
            "std": std,
            "min": low,
            "max": high,
            "p90": p90,
            "p99": p99,
        }
    return {"metric": "ttfc", "group_by": "target_num_delta_prompt_tokens", "groups": groups}


def observed_rate(requests: pd.DataFrame) -> float:
    """Arrivals per second between the first and the last arrival (NaN with < 2 arrivals)."""
    span = float(requests.arrival.max() - requests.arrival.min()) if len(requests) > 1 else 0.0
    return (len(requests) - 1) / span if span > 0 else float("nan")


def health_checks(
    requests: pd.DataFrame, prefilled: int, configured_rate: float | None
) -> list[dict[str, Any]]:
    """Arrival rate against the configured rate; emitted lengths, and the prompt tokens the
    prefill steps processed (`prefilled`), against the requested ones."""
    checks: list[dict[str, Any]] = []
    observed = observed_rate(requests)
    if configured_rate is None:
        checks.append(
            {
                "check": "session_dispatch_rate",
                "passed": None,
                "detail": f"observed {observed:.3f} req/s; no configured rate to compare with",
            }
        )
    else:
        off = abs(observed - configured_rate) / configured_rate
        checks.append(
            {
                "check": "session_dispatch_rate",
                "passed": bool(off <= RATE_TOLERANCE),
                "detail": f"observed {observed:.3f} req/s vs configured {configured_rate:.3f} "
                f"({100 * off:.1f}% off; tolerance {100 * RATE_TOLERANCE:.0f}%)",
            }
        )
    done = requests[requests.status == "completed"]
    bad_out = int((np.abs(done.tokens_emitted - done.output_len) > LENGTH_TOLERANCE).sum())
    checks.append(
        {
            "check": "output_length",
            "passed": bad_out == 0,
            "detail": f"{bad_out} of {len(done)} completed requests off by more than "
            f"{LENGTH_TOLERANCE} tokens",
        }
    )
    admitted = requests[~requests.admitted_at.isna()]
    wanted = int(admitted.prompt_len.sum())
    checks.append(
        {
            "check": "prompt_length",
            "passed": prefilled == wanted,
            "detail": f"prefill steps processed {prefilled} prompt tokens for admitted requests "
            f"asking {wanted}",
        }
    )
    return checks


def write_miss_curve(out: Path, decode_gaps: Ragged, exact: bool) -> None:
    """The deadline-miss curve (`miss_rate_at_tbt_targets`): its file needs only the gaps, so
    a run has it written while it computes the rest (simulator/api/run.py)."""
    curve = fluidity.miss_rate_at_tbt_targets(decode_gaps, exact=exact)
    curve.to_csv(out / MISS_CURVE_FILE, index=False)


def write_rows_and_distributions(
    out: Path,
    columns: dict[str, np.ndarray],
    decode_gaps: Ragged,
    values: Mapping[str, np.ndarray],
    clients: Mapping[str, np.ndarray] | None = None,
    title: str = "",
) -> None:
    """request_level_metrics.jsonl.gz (the rows of `request_level_columns`, each with its decode
    gaps) and the distributions (`write_distributions`)."""
    write_request_level_metrics(out / REQUEST_ROWS_FILE, columns, decode_gaps)
    write_distributions(out, values, clients, title)


def prefilled_tokens(steps: pd.DataFrame) -> int:
    """Prompt tokens the prefill steps processed (Veeksha's health check)."""
    return int(steps.num_tokens[steps.kind == "prefill"].sum())


def write_veeksha_summaries(
    out: Path,
    requests: pd.DataFrame,
    completed: int,
    values: Mapping[str, np.ndarray | WeightedValues],
    fluid_token_rate: float,
    prompt: np.ndarray,
    ttfc: np.ndarray,
    prefilled: int,
    slos: list[SLO] | None,
    configured_rate: float | None,
) -> dict[str, Any]:
    """The files other than the rows, the distributions and the miss curve, from what those
    were made of: `completed` requests, `request_values`, the fluid token rate, each completed
    request's prompt length and TTFC, and the prompt tokens the prefill steps processed.
    Returns slo_results."""
    errored = int(requests.status.isin(["rejected", "refused", "failed"]).sum())
    _dump(
        out / "summary_stats.json",
        {
            "Number of Requests": len(requests),
            "Number of Completed Requests": completed,
            "Number of Errored Requests": errored,
            "Error Rate": errored / len(requests) if len(requests) else 0.0,
            "Observed Session Dispatch Rate": observed_rate(requests),
        },
    )
    tpot, tbc = np.asarray(values["tpot"]), values["tbc"]
    _dump(
        out / "throughput_metrics.json",
        {
            "tpot_based_throughput": 1.0 / tpot.mean() if tpot.size and tpot.mean() > 0 else None,
            "tbc_based_throughput": 1.0 / _quantile(tbc, 0.99) if tbc.size else None,
            "fluid_token_generation_rate": fluid_token_rate,
        },
    )
    _dump(out / "prefill_stats.json", prefill_stats(prompt, ttfc))
    results = evaluate_slos(slos or [], values)
    _dump(out / "slo_results.json", results)
    checks = health_checks(requests, prefilled, configured_rate)
    _dump(out / "health_check_results.json", checks)
    (out / "health_check_results.txt").write_text(
        "".join(
            f"[{'PASS' if c['passed'] else 'SKIP' if c['passed'] is None else 'FAIL'}] "
            f"{c['check']}: {c['detail']}\n"
            for c in checks
        )
    )
    return results


def _quantile(values: np.ndarray | WeightedValues, q: float) -> float:
    if isinstance(values, WeightedValues):
        return values.quantile(q)
    return float(np.quantile(values, q))


# each distribution's axis label; metrics whose tails matter get a log axis (`_log_axis`)
UNITS = {
    "ttfc": "time to first token (s)",
    "tbc": "gap between output tokens (s)",
    "tpot": "time per output token (s/token)",
    "e2e": "end-to-end latency (s)",
    "normalized_e2e": "end-to-end latency per output token (s/token)",
    "fluidity": "fluidity-index (share of tokens on time, 0-1)",
}
# the shares at which each line is drawn (its quantiles): even steps, and steps ever closer to 1
# for the tail down to 1e-5 above (the curve of millions of values at a figure's size)
CDF_SHARES = np.union1d(np.linspace(0.0, 1.0, 401), 1.0 - np.logspace(-1, -5, 81))


def write_distributions(
    out: Path,
    values: Mapping[str, np.ndarray | WeightedValues],
    clients: Mapping[str, np.ndarray] | None = None,
    title: str = "",
) -> None:
    """Per distribution metric, its statistics (CSV) and its distribution (PNG): the share of
    requests (of gaps, for tbc) at or below each value, a line per client where `clients` gives
    each value's client (key "tbc" for the gaps, "request" for the rest), on a log axis where
    the values span decades (tails). `title` names the run."""
    for name in DISTRIBUTION_METRICS:
        v = values[name]
        lines: Mapping[str, np.ndarray | WeightedValues]
        if isinstance(v, WeightedValues):  # a run scored in blocks: the pooled values only
            row = _pooled_row(v)
            lines = {"all": v}
        else:
            # one array for the statistics and the lines, not a copy for each (the plots'
            # child peaks 32 MB lower on the Azure run's 4M decode gaps)
            present = latency.without_nan(v)
            row = _distribution_row(present)
            labels = (clients or {}).get("tbc" if name == "tbc" else "request")
            lines = _per_client(v, labels) if labels is not None else {"all": present}
        pd.DataFrame([row]).to_csv(out / f"{name}.csv", index=False)
        _draw_distribution(out / f"{name}.png", name, lines, title)


def _per_client(values: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
    """Each line's values without NaN: a client's, or the grouped rest's, then all."""
    if labels.shape[0] != values.shape[0]:
        raise ValueError(f"{labels.shape[0]} client labels for {values.shape[0]} values")
    # hashing, not sorting, the labels: np.unique sorted the 1.7M gap labels of a sim-to-real
    # run as Python strings, 1.0 s of the plots' 4.3 s (benchmarks/sim2real_speed.py)
    codes, names = pd.factorize(labels, sort=True)
    counts = np.bincount(codes, minlength=len(names))
    sizes = dict(zip(names.tolist(), counts.tolist(), strict=True))
    groups = client_groups(list(sizes), sizes)
    index = {name: i for i, name in enumerate(names.tolist())}
    lines: dict[str, np.ndarray] = {}
    for label, members in groups.items():
        mine = np.isin(codes, [index[m] for m in members])
        lines[label] = latency.without_nan(values[mine])
    if len(groups) > 1:
        lines["all"] = latency.without_nan(values)
    return lines


def _curve(values: np.ndarray | WeightedValues) -> tuple[np.ndarray, np.ndarray]:
    """(x, share at or below x) at the CDF_SHARES quantiles."""
    if isinstance(values, WeightedValues):
        return np.array([values.quantile(q) for q in CDF_SHARES]), CDF_SHARES
    return np.quantile(values, CDF_SHARES), CDF_SHARES


def _decades(name: str, lines: Mapping[str, np.ndarray | WeightedValues]) -> float:
    """Decades the positive values of a time metric span (0 where a value is not positive, or
    for fluidity, a share): above 1 they are drawn on a log axis, where tails show."""
    lows = [float(v.min()) for v in lines.values() if v.size]
    highs = [float(v.max()) for v in lines.values() if v.size]
    if name == "fluidity" or not lows or min(lows) <= 0:
        return 0.0
    return float(np.log10(max(highs) / min(lows)))


def _draw_distribution(
    path: Path, name: str, lines: Mapping[str, np.ndarray | WeightedValues], title: str
) -> None:
    """The cumulative distribution, and for times a second panel with the tail: the share
    above each value on a log scale, where a 1% stall tail shows as clearly as the median."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    tail = name != "fluidity"
    fig = _figure(wide=tail)
    axes = fig.subplots(1, 2 if tail else 1, squeeze=False)[0]
    colours = client_colours([label for label in lines if label != "all"])
    unit = "gaps" if name == "tbc" else "requests"
    for label, v in lines.items():
        if not v.size:
            continue
        x, share = _curve(v)
        style = {"color": "black", "linestyle": "--", "linewidth": 1} if label == "all" else {}
        style = {"color": colours.get(label), **style}
        axes[0].plot(x, share, label=f"{label} ({v.size:,})", **style)
        if tail:  # down to one value in the line's count: below that nothing is measured
            above = 1.0 - share
            shown = above >= 1.0 / v.size
            axes[1].plot(x[shown], above[shown], **style)
    axes[0].set_ylabel(f"share of {unit} at or below")
    axes[0].set_ylim(0, 1.01)
    if any(v.size for v in lines.values()):
        axes[0].legend(fontsize=7, loc="lower right", title="client (values)", title_fontsize=7)
    else:  # e.g. no request completed: say so rather than draw empty axes without a word
        axes[0].text(0.5, 0.5, "no values", ha="center", va="center", transform=axes[0].transAxes)
    # log axes: labelled major ticks and their grid, no minor ticks (a log axis's dozens of
    # minor ticks and their mathtext labels took half of each plot's drawing: 0.25 -> 0.14 s
    # a plot of 300,000 gaps, measured alone)
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    if tail:
        axes[1].set_yscale("log")
        axes[1].yaxis.set_major_formatter(plain)
        axes[1].yaxis.set_minor_locator(NullLocator())
        axes[1].set_ylabel(f"share of {unit} above (tail)")
    decades = _decades(name, lines)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.set_xlabel(UNITS[name] + (", log scale" if decades > 1 else ""))
        if decades > 1:  # labels at 1, 2 and 5 of each decade where there are few decades
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0) if decades < 3 else (1.0,)))
            ax.xaxis.set_major_formatter(plain)
            ax.xaxis.set_minor_locator(NullLocator())
    fig.suptitle(f"{name}: distribution\n{title}", fontsize=9)
    # fixed margins, not tight_layout: measuring every label cost 1.1 s of the 2.8 s the six
    # distribution plots of a sim-to-real run took to draw (benchmarks/sim2real_speed.py)
    fig.subplots_adjust(**(WIDE_MARGINS if tail else NARROW_MARGINS))
    save_png(fig, path, dpi=80)


def _pooled_row(v: WeightedValues) -> dict[str, float]:
    """`_distribution_row` of the expanded values."""
    row = {f"p{p}": v.percentile(p) for p in PERCENTILES}
    return {**row, "min": v.min(), "max": v.max(), "mean": v.mean()}


# the distribution plots' margins (fractions of the figure): room for the two-line title, the
# axis labels and log-scale tick labels such as 0.0001
WIDE_MARGINS = {"left": 0.075, "right": 0.985, "bottom": 0.15, "top": 0.82, "wspace": 0.22}
NARROW_MARGINS = {"left": 0.13, "right": 0.97, "bottom": 0.15, "top": 0.82}


def _figure(wide: bool = False) -> Any:
    """A figure for one distribution plot (two panels side by side when `wide`). Matplotlib is
    imported here, not with the module: runs without Veeksha files start 0.3 s sooner."""
    from matplotlib.figure import Figure

    return Figure(figsize=(9, 3.6) if wide else (5.5, 3.6))


def prepare_plots() -> None:
    """Import what drawing and saving the distribution plots needs (about 0.4 s), ahead of
    them (simulator/report/background.py)."""
    import matplotlib.backends.backend_agg  # noqa: F401 - the canvas savefig switches to
    import matplotlib.figure  # noqa: F401
