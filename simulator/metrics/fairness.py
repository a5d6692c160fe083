"""Fairness metrics (docs/metrics.md §4; the VTC paper's section 5.1 and its artifact).

Pure functions of a run's public tables. A request's service h(prompt, output) (linear w_p = 1,
w_q = 2 unless given) is spread uniformly over [first token, last token], as the artifact did, so
the service of any window is the overlapping share; a one-token request is a point mass at its
first token. Weighted comparisons divide each client's service and demand by its weight.

Conventions that follow the artifact (it computed every table of the paper this way):
- clients are those with at least one served request;
- the requested rate counts only served requests (`demand="served"`; rejected requests had been
  filtered out of its logs), `demand="all"` counts every arrival;
- the table ("revision") form sums over clients per tick and shifts every window by +30 s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd

from simulator.core.errors import ConfigError
from simulator.core.service import LinearService
from simulator.metrics.latency import token_throughput

ServiceFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
FORMS = ("revision", "original")


def served_intervals(
    requests: pd.DataFrame,
    tokens: pd.DataFrame | None = None,
    service: ServiceFn | None = None,
) -> pd.DataFrame:
    """Per request: client, arrival, start/end of its tokens, service received, service asked.

    `service` is h(n_p, n_q) (default linear 1/2); the demand is asked at linear prices (h's
    own when h is linear, else 1/2), as the spec and the artifact price it. Completed requests
    received h(prompt, output);
    with `tokens`, requests still running at the horizon count with the tokens they got so far.
    Requests that got no token have NaN start/end and service 0.
    """
    h = service or LinearService()
    start = requests["first_token_at"].to_numpy(dtype=float)
    end = requests["finished_at"].to_numpy(dtype=float, copy=True)
    got = np.where(requests["status"].to_numpy() == "completed", requests["output_len"], 0)
    if tokens is not None and len(tokens):
        last = tokens.groupby("request_id", sort=False)["time"].max()
        partial = np.isnan(end) & ~np.isnan(start)
        ids = requests["request_id"].to_numpy()[partial]
        end[partial] = last.reindex(ids).to_numpy()
        got = np.where(partial, requests["tokens_emitted"].to_numpy(), got)
    prompt = requests["prompt_len"].to_numpy(dtype=float)
    received = np.where(np.isnan(start), 0.0, h(prompt, got.astype(float)))
    # demand is priced linearly whatever h is (the artifact's requested rate: its tables of the
    # profiled h compare profiled service with linear demand)
    linear = h if isinstance(h, LinearService) else LinearService()
    return pd.DataFrame(
        {
            "client": requests["client"].to_numpy(),
            "arrival": requests["arrival"].to_numpy(dtype=float),
            "start": start,
            "end": end,
            "service": received,
            "demand": linear(prompt, requests["output_len"].to_numpy(dtype=float)),
            "served": ~np.isnan(start),
        }
    )


def _clients(intervals: pd.DataFrame) -> list[str]:
    """Clients with at least one served request, in the categorical's order (else sorted)."""
    col = intervals["client"]
    names = list(col.cat.categories) if hasattr(col, "cat") else sorted(col.unique())
    served = set(col[intervals["served"]].unique())  # not the rows: 0.1 s of a 19k-row run
    return [c for c in names if c in served]


def _weights(clients: list[str], weights: Mapping[str, float] | None) -> np.ndarray:
    return np.array([float((weights or {}).get(c, 1.0)) for c in clients])


def service_in(intervals: pd.DataFrame, lo: np.ndarray, hi: np.ndarray) -> pd.DataFrame:
    """Service each client received within [lo_k, hi_k] for each window k (clients x windows)."""
    s = intervals[intervals["served"]]
    start, end = s["start"].to_numpy()[:, None], s["end"].to_numpy()[:, None]
    length = end - start
    overlap = np.clip(np.minimum(hi[None, :], end) - np.maximum(lo[None, :], start), 0.0, None)
    point = (length == 0) & (start >= lo[None, :]) & (start <= hi[None, :])
    share = np.where(length > 0, overlap / np.where(length > 0, length, 1.0), point)
    amount = share * s["service"].to_numpy()[:, None]
    clients = _clients(intervals)
    codes = pd.Categorical(s["client"], categories=clients).codes
    out = np.zeros((len(clients), lo.shape[0]))
    np.add.at(out, codes, amount)
    return pd.DataFrame(out.T, columns=clients)


def service_rates(
    intervals: pd.DataFrame, ticks: np.ndarray, window: float = 60.0, shift: float = 0.0
) -> pd.DataFrame:
    """Per-client service rate at each tick: service in [t - T/2 + shift, t + T/2 + shift] / T."""
    ticks = np.asarray(ticks, dtype=float)
    rates = service_in(intervals, ticks - window / 2 + shift, ticks + window / 2 + shift) / window
    rates.index = pd.Index(ticks, name="time")
    return rates


