"""Latency, throughput and QoE metrics (docs/metrics.md §1 and 3), pure functions of a
run's public tables (`requests`, `tokens`, `steps` as written to the run folder), so the same
functions score a fresh `Timeline` and a reloaded run.

Latency conventions (`convention=`), which differ only in TPOT:
- `vllm` (default): (t_n - t_1)/(n - 1); requests with one token have no TPOT (NaN, dropped).
- `veeksha`, `evalscope`: the same formula, 0 for one-token requests.
- `etalon`: the mean of the decode gaps itt[1:], 0 for one-token requests.
TTFT = t_1 - arrival, E2E = t_n - arrival, normalized E2E = E2E / n, output throughput = n / E2E
(in the simulator a request is dispatched when it arrives, so Veeksha's TTFC equals TTFT). TBT
samples are every gap after the first token, pooled over requests. Percentiles are numpy's linear
interpolation unless `method="evalscope"` (nearest rank ceil(n p / 100), rounded to 4 decimals).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from simulator.core.errors import ConfigError
from simulator.metrics.fluidity import Ragged, deadline_counts, fluidity_index, ranges

__all__ = ["fluidity_index"]  # re-exported: the public home of the fluidity-index is this module

PERCENTILES = (50, 90, 99)
CONVENTIONS = ("vllm", "veeksha", "etalon", "evalscope")
PERCENTILE_METHODS = ("linear", "evalscope")


def tokens_of(tokens: pd.DataFrame, request_ids: pd.Series | np.ndarray) -> pd.DataFrame:
    """The rows of `tokens` of these requests: the frame itself when that is every row (no
    copy of what may be tens of millions of rows)."""
    mine = tokens["request_id"].isin(request_ids).to_numpy()
    return tokens if mine.all() else tokens[mine]


def grouped_tokens(tokens: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(request ids, token counts, times): requests by increasing id, each one's tokens
    contiguous in index order (the order of a stable sort by request_id, index)."""
    ids = tokens["request_id"].to_numpy()
    index = tokens["index"].to_numpy()
    times = tokens["time"].to_numpy()
    if ids.size == 0:
        return ids, np.empty(0, dtype=np.int64), np.empty(0)
    # a run folder keeps every request's tokens together in index order, usually by id too:
    # then no sort is needed (sorting tens of millions of rows dominated the metrics)
    first = index == 0
    starts = np.flatnonzero(first)
    counts = np.diff(np.append(starts, ids.size))
    # grouped: every row but a request's first has its predecessor's id and the next index
    # (compared neighbour to neighbour, without expanding each request's start to its rows:
    # the Azure run's 4M tokens take 9 ms instead of 30-70 ms, and this runs 9 times a run)
    first_or = first[1:]
    grouped = (
        bool(first[0])
        and bool(np.all(first_or | (ids[1:] == ids[:-1])))
        and bool(np.all(first_or | (index[1:] - index[:-1] == 1)))
    )
    if grouped and bool(np.all(np.diff(ids[starts]) > 0)):
        return ids[starts], counts, times
    if grouped and np.unique(ids[starts]).size == starts.size:  # grouped, not by id
        by_id = np.argsort(ids[starts], kind="stable")
        return ids[starts][by_id], counts[by_id], times[ranges(starts[by_id], counts[by_id])]
    t = tokens.sort_values(["request_id", "index"], kind="stable")
    ids = t["request_id"].to_numpy()
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    counts = np.diff(np.r_[starts, ids.size])
    return ids[starts], counts, t["time"].to_numpy()


def inter_token_gaps(
    requests: pd.DataFrame, tokens: pd.DataFrame, completed_only: bool = True
) -> tuple[pd.DataFrame, Ragged]:
    """Per request that emitted tokens: its facts (request_id, client, arrival, prompt_len) and
    its inter-token list [t_1 - arrival, t_2 - t_1, ...] (docs/metrics.md, the input of every
    metric).
    By default only completed requests, as Etalon and Veeksha score them."""
    ids, counts, times = grouped_tokens(tokens)
    req = requests.set_index("request_id").loc[ids]
    keep = (req["status"] == "completed").to_numpy() if completed_only else np.ones(ids.size, bool)
    gaps = np.diff(times, prepend=0.0)
    starts = np.cumsum(counts) - counts
    gaps[starts] = times[starts] - req["arrival"].to_numpy()
    facts = req.reset_index()[["request_id", "client", "arrival", "prompt_len"]]
    ragged = Ragged(gaps, counts)
    if keep.all():
        return facts, ragged
    rows = np.flatnonzero(keep)
    return facts.iloc[rows].reset_index(drop=True), ragged.take(rows)


