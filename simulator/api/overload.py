"""Warn before a run whose trace offers far more load than the engine can serve.

Such a run is legitimate (an overload experiment) but often a slip, e.g. `rate_scale=1e6`: its
queues grow for the whole run, and so do its time and memory. The engine's capacity is measured,
not guessed: a sample of the trace's requests (their own lengths) all arrive at once on one
replica under FCFS, and the requests completed per second of that saturated run, times the
replicas, is what the engine sustains for this mix.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cost_models.base import StepCostModel
from policies import FCFS
from simulator.engines import simulate
from simulator.engines.step_model import EngineConfig
from traces.schema import Trace

SAMPLE = 300  # requests in the saturated probe: a few hundredths of a second to simulate
FACTOR = 10.0  # warn when the trace offers more than this many times the capacity


def saturated_rate(trace: Trace, cost: StepCostModel, engine: EngineConfig) -> float | None:
    """Requests per second one replica completes when a sample of the trace's requests (those
    it can ever serve) all wait from time 0; None when none can be served."""
    servable = np.flatnonzero(np.array([r is None for r in engine.refusals(trace, cost)]))
    if servable.size == 0:
        return None
    rng = np.random.default_rng(0)
    rows = np.sort(rng.choice(servable, min(SAMPLE, servable.size), replace=False))
    sample = Trace.from_columns(
        client=["sample"] * rows.size,
        arrival=np.zeros(rows.size),
        prompt_len=trace.prompt_len[rows],
        output_len=trace.output_len[rows],
        source="saturated sample",
    )
    unbounded = dataclasses.replace(engine, horizon=None)  # type: ignore[type-var]
    end = float(simulate(sample, FCFS(), cost, unbounded).info["end_time"])  # type: ignore[arg-type]
    return rows.size / end if end > 0 else None


def overload_warning(
    trace: Trace, cost: StepCostModel, engine: EngineConfig, replicas: int = 1
) -> str | None:
    """One line when the trace's arrival rate is more than FACTOR times the engine's capacity
    (open-loop traces only: a closed loop's rate follows the engine)."""
    if trace.think_time is not None or len(trace) < 2:
        return None
    span = float(trace.arrival.max() - trace.arrival.min())
    if span <= 0:
        return None
    offered = len(trace) / span
    capacity = saturated_rate(trace, cost, engine)
    if capacity is None or offered <= FACTOR * capacity * replicas:
        return None
    return (
        f"fairsim: warning: the trace offers {offered:.3g} requests/s, "
        f"{offered / (capacity * replicas):.0f}x what the engine serves "
        f"(~{capacity * replicas:.3g} requests/s, measured on a saturated sample of the trace): "
        "queues grow for the whole run, and so do its time and memory"
    )