def requested_rates(
    intervals: pd.DataFrame,
    ticks: np.ndarray,
    window: float = 60.0,
    shift: float = 0.0,
    demand: str = "served",
) -> pd.DataFrame:
    """Per-client requested rate: h(prompt, output) of requests arriving in the window / T."""
    if demand not in ("served", "all"):
        raise ConfigError(f"demand must be 'served' or 'all', got {demand!r}")
    ticks = np.asarray(ticks, dtype=float)
    r = intervals if demand == "all" else intervals[intervals["served"]]
    clients = _clients(intervals)
    r = r[r["client"].isin(clients)]
    lo, hi = ticks - window / 2 + shift, ticks + window / 2 + shift
    t = r["arrival"].to_numpy()[:, None]
    inside = (t >= lo[None, :]) & (t <= hi[None, :])
    codes = pd.Categorical(r["client"], categories=clients).codes
    out = np.zeros((len(clients), ticks.shape[0]))
    np.add.at(out, codes, inside * r["demand"].to_numpy()[:, None])
    return pd.DataFrame(out.T / window, columns=clients, index=pd.Index(ticks, name="time"))


def paper_ticks(total: float = 600.0, count: int = 20, warmup: float = 30.0) -> np.ndarray:
    """The artifact's ticks: (total - warmup) / count * i for i = 1 .. count - 1."""
    return (total - warmup) / count * np.arange(1, count)


def service_difference(
    intervals: pd.DataFrame,
    form: str = "revision",
    total: float = 600.0,
    window: float = 60.0,
    weights: Mapping[str, float] | None = None,
    demand: str = "served",
) -> pd.Series:
    """Service difference per tick.

    revision (the paper's tables): ticks (total - 30)/20 * i, windows shifted by +30 s, per tick
    sum_j min(max_k s_k - s_j, |r_j - s_j|).
    original (paper section 5): ticks total/20 * i, no shift, per tick
    max_j min(max_k s_k - s_j, r_j - s_j).
    With `weights` ({client: w}) services and demands are divided by w (for weighted VTC).
    """
    if form not in FORMS:
        raise ConfigError(f"form must be one of {FORMS}, got {form!r}")
    warmup = 30.0 if form == "revision" else 0.0
    ticks = paper_ticks(total, 20, warmup)
    s = service_rates(intervals, ticks, window, warmup)
    r = requested_rates(intervals, ticks, window, warmup, demand)
    if s.shape[1] == 0:  # no client was served: no difference to measure
        return pd.Series(np.nan, index=s.index, name="service_difference")
    w = _weights(list(s.columns), weights)
    s_arr, r_arr = s.to_numpy() / w, r.to_numpy() / w
    gap = s_arr.max(axis=1, keepdims=True) - s_arr
    if form == "revision":
        diff = np.minimum(gap, np.abs(r_arr - s_arr)).sum(axis=1)
    else:
        diff = np.minimum(gap, r_arr - s_arr).max(axis=1)
    return pd.Series(diff, index=s.index, name="service_difference")


def tick_span(end_time: object) -> float:
    """T_total for the ticks: the tables' 600 s, or the run's end when it ran longer."""
    return max(600.0, float(end_time or 0.0))  # type: ignore[arg-type]


def difference_stats(diff: pd.Series) -> dict[str, float]:
    """Max Diff, Avg Diff and Diff Var (population variance) over ticks, as in the paper (NaN
    when no client was served)."""
    d = diff.to_numpy(dtype=float)
    if np.isnan(d).all():
        return {"max_diff": np.nan, "avg_diff": np.nan, "diff_var": np.nan}
    return {"max_diff": float(d.max()), "avg_diff": float(d.mean()), "diff_var": float(d.var())}


def accumulated_service(
    intervals: pd.DataFrame,
    times: np.ndarray,
    since: float = 0.0,
    weights: Mapping[str, float] | None = None,
) -> pd.DataFrame:
    """W_i(since, t) for each client and each t in `times` (divided by w_i when weighted)."""
    times = np.asarray(times, dtype=float)
    acc = service_in(intervals, np.full(times.shape[0], since), times)
    acc = acc / _weights(list(acc.columns), weights)
    acc.index = pd.Index(times, name="time")
    return acc