def per_request_latency(
    requests: pd.DataFrame, tokens: pd.DataFrame, convention: str = "vllm"
) -> pd.DataFrame:
    """TTFT, TPOT, E2E, normalized E2E and output throughput per request that emitted at least
    one token, indexed by request_id. E2E uses the last emitted token, so for requests still
    running at the horizon it is the latency so far."""
    if convention not in CONVENTIONS:
        raise ConfigError(f"unknown latency convention {convention!r}; accepted: {CONVENTIONS}")
    ids, n, times = grouped_tokens(tokens)
    starts = np.cumsum(n) - n
    first, last = times[starts], times[starts + n - 1]
    req = requests.set_index("request_id").loc[ids]
    arrival = req["arrival"].to_numpy()
    out = pd.DataFrame(
        {
            "client": req["client"].to_numpy(),
            "prompt_len": req["prompt_len"].to_numpy(),
            "ttft": first - arrival,
            "e2e": last - arrival,
            "tokens": n,
        },
        index=pd.Index(ids, name="request_id"),
    )
    several = n > 1
    if convention == "etalon":
        gaps = np.diff(times, prepend=0.0)
        gaps[starts] = 0.0  # each request's own decode gaps only
        decode_sum = np.add.reduceat(gaps, starts) if ids.size else first
        tpot = np.where(several, decode_sum / np.maximum(n - 1, 1), 0.0)
    else:
        tpot = np.where(several, (last - first) / np.maximum(n - 1, 1), np.nan)
        if convention != "vllm":
            tpot = np.where(several, tpot, 0.0)
    out["tpot"] = tpot
    out["normalized_e2e"] = out.e2e / out.tokens
    out["output_throughput"] = np.divide(
        n, out.e2e.to_numpy(), out=np.full(n.shape[0], np.nan), where=out.e2e.to_numpy() > 0
    )
    return out


def tbt_samples(tokens: pd.DataFrame) -> pd.DataFrame:
    """Gaps between consecutive tokens of the same request (first token excluded)."""
    ids, counts, times = grouped_tokens(tokens)
    return pd.DataFrame({"request_id": ids.repeat(counts - 1), "tbt": gaps_within(times, counts)})


def tbt_values(tokens: pd.DataFrame) -> np.ndarray:
    """The gaps of `tbt_samples` alone."""
    _, counts, times = grouped_tokens(tokens)
    return gaps_within(times, counts)


