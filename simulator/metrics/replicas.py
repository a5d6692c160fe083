"""Metrics of the vLLM-style engine and of clusters: preemptions, prefix-cache hits, per replica.

Pure functions of the run folder's tables: requests.parquet and steps.parquet carry `replica`
(and steps `preempted`) for every engine; requests.parquet has `preemptions`, `cached_tokens`
and `recompute_avoided_tokens` under engine=vllm.
"""

from __future__ import annotations

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
    return {
        "preemptions": int(g.preemptions.sum()),
        "preempted_requests": int((g.preemptions > 0).sum()),
        "cached_prompt_tokens": cached,
        "prefix_hit_rate": cached / prompt if prompt else 0.0,
        "recompute_avoided_tokens": int(g.recompute_avoided_tokens.sum()),
    }


def per_replica(
    requests: pd.DataFrame, tokens: pd.DataFrame, steps: pd.DataFrame, pool_tokens: int
) -> list[dict[str, Any]]:
    """One record per replica: requests it ran, completions, output tokens, token throughput
    (prompt + output of its completed requests over its last finish), TTFT mean and p99,
    preemptions (0 for an engine that never preempts), KV utilisation. Requests never admitted
    under a shared queue have replica -1 and are left out."""
    out = []
    emitted = tokens["request_id"].value_counts()  # output tokens per request
    emitted_on = requests.set_index("request_id").replica.reindex(emitted.index).to_numpy()
    for rep in sorted(int(r) for r in steps.replica.unique()):
        r = requests[requests.replica == rep]
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
                "kv_utilisation": latency.kv_utilisation(steps[steps.replica == rep], pool_tokens),
                "steps": int((steps.replica == rep).sum()),
            }
        )
    return out
