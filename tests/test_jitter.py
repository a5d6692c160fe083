"""Step-time jitter (simulator/engines/jitter.py): factors with mean 1 and the configured CV,
indexed by step so that a run of steps and single steps draw the same ones, from a stream of
their own (the workload never changes), and none at all when the CV is 0; a run speed: one
factor per replica for every step of its run. Fast-forward against
stepping with jitter is also checked by the engines' property tests."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import a10g_cost, random_trace
from policies import FCFS
from simulator.engines import SLoRAConfig, VLLMConfig, simulate
from simulator.engines.jitter import BLOCK, StepJitter, step_jitter
from traces import Trace


def test_factors_have_mean_one_and_the_configured_cv():
    f = StepJitter(0.25, seed=7, replica=0).factors(0, 50 * BLOCK)
    assert f.mean() == pytest.approx(1.0, abs=0.005)
    assert f.std() / f.mean() == pytest.approx(0.25, rel=0.02)
    assert (f > 0).all()


def test_a_run_of_factors_equals_the_factors_one_by_one_across_blocks():
    a, b = StepJitter(0.3, seed=1, replica=2), StepJitter(0.3, seed=1, replica=2)
    first = BLOCK - 5
    run = a.factors(first, 2 * BLOCK + 10)
    single = [b.factor(k) for k in range(first + 2 * BLOCK + 9, first - 1, -1)][::-1]  # backwards
    np.testing.assert_array_equal(run, single)
    other = StepJitter(0.3, seed=1, replica=3).factors(first, 10)
    assert not np.array_equal(run[:10], other), "each replica has its own stream"


def test_zero_cvs_take_no_factor():
    assert step_jitter(0.0, 0, 0) is None
    assert step_jitter(0.0, 0, 0, run_cv=0.0) is None


@pytest.mark.parametrize(
    "engine", [SLoRAConfig(), VLLMConfig(pool_tokens=20_000)], ids=["slora", "vllm"]
)
def test_jitter_changes_step_times_not_the_workload_and_its_seed_alone_decides(engine):
    from dataclasses import replace

    tr = random_trace(3, 150, 3, 300, 120, 4.0)
    cost = a10g_cost()
    exact = simulate(tr, FCFS(), cost, engine)
    noisy = simulate(tr, FCFS(), cost, replace(engine, step_jitter_cv=0.2))
    again = simulate(tr, FCFS(), cost, replace(engine, step_jitter_cv=0.2))
    reseeded = simulate(tr, FCFS(), cost, replace(engine, step_jitter_cv=0.2, step_jitter_seed=1))
    np.testing.assert_array_equal(noisy.arrival, exact.arrival)  # the workload is untouched
    assert int(noisy.generated.sum()) == int(exact.generated.sum())
    np.testing.assert_array_equal(noisy.finished_at, again.finished_at)  # deterministic
    assert not np.array_equal(noisy.finished_at, exact.finished_at)
    assert not np.array_equal(noisy.finished_at, reseeded.finished_at)


@pytest.mark.parametrize(
    "engine", [SLoRAConfig(), VLLMConfig(pool_tokens=20_000)], ids=["slora", "vllm"]
)
def test_each_step_takes_its_exact_time_times_its_factor(engine):
    from dataclasses import replace

    tr = Trace.from_columns(client=["a"], arrival=[0.0], prompt_len=[100], output_len=[3000])
    exact = simulate(tr, FCFS(), a10g_cost(), engine)
    noisy = simulate(tr, FCFS(), a10g_cost(), replace(engine, step_jitter_cv=0.2))
    durations = {n: t.steps["end"] - t.steps["start"] for n, t in (("e", exact), ("n", noisy))}
    assert durations["e"].shape == durations["n"].shape == (3000,)  # a prefill, 2999 decodes
    factors = StepJitter(0.2, seed=0, replica=0).factors(0, 3000)
    np.testing.assert_allclose(durations["n"], durations["e"] * factors, rtol=1e-9)


def test_bad_jitter_settings_name_the_key():
    with pytest.raises(ValueError, match="engine.step_jitter_cv must be a number >= 0"):
        SLoRAConfig(step_jitter_cv=-0.1)
    with pytest.raises(ValueError, match="engine.step_jitter_seed must be an integer >= 0"):
        VLLMConfig(step_jitter_seed=-1)
    with pytest.raises(ValueError, match="engine.run_speed_cv must be a number >= 0"):
        SLoRAConfig(run_speed_cv=float("nan"))


def test_a_run_speed_multiplies_every_step_of_a_replica_by_one_factor():
    steps = StepJitter(0.1, seed=3, replica=1).factors(0, 2 * BLOCK)
    sped = StepJitter(0.1, seed=3, replica=1, run_cv=0.05)
    g = sped.speed
    assert g != 1.0
    np.testing.assert_allclose(sped.factors(0, 2 * BLOCK), steps * g, rtol=1e-15)
    assert sped.factor(BLOCK + 7) == pytest.approx(steps[BLOCK + 7] * g, rel=1e-15)
    alone = step_jitter(0.0, 3, 1, run_cv=0.05)  # no step noise: the speed alone
    assert alone is not None
    np.testing.assert_array_equal(alone.factors(0, 10), np.full(10, g))


def test_run_speeds_have_mean_one_and_the_configured_cv_across_seeds_and_replicas():
    from simulator.engines.jitter import run_speed

    g = np.array([run_speed(0.05, seed, replica) for seed in range(400) for replica in range(5)])
    assert g.mean() == pytest.approx(1.0, abs=0.004)
    assert g.std() / g.mean() == pytest.approx(0.05, rel=0.06)
    assert run_speed(0.0, 7, 0) == 1.0
    assert run_speed(0.05, 7, 0) == run_speed(0.05, 7, 0)  # the seed alone decides


def test_a_zero_run_speed_cv_leaves_the_step_factors_bit_for_bit():
    a = StepJitter(0.2, seed=5, replica=0).factors(0, 100)
    b = StepJitter(0.2, seed=5, replica=0, run_cv=0.0).factors(0, 100)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "engine", [SLoRAConfig(), VLLMConfig(pool_tokens=20_000)], ids=["slora", "vllm"]
)
def test_a_run_speed_alone_scales_every_step_time_of_the_run(engine):
    from dataclasses import replace

    from simulator.engines.jitter import run_speed

    tr = Trace.from_columns(client=["a"], arrival=[0.0], prompt_len=[100], output_len=[500])
    exact = simulate(tr, FCFS(), a10g_cost(), engine)
    slow = simulate(tr, FCFS(), a10g_cost(), replace(engine, run_speed_cv=0.1, step_jitter_seed=4))
    g = run_speed(0.1, 4, 0)
    durations = {n: t.steps["end"] - t.steps["start"] for n, t in (("e", exact), ("s", slow))}
    np.testing.assert_allclose(durations["s"], durations["e"] * g, rtol=1e-9)