def gaps_within(times: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The gaps between consecutive tokens of each request, request after request (`times`
    grouped by request, `counts` >= 1 tokens each)."""
    if times.size == 0:
        return np.empty(0)
    return np.delete(np.diff(times), np.cumsum(counts)[:-1] - 1)  # across two requests


def percentile(values: np.ndarray, p: float, method: str = "linear") -> float:
    """The p-th percentile (0..100) of the non-NaN values; NaN when there are none.

    `linear`: numpy's default interpolation. `evalscope`: EvalScope's rule (1.14.1), the nearest
    rank: the element at rank ceil(n p / 100) of the sorted values (the first for p = 0, the
    last for p = 100), rounded to 4 decimals.
    """
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if not 0 <= p <= 100:
        raise ConfigError(f"percentile must be within [0, 100]; got {p}")
    if v.size == 0:
        return float("nan")
    if method == "linear":
        return float(np.percentile(v, p))
    if method == "evalscope":
        v = np.sort(v)
        rank = v.size if p >= 100 else max(1, math.ceil(v.size * p / 100))
        return round(float(v[rank - 1]), 4)
    raise ConfigError(f"unknown percentile method {method!r}; accepted: {PERCENTILE_METHODS}")


def without_nan(values: np.ndarray) -> np.ndarray:
    """The values that are not NaN: the array itself when none is (no copy of millions of
    gaps when there is nothing to leave out)."""
    missing = np.isnan(values)
    return values[~missing] if missing.any() else values


def percentiles(
    values: np.ndarray, ps: tuple[int, ...] = PERCENTILES, method: str = "linear"
) -> dict[str, float]:
    """Mean and the `ps` percentiles of the non-NaN values (NaN when there are none)."""
    v = without_nan(np.asarray(values, dtype=np.float64))
    mean = float(v.mean()) if v.size else float("nan")
    if method == "linear" and v.size and all(0 <= p <= 100 for p in ps):
        # one partition for all of them: the same values as one call per p, in 54% of the time
        # (4M inter-token gaps, p50/p90/p99: 66 ms against 121 ms)
        found = np.percentile(v, ps)
        return {"mean": mean, **{f"p{p}": float(x) for p, x in zip(ps, found, strict=True)}}
    return {"mean": mean, **{f"p{p}": percentile(v, p, method) for p in ps}}


def latency_summary(requests: pd.DataFrame, tokens: pd.DataFrame) -> dict[str, dict]:
    """Per client and overall ("all"): request counts and TTFT/TPOT/E2E/TBT statistics."""
    lat = per_request_latency(requests, tokens)
    return latency_table(requests, lat, tbt_selector(requests, *grouped_tokens(tokens)))


def tbt_selector(
    requests: pd.DataFrame, ids: np.ndarray, counts: np.ndarray, times: np.ndarray
) -> Callable[[np.ndarray], dict[str, float]]:
    """The `percentiles` of the TBT gaps of the requests a mask over `requests` selects
    (`grouped_tokens`' output)."""
    tbt = gaps_within(times, counts)
    by_id = pd.Index(requests["request_id"]).get_indexer(ids).astype(np.int32)
    gap_row = by_id.repeat(counts - 1)  # each gap's request (row of `requests`; int32: compact)

    def tbt_of(rows: np.ndarray) -> dict[str, float]:
        return percentiles(tbt if rows.all() else tbt[rows[gap_row]])

    return tbt_of


def latency_table(
    requests: pd.DataFrame,
    lat: pd.DataFrame,
    tbt_of: Callable[[np.ndarray], dict[str, float]],
) -> dict[str, dict]:
    """`latency_summary` from `per_request_latency` and the `percentiles` of the pooled gaps
    of the requests a mask over `requests` selects (a run scored in blocks pools them from its
    token clock: simulator/metrics/pooled.py). The latencies leave out rejected requests that
    emitted tokens (their clients gave up or went away mid-stream: their stream has no end,
    and benchmark clients count them as failed, not as latencies); their tokens still count."""
    request_client = requests["client"].astype(str).to_numpy()
    names = sorted({str(c) for c in pd.unique(request_client)}, key=_natural)
    code = {name: i for i, name in enumerate(names)}
    request_code = np.array([code[c] for c in request_client], dtype=np.int32)
    row_of = pd.Index(requests["request_id"]).get_indexer(lat.index)
    lat_code = request_code[row_of]
    status = requests["status"].to_numpy()
    completed = status == "completed"
    kept = status != "rejected"
    lat_kept = kept[row_of]
    tokens = lat.tokens.to_numpy()
    ttft, tpot, e2e = (lat[k].to_numpy() for k in ("ttft", "tpot", "e2e"))
    out: dict[str, dict] = {}
    for name in [*names, "all"]:
        if name == "all":
            mine, counted = np.ones(len(requests), dtype=bool), np.ones(len(lat), dtype=bool)
        else:
            c = code[name]
            mine, counted = request_code == c, lat_code == c
        sel = counted & lat_kept
        out[name] = {
            "requests": int(mine.sum()),
            "completed": int(completed[mine].sum()),
            "output_tokens": int(tokens[counted].sum()),
            "ttft": percentiles(ttft[sel]),
            "tpot": percentiles(tpot[sel]),
            "e2e": percentiles(e2e[sel]),
            "tbt": tbt_of(mine & kept),
        }
    return out


def token_throughput(requests: pd.DataFrame) -> float:
    """Sum of prompt + output tokens of completed requests / time of the last finish (tokens/s)."""
    done = requests[requests.status == "completed"]
    if done.empty:
        return 0.0
    end = float(done.finished_at.max())
    return float((done.prompt_len + done.output_len).sum() / end) if end > 0 else float("nan")


def goodput(
    requests: pd.DataFrame,
    tokens: pd.DataFrame,
    ttft: float | None = None,
    tpot: float | None = None,
    e2e: float | None = None,
) -> float:
    """vLLM's goodput: completed requests meeting every given limit (inclusive; TPOT counts as 0
    for one-token outputs) per second of the run (first arrival to last finish)."""
    done = requests[requests.status == "completed"]
    if done.empty:
        return 0.0
    lat = per_request_latency(done, tokens_of(tokens, done.request_id), "veeksha")
    return goodput_of(requests, lat, ttft, tpot, e2e)


def goodput_of(
    requests: pd.DataFrame,
    lat: pd.DataFrame,
    ttft: float | None = None,
    tpot: float | None = None,
    e2e: float | None = None,
) -> float:
    """`goodput` from the completed requests' `per_request_latency` (convention "veeksha")."""
    done = requests[requests.status == "completed"]
    if done.empty:
        return 0.0
    good = np.ones(len(lat), dtype=bool)
    for limit, column in ((ttft, "ttft"), (tpot, "tpot"), (e2e, "e2e")):
        if limit is not None:
            good &= lat[column].to_numpy() <= limit
    duration = float(done.finished_at.max() - requests.arrival.min())
    return float(good.sum() / duration) if duration > 0 else float("nan")


def andes_qoe(
    requests: pd.DataFrame,
    tokens: pd.DataFrame,
    expected_ttft: float = 1.0,
    reading_speed: float = 5.0,
) -> pd.Series:
    """Andes QoE per request with tokens (docs/metrics.md §3, its discrete form).

    The user expects token i at T*_i = arrival + expected_ttft + i / reading_speed and reads no
    faster than `reading_speed` tokens/s, so token i is consumed at
    A_i = max(t_{i+1}, A_{i-1} + 1/speed) (A_0 = max(t_1, T*_0)).
    QoE = 1 - sum(max(0, A_i - T*_i)) / sum(A_i - arrival). This is the token-sum form of
    docs/metrics.md, not the paper's continuous areas between delivery curves.
    Unrolled, A_i - T*_i = max(0, max_{k<=i}(t_{k+1} - k/speed) - T*_0), a running maximum.
    """
    if expected_ttft < 0 or not reading_speed > 0:
        raise ConfigError(
            f"expected_ttft must be >= 0 and reading_speed > 0; got {expected_ttft}, "
            f"{reading_speed}"
        )
    ids, n, times = grouped_tokens(tokens)
    if ids.size == 0:
        return pd.Series([], dtype=float, index=pd.Index([], name="request_id"), name="qoe")
    arrival = requests.set_index("request_id").loc[ids, "arrival"].to_numpy()
    qoe = np.concatenate(
        [
            _andes_block(block, arrival[rows], expected_ttft, reading_speed)
            for rows, block in Ragged(times, n).blocks()
        ]
    )
    return pd.Series(qoe, index=pd.Index(ids, name="request_id"), name="qoe")


def _andes_block(
    times: Ragged, arrival: np.ndarray, expected_ttft: float, reading_speed: float
) -> np.ndarray:
    """Andes QoE of consecutive requests, given their token times."""
    n, rows = times.lengths, times.lengths.shape[0]
    index = np.arange(times.values.size) - np.repeat(times.offsets, n)
    group = np.repeat(np.arange(rows), n)
    running = pd.Series(times.values - index / reading_speed).groupby(group).cummax().to_numpy()
    expected_first = np.repeat(arrival + expected_ttft, n)
    consumed = np.maximum(running, expected_first) + index / reading_speed
    delay = np.maximum(running - expected_first, 0.0)
    s_delay = np.bincount(group, delay, rows)
    s_whole = np.bincount(group, consumed - np.repeat(arrival, n), rows)
    return 1.0 - np.divide(s_delay, s_whole, out=np.zeros(rows), where=s_whole > 0)


def request_fluidity(
    requests: pd.DataFrame,
    tokens: pd.DataFrame,
    ttft_deadline: float | np.ndarray | None = None,
    tbt_deadline: float = 0.05,
    exact: bool = False,
    prefill_curve: Callable[[np.ndarray], np.ndarray] | None = None,
    scheduling_slack: float = 0.0,
) -> pd.DataFrame:
    """Fluidity-index per completed request (client, prompt_len, fluidity, missed, total,
    miss_rate). D_p is `ttft_deadline` (a constant) or, when `prefill_curve` (a callable of
    prompt lengths, e.g. `PrefillCurve`) is given, its prediction plus `scheduling_slack`."""
    facts, gaps = inter_token_gaps(requests, tokens)
    if prefill_curve is not None:
        d_p = np.asarray(prefill_curve(facts.prompt_len.to_numpy()), dtype=np.float64)
        d_p = d_p + scheduling_slack
    elif ttft_deadline is None:
        raise ConfigError("give ttft_deadline (seconds) or a prefill_curve for the first deadline")
    else:
        d_p = np.asarray(ttft_deadline, dtype=np.float64)
    missed, total = deadline_counts(gaps, d_p, tbt_deadline, exact)
    rate = np.divide(missed, total, out=np.zeros(missed.shape[0]), where=total > 0)
    out = facts.set_index("request_id")[["client", "prompt_len"]].copy()
    out["fluidity"] = 1.0 - rate
    out["missed"], out["total"], out["miss_rate"] = missed, total, rate
    return out


def kv_utilisation(steps: pd.DataFrame, pool_tokens: int) -> dict[str, float]:
    """Time-weighted mean and peak fraction of the KV pool in use over busy steps."""
    if steps.empty:
        return {"mean": 0.0, "peak": 0.0}
    dur = (steps.end - steps.start).to_numpy()
    used = steps.kv_used.to_numpy() / pool_tokens
    busy = dur.sum()
    return {
        "mean": float((used * dur).sum() / busy) if busy > 0 else float(used.mean()),
        "peak": float(used.max()),
    }


def _natural(name: str) -> tuple:
    """Sort 'client10' after 'client9'."""
    head = name.rstrip("0123456789")
    tail = name[len(head) :]
    return (head, int(tail) if tail else -1, name)
