"""User-perceived quality of one run: fluidity, fluid token rate, Andes QoE, goodput and SLOs.

`QoEConfig` is the `qoe:` block of the config; `qoe_summary` is the `qoe` entry of summary.json;
`request_values` feeds the SLO evaluation (simulator/slo.py) and the capacity search.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from simulator.core.errors import ConfigError
from simulator.metrics import fluidity as etalon
from simulator.metrics import latency
from simulator.metrics.prefill_curve import PrefillCurve

FLUIDITY_PERCENTILES = (1, 10, 50)  # low percentiles: the requests that stream worst


@dataclass(frozen=True)
class QoEConfig:
    """Deadlines and parameters of the user-perceived metrics (defaults: Etalon's plain benchmark
    deadlines, Andes' parameters, no goodput limits)."""

    tbt_deadline: float = 0.05  # D_d, seconds per token
    ttft_deadline: float | None = 0.1  # D_p; null: profiled prefill curve + scheduling_slack
    scheduling_slack: float = 0.3  # added to the prefill curve when ttft_deadline is null
    exact: bool = False  # fluidity arithmetic: Etalon's floats (false) or integer nanoseconds
    expected_ttft: float = 1.0  # Andes: the TTFT a user expects, seconds
    reading_speed: float = 5.0  # Andes: tokens per second a user reads
    goodput_ttft: float | None = None  # vLLM goodput limits (seconds; null: no limit)
    goodput_tpot: float | None = None
    goodput_e2e: float | None = None

    def __post_init__(self) -> None:
        if not self.tbt_deadline > 0:
            raise ConfigError(f"qoe.tbt_deadline must be > 0 seconds, got {self.tbt_deadline!r}")
        for name in ("ttft_deadline", "goodput_ttft", "goodput_tpot", "goodput_e2e"):
            v = getattr(self, name)
            if v is not None and not v >= 0:
                raise ConfigError(f"qoe.{name} must be null or >= 0 seconds, got {v!r}")
        if self.scheduling_slack < 0 or self.expected_ttft < 0 or not self.reading_speed > 0:
            raise ConfigError(
                "qoe.scheduling_slack and qoe.expected_ttft must be >= 0 and qoe.reading_speed > 0"
            )


def request_fluidity(
    requests: pd.DataFrame, tokens: pd.DataFrame, cfg: QoEConfig, curve: PrefillCurve | None
) -> pd.DataFrame:
    if cfg.ttft_deadline is None and curve is None:
        raise ConfigError("qoe.ttft_deadline is null: a prefill curve is needed for D_p")
    return latency.request_fluidity(
        requests,
        tokens,
        ttft_deadline=cfg.ttft_deadline,
        tbt_deadline=cfg.tbt_deadline,
        exact=cfg.exact,
        prefill_curve=curve if cfg.ttft_deadline is None else None,
        scheduling_slack=cfg.scheduling_slack,
    )


def request_values(
    requests: pd.DataFrame,
    tokens: pd.DataFrame,
    cfg: QoEConfig,
    curve: PrefillCurve | None = None,
    fluidity: pd.DataFrame | None = None,
) -> dict[str, np.ndarray]:
    """Request-level values of every SLO metric (completed requests; `tbc` pools the gaps).
    `fluidity`: `request_fluidity` of these tables, when the caller has it already."""
    done = requests[requests.status == "completed"]
    done_tokens = latency.tokens_of(tokens, done.request_id)
    lat = latency.per_request_latency(done, done_tokens, "veeksha")
    flu = request_fluidity(done, done_tokens, cfg, curve) if fluidity is None else fluidity
    return {
        "ttfc": lat.ttft.to_numpy(),
        "tbc": latency.tbt_values(done_tokens),
        "tpot": lat.tpot.to_numpy(),
        "e2e": lat.e2e.to_numpy(),
        "normalized_e2e": lat.normalized_e2e.to_numpy(),
        "fluidity": flu.fluidity.to_numpy(),
        "miss_rate": flu.miss_rate.to_numpy(),
    }


def _fluidity_stats(values: np.ndarray) -> dict[str, float | None]:
    out: dict[str, float | None] = {
        "requests": int(values.size),
        "mean": float(values.mean()) if values.size else None,
    }
    for p in FLUIDITY_PERCENTILES:
        out[f"p{p}"] = float(np.percentile(values, p)) if values.size else None
    return out


def qoe_summary(
    requests: pd.DataFrame,
    tokens: pd.DataFrame,
    cfg: QoEConfig,
    curve: PrefillCurve | None = None,
    fluidity: pd.DataFrame | None = None,
    decode_gaps: etalon.Ragged | None = None,
) -> dict[str, Any]:
    """The `qoe` block of summary.json (completed requests). `fluidity` (`request_fluidity`)
    and `decode_gaps` (`inter_token_gaps`' gaps less each first): pass them if already made."""
    flu = request_fluidity(requests, tokens, cfg, curve) if fluidity is None else fluidity
    if decode_gaps is None:
        gaps = latency.inter_token_gaps(requests, tokens)[1]
        decode_gaps = gaps.drop_first()
        del gaps  # one request-length copy of the gaps at a time (the fluid rate's peak memory)
    done = requests[requests.status == "completed"]
    andes = latency.andes_qoe(
        requests, latency.tokens_of(tokens, done.request_id), cfg.expected_ttft, cfg.reading_speed
    )
    limits = (cfg.goodput_ttft, cfg.goodput_tpot, cfg.goodput_e2e)
    good = (
        latency.goodput(requests, tokens, *limits) if any(v is not None for v in limits) else None
    )
    rate = etalon.fluid_token_rate(decode_gaps, cfg.exact)
    return qoe_block(cfg, curve, flu, rate, andes.to_numpy(), good)


def qoe_block(
    cfg: QoEConfig,
    curve: PrefillCurve | None,
    fluidity: pd.DataFrame,
    fluid_token_rate: float,
    andes: np.ndarray,
    goodput: float | None,
) -> dict[str, Any]:
    """`qoe_summary` from its parts: the `request_fluidity` table, the fluid token rate, the
    Andes QoE of each completed request and the goodput (None: no goodput limit given)."""
    per_client = {
        str(c): {
            **_fluidity_stats(g.fluidity.to_numpy()),
            "miss_rate": etalon.service_miss_rate(g.missed.to_numpy(), g.total.to_numpy()),
        }
        for c, g in fluidity.groupby("client", observed=True, sort=True)
    }
    missed, total = fluidity.missed.to_numpy(), fluidity.total.to_numpy()
    return {
        "deadlines": {
            "tbt": cfg.tbt_deadline,
            "ttft": cfg.ttft_deadline
            if cfg.ttft_deadline is not None
            else {
                "prefill_curve": curve.to_dict() if curve else None,
                "scheduling_slack": cfg.scheduling_slack,
            },
            "arithmetic": "exact (integer ns)" if cfg.exact else "etalon float",
        },
        "fluidity": _fluidity_stats(fluidity.fluidity.to_numpy()),
        "service_miss_rate": etalon.service_miss_rate(missed, total),
        "fluid_token_rate": fluid_token_rate,
        "fluidity_per_client": per_client,
        "andes_qoe": {
            "mean": float(andes.mean()) if len(andes) else None,
            "p10": float(np.percentile(andes, 10)) if len(andes) else None,
        },
        "goodput_requests_per_s": goodput,
    }
