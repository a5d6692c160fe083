"""The run folder: the public output contract (documented in docs/outputs.md).

`write_run` writes requests.parquet, tokens.parquet, steps.parquet and summary.json;
`load_run` reads them back into a `RunOutputs`, so notebooks and later analyses never need the
simulator's internals.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from simulator.core.requests import STATUSES
from simulator.core.timeline import Timeline
from simulator.metrics import interactions, latency, replicas
from simulator.metrics.fairness import fairness_summary, tick_span

FILES = ("requests.parquet", "tokens.parquet", "steps.parquet", "summary.json")


@dataclass(frozen=True)
class RunOutputs:
    requests: pd.DataFrame
    tokens: pd.DataFrame
    steps: pd.DataFrame
    summary: dict[str, Any]
    counters: pd.DataFrame | None = None  # counters.parquet, for policies with counters


def config_digest(config: dict[str, Any]) -> str:
    """A stable hash of the resolved configuration (sorted-key JSON)."""
    blob = json.dumps(config, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def summarize(
    timeline: Timeline,
    requests: pd.DataFrame,
    tokens: pd.DataFrame,
    steps: pd.DataFrame,
    config: dict[str, Any],
) -> dict[str, Any]:
    counts = requests.status.value_counts()
    throttled = interactions.throttling(requests)
    extra: dict[str, Any] = {}
    if "interaction_id" in requests or "app" in requests:
        end = float(timeline.info.get("end_time") or 0.0)  # type: ignore[arg-type]
        extra["interactions"] = {
            **throttled,
            **interactions.user_experience(requests),
            "per_app": interactions.per_app(requests, max(end, 1e-9)).to_dict("records"),
            "interaction_latency": interactions.interaction_latency(requests),
        }
    if "preemptions" in requests:  # engine=vllm
        extra["vllm"] = replicas.engine_counts(requests)
    extra["replicas"] = replicas.per_replica(requests, tokens, steps, timeline.pool_tokens)
    reasons = (
        requests[requests.status != "completed"].groupby(["status", "reason"], observed=True).size()
    )
    return json_safe(
        {
            "config_digest": config_digest(config),
            "config": config,
            "requests": len(requests),
            "status_counts": {s: int(counts.get(s, 0)) for s in STATUSES},
            "reasons": {f"{s}:{r}": int(v) for (s, r), v in reasons.items()},
            "throttled_requests": throttled["throttled_requests"],
            "throttled_interactions": throttled["throttled_interactions"],
            "wasted_tokens": throttled["wasted_tokens"],
            "throughput_tokens_per_s": latency.token_throughput(requests),
            "output_tokens": len(tokens),
            "end_time": timeline.info.get("end_time"),
            "steps": len(steps),
            "kv_utilisation": latency.kv_utilisation(steps, timeline.pool_tokens),
            "pool_tokens": timeline.pool_tokens,
            "latency": latency.latency_summary(requests, tokens),
            "fairness": fairness_summary(
                requests, tokens, total=tick_span(timeline.info.get("end_time"))
            ),
            **extra,
        }
    )


def write_run(
    timeline: Timeline, folder: str | Path, config: dict[str, Any] | None = None
) -> RunOutputs:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    requests = timeline.requests_frame()
    tokens = timeline.tokens_frame()
    steps = timeline.steps_frame()
    summary = summarize(timeline, requests, tokens, steps, config or {})
    requests.to_parquet(folder / "requests.parquet", index=False)
    tokens.to_parquet(folder / "tokens.parquet", index=False)
    steps.to_parquet(folder / "steps.parquet", index=False)
    if timeline.counters is not None:
        timeline.counters.to_parquet(folder / "counters.parquet", index=False)
    (folder / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")
    return RunOutputs(requests, tokens, steps, summary, timeline.counters)


def load_run(folder: str | Path) -> RunOutputs:
    folder = Path(folder)
    missing = [f for f in FILES if not (folder / f).exists()]
    if missing:
        raise FileNotFoundError(f"{folder}: not a fairsim run folder (missing {missing})")
    return RunOutputs(
        requests=pd.read_parquet(folder / "requests.parquet"),
        tokens=pd.read_parquet(folder / "tokens.parquet"),
        steps=pd.read_parquet(folder / "steps.parquet"),
        summary=json.loads((folder / "summary.json").read_text()),
        counters=(
            pd.read_parquet(folder / "counters.parquet")
            if (folder / "counters.parquet").exists()
            else None
        ),
    )


def json_safe(value: Any) -> Any:
    """JSON-safe: NaN/inf become null (strict JSON has no NaN)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
