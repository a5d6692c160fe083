"""Latency and throughput metrics (spec: metrics.md section 1), pure functions of a run's tables.

Inputs are the public tables (`requests`, `tokens`, `steps` as written to the run folder), so the
same functions score a fresh `Timeline` and a reloaded run. Conventions here: TPOT is vLLM's
(t_n - t_1)/(n - 1) over requests with n > 1; TBT samples are every gap after the first token,
pooled over requests; percentiles use numpy's linear interpolation.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

PERCENTILES = (50, 90, 99)


def per_request_latency(requests: pd.DataFrame, tokens: pd.DataFrame) -> pd.DataFrame:
    """TTFT, TPOT, E2E and normalized E2E per request that emitted at least one token.

    E2E uses the last emitted token, so for requests still running at the horizon it is the
    latency so far.
    """
    t = tokens.sort_values(["request_id", "index"], kind="stable")
    g = t.groupby("request_id", sort=True)["time"]
    first, last, n = g.first(), g.last(), g.size()
    req = requests.set_index("request_id").loc[first.index]
    out = pd.DataFrame(
        {
            "client": req["client"].to_numpy(),
            "ttft": first.to_numpy() - req["arrival"].to_numpy(),
            "e2e": last.to_numpy() - req["arrival"].to_numpy(),
            "tokens": n.to_numpy(),
        },
        index=first.index,
    )
    out["tpot"] = np.where(
        out.tokens > 1, (last.to_numpy() - first.to_numpy()) / np.maximum(out.tokens - 1, 1), np.nan
    )
    out["normalized_e2e"] = out.e2e / out.tokens
    return out


def tbt_samples(tokens: pd.DataFrame) -> pd.DataFrame:
    """Gaps between consecutive tokens of the same request (first token excluded)."""
    t = tokens.sort_values(["request_id", "index"], kind="stable")
    gap = np.diff(t["time"].to_numpy(), prepend=np.nan)
    keep = t["index"].to_numpy() > 0
    return pd.DataFrame({"request_id": t["request_id"].to_numpy()[keep], "tbt": gap[keep]})


def percentiles(values: np.ndarray, ps: tuple[int, ...] = PERCENTILES) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return {"mean": float("nan"), **{f"p{p}": float("nan") for p in ps}}
    return {"mean": float(v.mean()), **{f"p{p}": float(np.percentile(v, p)) for p in ps}}


def latency_summary(requests: pd.DataFrame, tokens: pd.DataFrame) -> dict[str, dict]:
    """Per client and overall ("all"): request counts and TTFT/TPOT/E2E/TBT statistics."""
    lat = per_request_latency(requests, tokens)
    gaps = tbt_samples(tokens)
    gaps["client"] = requests.set_index("request_id").loc[gaps.request_id, "client"].to_numpy()
    out: dict[str, dict] = {}
    clients = [str(c) for c in pd.unique(requests["client"])]
    for name in [*sorted(clients, key=_natural), "all"]:
        sel = lat if name == "all" else lat[lat.client.astype(str) == name]
        gsel = gaps if name == "all" else gaps[gaps.client.astype(str) == name]
        reqs = requests if name == "all" else requests[requests.client.astype(str) == name]
        out[name] = {
            "requests": len(reqs),
            "completed": int((reqs.status == "completed").sum()),
            "output_tokens": int(sel.tokens.sum()),
            "ttft": percentiles(sel.ttft.to_numpy()),
            "tpot": percentiles(sel.tpot.to_numpy()),
            "e2e": percentiles(sel.e2e.to_numpy()),
            "tbt": percentiles(gsel.tbt.to_numpy()),
        }
    return out


def token_throughput(requests: pd.DataFrame) -> float:
    """Sum of prompt + output tokens of completed requests / time of the last finish (tokens/s)."""
    done = requests[requests.status == "completed"]
    if done.empty:
        return 0.0
    end = float(done.finished_at.max())
    return float((done.prompt_len + done.output_len).sum() / end) if end > 0 else float("nan")


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