def cumulative_service(intervals: pd.DataFrame, times: np.ndarray) -> pd.DataFrame:
    """W_i(0, t) for each client at each of `times` (sorted): `accumulated_service` since 0,
    computed from each request's start and end sorted once (n log n in the requests) instead
    of a requests x times matrix, so that it serves runs of millions of requests. Service
    spreads uniformly over [start, end]; a request with start == end is a point mass; one with
    no end (still running, its last token unknown) is left out."""
    times = np.asarray(times, dtype=float)
    clients = _clients(intervals)
    s = intervals[intervals["served"] & intervals["end"].notna()]
    start, end = s["start"].to_numpy(), s["end"].to_numpy()
    amount = s["service"].to_numpy()
    codes = pd.Categorical(s["client"], categories=clients).codes
    length = end - start
    spread = length > 0
    rate = np.where(spread, amount / np.where(spread, length, 1.0), 0.0)
    out = np.zeros((times.shape[0], len(clients)))
    for k in range(len(clients)):
        mine = codes == k
        # a spread request adds rate * (t - start) from its start and takes it back from its
        # end: W(t) = sum over events e <= t of slope_e * (t - time_e), plus point masses
        at = np.concatenate((start[mine & spread], end[mine & spread]))
        slope = np.concatenate((rate[mine & spread], -rate[mine & spread]))
        order = np.argsort(at, kind="stable")
        at, slope = at[order], slope[order]
        upto = np.searchsorted(at, times, side="right")
        slopes = np.concatenate(([0.0], np.cumsum(slope)))[upto]
        offsets = np.concatenate(([0.0], np.cumsum(slope * at)))[upto]
        point_at, point_amount = start[mine & ~spread], amount[mine & ~spread]
        by_time = np.argsort(point_at, kind="stable")
        point_sums = np.concatenate(([0.0], np.cumsum(point_amount[by_time])))
        points = point_sums[np.searchsorted(point_at[by_time], times, side="right")]
        out[:, k] = slopes * times - offsets + points
    return pd.DataFrame(out, columns=clients, index=pd.Index(times, name="time"))


def accumulated_difference(
    intervals: pd.DataFrame,
    times: np.ndarray,
    since: float = 0.0,
    weights: Mapping[str, float] | None = None,
) -> pd.Series:
    """max_i W_i(since, t) - min_i W_i(since, t) over time."""
    acc = accumulated_service(intervals, times, since, weights)
    return (acc.max(axis=1) - acc.min(axis=1)).rename("accumulated_difference")


def jain_index(values: np.ndarray | pd.Series) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when equal, 1/n when one gets all."""
    x = np.asarray(values, dtype=float)
    denom = x.shape[0] * float((x * x).sum())
    return float(x.sum() ** 2 / denom) if denom > 0 else float("nan")


def response_times(requests: pd.DataFrame, ticks: np.ndarray, window: float = 60.0) -> pd.DataFrame:
    """Per client: mean TTFT of requests whose first token falls in [t - T/2, t + T/2]."""
    ticks = np.asarray(ticks, dtype=float)
    served = requests[requests["first_token_at"].notna()]
    first = served["first_token_at"].to_numpy()[:, None]
    inside = (first >= ticks[None, :] - window / 2) & (first <= ticks[None, :] + window / 2)
    ttft = (served["first_token_at"] - served["arrival"]).to_numpy()[:, None]
    out = {}
    for c in _clients(served_intervals(requests)):
        mine = (served["client"] == c).to_numpy()[:, None] & inside
        n = mine.sum(axis=0)
        out[c] = np.where(n > 0, (mine * ttft).sum(axis=0) / np.maximum(n, 1), np.nan)
    return pd.DataFrame(out, index=pd.Index(ticks, name="time"))


def rejections(requests: pd.DataFrame) -> pd.DataFrame:
    """Unserved requests per client and reason (rejected by a policy, refused by the engine,
    failed on the way: measured runs)."""
    lost = requests[requests["status"].isin(["rejected", "refused", "failed"])]
    return (
        lost.groupby(["client", "status", "reason"], observed=True)
        .size()
        .rename("requests")
        .reset_index()
    )


def fairness_summary(
    requests: pd.DataFrame,
    tokens: pd.DataFrame | None = None,
    service: ServiceFn | None = None,
    weights: Mapping[str, float] | None = None,
    total: float = 600.0,
) -> dict[str, object]:
    """The paper's table row (revision form), plus each client's service received until the
    last arrival and Jain's index over it (weight-normalised when `weights` are given)."""
    intervals = served_intervals(requests, tokens, service)
    stats = difference_stats(service_difference(intervals, "revision", total, weights=weights))
    # service while requests were still arriving: the contended part, where fairness shows
    until = float(intervals["arrival"].max())
    per_client = accumulated_service(intervals, np.array([until])).iloc[0]
    w = _weights(list(per_client.index), weights)
    return {
        **stats,
        "throughput_tokens_per_s": token_throughput(requests),
        "service_until": until,
        "service_per_client": {str(k): float(v) for k, v in per_client.items()},
        "jain_index": jain_index(per_client.to_numpy() / w),
        "rejected": int((requests["status"] == "rejected").sum()),
    }
