"""The engine depends on its policy only through the seam's answers: a policy's picks,
admissions, victims and preemptions, recorded and given back in the same order by a policy that
does no work, make the same run. benchmarks/policy_overload.py --floor times that replay as the
engine's own cost of a policy's schedule."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from hydra.utils import instantiate
from test_policy_indexes import assert_same_decisions

from conftest import ROOT, a10g_cost
from simulator.api import build_trace, compose_config
from simulator.core.seam import Rescheduler
from simulator.engines import VLLMConfig, simulate

spec = importlib.util.spec_from_file_location(
    "policy_overload", ROOT / "benchmarks" / "policy_overload.py"
)
assert spec is not None and spec.loader is not None
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


@pytest.mark.parametrize("name", ["fcfs", "vtc", "dlpm", "andes"])
def test_a_policys_recorded_answers_replayed_at_no_cost_make_the_same_run(name):
    cfg = compose_config(
        ["workload=poisson_chat", "workload.duration=30", "workload.rate_scale=8", f"policy={name}"]
    )
    trace = build_trace(cfg)
    engine = VLLMConfig(pool_tokens=12_000, max_num_batched_tokens=2048)
    recorder = bench.Recorder(instantiate(cfg.policy, _convert_="all"))
    original = simulate(trace, recorder, a10g_cost(), engine)
    answers = recorder.answers
    assert len(answers) > len(trace)  # every arrival and every pick at least
    replayed = (
        bench.ReplayedRescheduler if isinstance(recorder.policy, Rescheduler) else bench.Replayed
    )
    again = simulate(trace, replayed(answers), a10g_cost(), engine)
    assert not answers  # every answer was asked for again, in order, and no other
    assert int(np.sum(original.steps["preempted"])) > 0  # the overload made the engine preempt
    assert_same_decisions(original, again)
