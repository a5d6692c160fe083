"""Metrics of the vLLM-style engine and of clusters: preemptions, prefix-cache hits, per replica.

Pure functions of the run folder's tables: requests.parquet and steps.parquet carry `replica`
(and steps `preempted`) for every engine; requests.parquet has `preemptions`, `cached_tokens`
and `recompute_avoided_tokens` under engine=vllm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from simulator.metrics import latency


def engine_counts(requests: pd.DataFrame) -> dict[str, Any]:
    """Preemptions and prefix-cache hits, overall and per client. The hit rate is the share of
    admitted requests' prompt tokens served from the cache, each prompt counted once (at its
    first admission); tokens a resumed request found cached are `recompute_avoided_tokens`."""
    admitted = requests[requests.admitted_at.notna()]
    per_client: dict[str, dict[str, float | int]] = {}
    for client, g in admitted.groupby("client", observed=True):
        per_client[str(client)] = _counts(g)
    return {**_counts(admitted), "per_client": per_client}


def _counts(g: pd.DataFrame) -> dict[str, float | int]:
    prompt = int(g.prompt_len.sum())
    cached = int(g.cached_tokens.sum())
    out: dict[str, float | int] = {
        "preemptions": int(g.preemptions.sum()),
        "preempted_requests": int((g.preemptions > 0).sum()),
        "cached_prompt_tokens": cached,
        "prefix_hit_rate": cached / prompt if prompt else 0.0,
        "recompute_avoided_tokens": int(g.recompute_avoided_tokens.sum()),
    }
    if "cpu_cached_tokens" in g:  # a CPU tier: hits there, and swaps back in
        cpu = int(g.cpu_cached_tokens.sum())
        out["cpu_cached_prompt_tokens"] = cpu
        out["cpu_hit_rate"] = cpu / prompt if prompt else 0.0
        out["swap_ins"] = int(g.swap_ins.sum())
    return out


@dataclass(frozen=True)
class StepTotals:
    """What the summaries need of a set of steps, added up block by block when a run's steps
    are read back from disk a row group at a time."""

    steps: int
    busy: float  # seconds of the steps
    used_time: float  # sum of KV pool fraction in use x step duration
    used_sum: float  # sum of KV pool fraction in use (its mean when no step took time)
    peak: float  # the largest fraction in use
    prefill_tokens: int  # prompt tokens of prefill steps

    @classmethod
    def of(cls, steps: pd.DataFrame, pool_tokens: int) -> StepTotals:
        dur = (steps.end - steps.start).to_numpy()
        used = steps.kv_used.to_numpy() / pool_tokens
        return cls(
            steps=len(steps),
            busy=float(dur.sum()),
            used_time=float((used * dur).sum()),
            used_sum=float(used.sum()),
            peak=float(used.max()) if len(steps) else 0.0,
            prefill_tokens=int(steps.num_tokens[steps.kind == "prefill"].sum()),
        )

    def __add__(self, other: StepTotals) -> StepTotals:
        return StepTotals(
            self.steps + other.steps,
            self.busy + other.busy,
            self.used_time + other.used_time,
            self.used_sum + other.used_sum,
            max(self.peak, other.peak),
            self.prefill_tokens + other.prefill_tokens,
        )

    def kv_utilisation(self) -> dict[str, float]:
        """`latency.kv_utilisation` of these steps."""
        if self.steps == 0:
            return {"mean": 0.0, "peak": 0.0}
        busy = self.busy
        mean = self.used_time / busy if busy > 0 else self.used_sum / self.steps
        return {"mean": mean, "peak": self.peak}


def step_totals(steps: pd.DataFrame, pool_tokens: int) -> dict[int, StepTotals]:
    """StepTotals of each replica's steps."""
    return {
        int(rep): StepTotals.of(g, pool_tokens)
        for rep, g in steps.groupby("replica", sort=True, observed=True)
    }


