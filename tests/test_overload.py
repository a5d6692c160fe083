"""The overload warning (simulator/api/overload.py): the engine's capacity is measured on a
saturated sample of the trace, and a trace offering more than ten times it gets one line."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import a10g_cost, random_trace
from policies import FCFS
from simulator.api.overload import FACTOR, overload_warning, saturated_rate
from simulator.engines import SLoRAConfig, VLLMConfig, simulate
from traces import Trace


def test_the_saturated_rate_is_what_the_engine_completes_when_everything_waits():
    trace = random_trace(1, 200, 2, 300, 100, 5.0)
    rate = saturated_rate(trace, a10g_cost(), SLoRAConfig())
    # independently: every request of the trace waiting at once (the sample is all 200 here)
    waiting = Trace.from_columns(
        client=["x"] * 200, arrival=np.zeros(200), prompt_len=trace.prompt_len,
        output_len=trace.output_len,
    )  # fmt: skip
    end = simulate(waiting, FCFS(), a10g_cost(), SLoRAConfig()).info["end_time"]
    assert rate == pytest.approx(200 / end)


@pytest.mark.parametrize("engine", [SLoRAConfig(), VLLMConfig(pool_tokens=20_000)])
def test_a_trace_far_above_capacity_is_warned_about_and_one_below_is_not(engine):
    cost = a10g_cost()
    base = random_trace(2, 400, 2, 300, 100, 1.0)
    capacity = saturated_rate(base, cost, engine)
    assert capacity is not None
    calm = Trace.from_columns(
        client=[base.client_names[c] for c in base.client], arrival=np.arange(400) / capacity,
        prompt_len=base.prompt_len, output_len=base.output_len,
    )  # fmt: skip
    assert overload_warning(calm, cost, engine) is None
    names = [base.client_names[c] for c in base.client]
    flood = Trace.from_columns(
        client=names, arrival=np.arange(400) / (3 * FACTOR * capacity),
        prompt_len=base.prompt_len, output_len=base.output_len,
    )  # fmt: skip
    line = overload_warning(flood, cost, engine)
    assert line is not None and line.startswith("fairsim: warning:") and "30x" in line
    assert "15x" in (overload_warning(flood, cost, engine, replicas=2) or "")
    assert overload_warning(flood, cost, engine, replicas=4) is None, "replicas add capacity"
