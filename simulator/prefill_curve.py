"""The prefill-time curve behind fluidity's first-token deadline (metrics.md section 2).

Etalon profiles the serving system with one request at a time at prompt lengths 256 ... 16384,
takes the minimum TTFT per length, and fits a curve. Here the "system" is the simulated engine:
each profiled request runs alone (arrivals spaced so that the previous one has finished) with one
output token, so its TTFT is exactly one prefill step. The engine's prefill budget and KV pool are
raised to the largest profiled length for the profile only, so that no length is refused.
The simulator is deterministic, so one repetition per length is the minimum of any number.

Fit: least squares of TTFT on [1, P, P^2] (Etalon uses a random forest on [P, P^2]); the curve is
flat outside the profiled range, as Etalon's is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from cost_models.base import StepCostModel
from policies.fcfs import FCFS
from simulator.cluster import simulate_cluster
from simulator.engine import SLoRAConfig, SLoRAEngine
from simulator.vllm import VLLMConfig
from traces.schema import Trace

PROFILE_LENGTHS = tuple(256 * 2**k for k in range(7))  # 256, 512, ..., 16384


@dataclass(frozen=True)
class PrefillCurve:
    """Predicted prefill seconds c0 + c1 P + c2 P^2, with P clipped to the profiled range."""

    coefficients: tuple[float, float, float]
    min_prompt: int
    max_prompt: int

    def __call__(self, prompt_lens: np.ndarray | Sequence[int]) -> np.ndarray:
        p = np.clip(np.asarray(prompt_lens, dtype=np.float64), self.min_prompt, self.max_prompt)
        c0, c1, c2 = self.coefficients
        return c0 + p * (c1 + p * c2)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def profile_prefill(
    cost_model: StepCostModel,
    engine: SLoRAConfig | VLLMConfig | None = None,
    lengths: Sequence[int] = PROFILE_LENGTHS,
) -> pd.DataFrame:
    """TTFT of lone requests at each prompt length (columns prompt_len, ttft)."""
    lengths = sorted({int(p) for p in lengths})
    if not lengths or lengths[0] < 1:
        raise ValueError(f"profile lengths must be integers >= 1; got {lengths}")
    biggest = lengths[-1]
    spacing = 2.0 * float(cost_model.prefill_time(np.array([biggest]))) + 1.0
    trace = Trace.from_columns(
        client=["profile"] * len(lengths),
        arrival=np.arange(len(lengths)) * spacing,
        prompt_len=lengths,
        output_len=np.ones(len(lengths), dtype=np.int64),
        source="prefill profile",
    )
    if isinstance(engine, VLLMConfig):  # chunked as the engine chunks, in a pool that fits
        blocks = engine.num_blocks(cost_model)
        pool = max(blocks, -(-(biggest + 1) // engine.block_size)) * engine.block_size
        lone = dataclasses.replace(engine, pool_tokens=pool, horizon=None)
        timeline = simulate_cluster(trace, FCFS(), cost_model, lone)
    else:
        base = engine or SLoRAConfig()
        isolated = dataclasses.replace(
            base,
            batch_max_tokens=max(base.batch_max_tokens, biggest),
            pool_tokens=max(base.pool_tokens, biggest + 2 + base.reserve_per_client),
            horizon=None,
        )
        timeline = SLoRAEngine(trace, FCFS(), cost_model, isolated).run()
    return pd.DataFrame(
        {"prompt_len": trace.prompt_len, "ttft": timeline.first_token_at - timeline.arrival}
    )


def fit_prefill_curve(profile: pd.DataFrame) -> PrefillCurve:
    """Least-squares quadratic through the minimum TTFT per profiled prompt length."""
    best = profile.groupby("prompt_len", sort=True)["ttft"].min()
    if len(best) < 3 or best.isna().any():
        raise ValueError(
            f"a prefill curve needs the TTFT of at least 3 distinct prompt lengths; got {len(best)}"
        )
    p = best.index.to_numpy(dtype=np.float64)
    c2, c1, c0 = np.polyfit(p, best.to_numpy(), 2)
    return PrefillCurve((float(c0), float(c1), float(c2)), int(p.min()), int(p.max()))
