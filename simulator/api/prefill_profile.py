"""Profiling the simulated engine's prefill times, the input of the prefill-time curve.

Etalon profiles a serving system with one request at a time at prompt lengths 256 ... 16384 and
keeps the minimum TTFT per length. Here the system is the simulated engine: each profiled request
runs alone (arrivals spaced so that the previous one has finished) with one output token, so its
TTFT is exactly its prefill. The engine's limits are raised for the profile only, so that no
length is refused. The simulator is deterministic: one repetition per length is the minimum.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from cost_models.base import StepCostModel
from policies.fcfs import FCFS
from simulator.core.errors import ConfigError
from simulator.engines import SLoRAConfig, simulate
from simulator.engines.step_model import EngineConfig
from traces.schema import Trace

PROFILE_LENGTHS = tuple(256 * 2**k for k in range(7))  # 256, 512, ..., 16384


def profile_prefill(
    cost_model: StepCostModel,
    engine: EngineConfig | None = None,
    lengths: Sequence[int] = PROFILE_LENGTHS,
) -> pd.DataFrame:
    """TTFT of lone requests at each prompt length (columns prompt_len, ttft)."""
    lengths = sorted({int(p) for p in lengths})
    if not lengths or lengths[0] < 1:
        raise ConfigError(f"profile lengths must be integers >= 1; got {lengths}")
    biggest = lengths[-1]
    spacing = 2.0 * float(cost_model.prefill_time(np.array([biggest]))) + 1.0
    trace = Trace.from_columns(
        client=["profile"] * len(lengths),
        arrival=np.arange(len(lengths)) * spacing,
        prompt_len=lengths,
        output_len=np.ones(len(lengths), dtype=np.int64),
        source="prefill profile",
    )
    lone = (engine or SLoRAConfig()).for_lone_requests(biggest, cost_model)
    timeline = simulate(trace, FCFS(), cost_model, lone)
    return pd.DataFrame(
        {"prompt_len": trace.prompt_len, "ttft": timeline.first_token_at - timeline.arrival}
    )