def per_replica(
    requests: pd.DataFrame, emitted: pd.Series, totals: dict[int, StepTotals]
) -> list[dict[str, Any]]:
    """One record per replica: requests it ran, completions, output tokens, token throughput
    (prompt + output of its completed requests over its last finish), TTFT mean and p99,
    preemptions (0 for an engine that never preempts), KV utilisation. `emitted`: output
    tokens per request_id; `totals`: `step_totals` of the steps. Requests never admitted under
    a shared queue have replica -1 and are left out. Disaggregated pools: a prefill replica's
    requests are those it prefilled (their tokens count on their decode replica)."""
    out = []
    emitted_on = requests.set_index("request_id").replica.reindex(emitted.index).to_numpy()
    prefilled = requests.get("prefill_replica")
    for rep in sorted(totals):
        mine = requests.replica == rep
        if prefilled is not None:
            mine |= prefilled == rep
        r = requests[mine]
        done = r[r.status == "completed"]
        ttft = (done.first_token_at - done.arrival).to_numpy()
        out.append(
            {
                "replica": rep,
                "requests": len(r),
                "completed": len(done),
                "output_tokens": int(emitted.to_numpy()[emitted_on == rep].sum()),
                "throughput_tokens_per_s": latency.token_throughput(r),
                "ttft_mean": float(ttft.mean()) if ttft.size else float("nan"),
                "ttft_p99": float(np.percentile(ttft, 99)) if ttft.size else float("nan"),
                "preemptions": int(r.preemptions.sum()) if "preemptions" in r else 0,
                "kv_utilisation": totals[rep].kv_utilisation(),
                "steps": totals[rep].steps,
            }
        )
    return out


def disaggregation(requests: pd.DataFrame) -> dict[str, Any]:
    """Disaggregated pools: requests whose prompt the prefill pool computed, KV transfers, the
    bytes moved, how long a handed-off request waited for its decode replica to admit it
    (handoff to transfer start) and how long transfers took (seconds, mean and p99)."""
    crossed = requests.prefill_replica.to_numpy() >= 0
    start = requests.kv_transfer_start.to_numpy()
    moved = np.isfinite(start)
    took = (requests.kv_transfer_end.to_numpy() - start)[moved]
    waited = (start - requests.first_token_at.to_numpy())[moved]

    def stats(x: np.ndarray) -> dict[str, float]:
        if not x.size:
            return {"mean": float("nan"), "p99": float("nan")}
        return {"mean": float(x.mean()), "p99": float(np.percentile(x, 99))}

    return {
        "disaggregated_requests": int(crossed.sum()),
        "kv_transfers": int(moved.sum()),
        "kv_bytes_moved": int(requests.kv_transfer_bytes.to_numpy()[moved].sum()),
        "decode_admission_wait": stats(waited),
        "kv_transfer_time": stats(took),
    }


def fleet_summary(fleet: dict[str, Any], requests: pd.DataFrame) -> dict[str, Any]:
    """An elastic fleet's run (the runner's `fleet` info): GPU-seconds held, the replicas over
    time as [time, ready, loading, draining] after each change, the most ready at once, and the
    requests that arrived while the autoscaler wanted more replicas than were ready."""
    state: dict[int, str] = {}
    series: list[list[float]] = []
    for t, replica, s in fleet["changes"]:
        state[int(replica)] = str(s)
        counts = [sum(v == k for v in state.values()) for k in ("ready", "loading", "draining")]
        if series and series[-1][0] == t:
            series[-1] = [t, *counts]
        else:
            series.append([t, *counts])
    short = requests["under_provisioned"].to_numpy(dtype=bool)
    return {
        "gpu_seconds": float(fleet["gpu_seconds"]),
        "max_ready": int(max((row[1] for row in series), default=0)),
        "replicas_over_time": series,
        "under_provisioned_requests": int(short.sum()),
        "under_provisioned_completed": int((short & (requests["status"] == "completed")).sum()),
    }
