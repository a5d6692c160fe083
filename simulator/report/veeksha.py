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
from simulator.report.run_folder import json_safe

DISTRIBUTION_METRICS = ("ttfc", "tbc", "tpot", "e2e", "normalized_e2e", "fluidity")
MISS_CURVE_FILE = "deadline_miss_rate_at_tbt_targets.csv"
# Veeksha's per-request rows, gzip-compressed: the default run's 1,620 rows with their decode
# gaps take 9.4 MB as plain JSON and 0.3 MB compressed (pandas.read_json(path, lines=True) and
# zcat read it as it is); each append adds a gzip member, which readers join
REQUEST_ROWS_FILE = "request_level_metrics.jsonl.gz"
ROWS_COMPRESSION = 6  # gzip level: level 1 gives a 40% larger file for a small saving in time
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
) -> None:
    """request_level_metrics.jsonl.gz (the rows of `request_level_columns`, each with its decode
    gaps) and the distributions (`write_distributions`)."""
    write_request_level_metrics(out / REQUEST_ROWS_FILE, columns, decode_gaps)
    write_distributions(out, values)


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


def write_distributions(out: Path, values: Mapping[str, np.ndarray | WeightedValues]) -> None:
    """Per distribution metric, its statistics (CSV) and its histogram (PNG)."""
    for name in DISTRIBUTION_METRICS:
        v = values[name]
        bars: dict[str, Any]
        if isinstance(v, WeightedValues):  # the same bars as the expanded values give
            row = _pooled_row(v)
            counts, edges = v.histogram(50)
            bars = {"x": edges[:-1], "bins": edges, "weights": counts}
        else:
            # one array for the statistics and the histogram, not a copy for each (the plots'
            # child peaks 32 MB lower on the Azure run's 4M decode gaps)
            present = latency.without_nan(v)
            row = _distribution_row(present)
            bars = {"x": present, "bins": _bins(present)}
        pd.DataFrame([row]).to_csv(out / f"{name}.csv", index=False)
        fig = _figure()
        ax = fig.subplots()
        ax.hist(**bars)
        ax.set_xlabel(name + ("" if name == "fluidity" else " (s)"))
        ax.set_ylabel("count")
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=80)


def _bins(values: np.ndarray) -> int:
    """50 bars, or one where the values span too little for 50 distinct float edges (equal
    requests served alike differ in the last bits, and numpy refuses such bins)."""
    if values.size and np.ptp(values) <= 1e-9 * max(1.0, float(np.abs(values).max())):
        return 1
    return 50


def _pooled_row(v: WeightedValues) -> dict[str, float]:
    """`_distribution_row` of the expanded values."""
    row = {f"p{p}": v.percentile(p) for p in PERCENTILES}
    return {**row, "min": v.min(), "max": v.max(), "mean": v.mean()}


def _figure() -> Any:
    """A figure for one distribution plot. Matplotlib is imported here, not with the module:
    runs without Veeksha files start 0.3 s sooner."""
    from matplotlib.figure import Figure

    return Figure(figsize=(5, 3.2))


def prepare_plots() -> None:
    """Import what drawing and saving the distribution plots needs (about 0.4 s), ahead of
    them (simulator/report/background.py)."""
    import matplotlib.backends.backend_agg  # noqa: F401 - the canvas savefig switches to
    import matplotlib.figure  # noqa: F401
