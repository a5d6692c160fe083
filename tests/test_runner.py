"""The runner (simulator/engines/runner.py): online arrivals, the seam's verdicts, endings."""

import signal

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine import workloads

from conftest import a10g_cost, random_trace
from cost_models import ConstantStepCost
from policies import FCFS, VTC, FairServe
from policies.base import BasePolicy
from simulator.core.requests import COMPLETED, REJECTED
from simulator.core.seam import ADMIT, WAIT, Drop
from simulator.engines import ClusterConfig, Runner, SLoRAConfig, VLLMConfig, simulate
from simulator.engines.arrivals import first_arrivals
from simulator.engines.online import OnlineRunner
from traces import Trace

CONST = ConstantStepCost(prefill=0.1, decode=0.01)


def assert_same_timeline(a, b):
    for name in ("arrival", "status", "reason", "admitted_at", "first_token_at", "finished_at"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    np.testing.assert_array_equal(a.generated, b.generated)
    for key in a.steps:
        np.testing.assert_array_equal(a.steps[key], b.steps[key], err_msg=key)
    for x, y in zip(a.token_times(), b.token_times(), strict=True):
        np.testing.assert_array_equal(x, y)
    assert (a.counters is None) == (b.counters is None)
    if a.counters is not None:
        pd.testing.assert_frame_equal(a.counters, b.counters)


def pushed_in_chunks(tr, make_policy, engine, cluster, cuts):
    """Run `tr` by pushing its first arrivals chunk by chunk: rows arriving before each cut,
    then run_until(cut)."""
    runner = OnlineRunner(tr, make_policy(), a10g_cost(), engine, cluster)
    first = first_arrivals(tr)
    start = 0.0
    for cut in [*cuts, np.inf]:
        rows = first[(tr.arrival[first] >= start) & (tr.arrival[first] < cut)]
        runner.push(rows.tolist())
        if cut < np.inf:
            runner.run_until(cut)
        start = cut
    return runner.close()


engines = st.one_of(
    st.builds(
        SLoRAConfig,
        pool_tokens=st.sampled_from([700, 10_000]),
        max_wait_tokens=st.sampled_from([0, 10]),
        horizon=st.sampled_from([None, 4.0]),
    ),
    st.builds(
        VLLMConfig,
        pool_tokens=st.sampled_from([640, 100_000]),
        max_num_batched_tokens=st.sampled_from([32, 512]),
        horizon=st.sampled_from([None, 3.0]),
    ),
)
clusters = st.builds(
    ClusterConfig,
    replicas=st.integers(1, 3),
    dispatcher=st.sampled_from(["round_robin", "least_tokens", "global_vtc"]),
)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workloads,
    engines,
    clusters,
    st.lists(st.floats(0.0, 8.0), max_size=6).map(sorted),
    st.sampled_from([FCFS, VTC]),
)
def test_pushing_a_trace_in_chunks_gives_the_offline_timeline(tr, engine, cluster, cuts, make):
    if cluster.dispatcher == "global_vtc" and make is FCFS:
        cluster = ClusterConfig(cluster.replicas, "central")
    offline = simulate(tr, make(), a10g_cost(), engine, cluster)
    online = pushed_in_chunks(tr, make, engine, cluster, cuts)
    assert_same_timeline(offline, online)


def test_pushing_chained_calls_releases_them_as_offline():
    tr = Trace.from_columns(
        client=["u", "u", "u", "v", "v"],
        arrival=[0.0, 0.0, 0.0, 0.05, 0.05],
        prompt_len=[30, 30, 30, 30, 30],
        output_len=[20, 20, 20, 20, 20],
        optional={"interaction_id": [1, 1, 1, 2, 2], "call_index": [0, 1, 2, 0, 1]},
        think_time=[0.0, 0.5, 0.5, 0.0, 0.2],
    )
    for engine in (SLoRAConfig(), VLLMConfig(pool_tokens=10_000)):
        for cluster in (ClusterConfig(1), ClusterConfig(2, "least_requests")):
            offline = simulate(tr, FCFS(), a10g_cost(), engine, cluster)
            online = pushed_in_chunks(tr, FCFS, engine, cluster, [0.01, 0.3, 0.7, 1.5])
            assert_same_timeline(offline, online)
            assert (online.status == COMPLETED).all()


def test_a_step_is_not_applied_before_the_frontier_passes_its_end():
    tr = Trace.from_columns(client=["a"], arrival=[0.0], prompt_len=[10], output_len=[50])
    runner = OnlineRunner(tr, FCFS(), CONST, SLoRAConfig())
    runner.push([0])
    runner.run_until(0.05)  # the prefill ends at 0.1
    assert np.isnan(runner.state.first_token_at[0])
    runner.run_until(0.345)  # prefill, then decode steps ending 0.11 ... 0.34
    assert runner.state.first_token_at[0] == pytest.approx(0.1)
    assert len(runner.replicas[0].steps) == 1 + 24
    tl = runner.close()
    assert tl.finished_at[0] == pytest.approx(0.1 + 49 * 0.01)


def test_bad_pushes_are_clear_errors():
    tr = Trace.from_columns(
        client=["u", "u"],
        arrival=[0.0, 0.0],
        prompt_len=[5, 5],
        output_len=[5, 5],
        optional={"interaction_id": [1, 1], "call_index": [0, 1]},
        think_time=[0.0, 1.0],
    )
    runner = OnlineRunner(tr, FCFS(), CONST, SLoRAConfig())
    runner.push([0], [1.0])
    with pytest.raises(ValueError, match="pushed before"):
        runner.push([0], [2.0])
    with pytest.raises(ValueError, match="not a first arrival"):
        runner.push([1], [2.0])
    with pytest.raises(ValueError, match="not a first arrival"):
        runner.push([7], [2.0])
    runner.run_until(3.0)
    with pytest.raises(ValueError, match="before the frontier"):
        runner.push([0], [2.5])
    with pytest.raises(ValueError, match="before the frontier"):
        runner.run_until(2.0)
    offline = Runner(tr, FCFS(), CONST, SLoRAConfig())
    assert not hasattr(offline, "push"), "only an OnlineRunner takes pushed arrivals"
    assert (
        offline.frontier == np.inf and OnlineRunner(tr, FCFS(), CONST, SLoRAConfig()).frontier == 0
    )


def test_rows_never_pushed_stay_not_arrived():
    tr = random_trace(seed=1, n=10, clients=2, max_prompt=50, max_output=20, rate=5.0)
    runner = OnlineRunner(tr, FCFS(), CONST, SLoRAConfig())
    runner.push([0, 1, 2])
    tl = runner.close()
    assert (tl.status[:3] == COMPLETED).all()
    assert set(tl.reason[3:].tolist()) == {"not_arrived"}


class Scripted(BasePolicy):
    """FCFS whose admission answers come from a script: {row: verdict}."""

    name = "scripted"

    def __init__(self, script):
        self.script = script

    def pick(self, queue, now):
        return queue.oldest()

    def admit(self, req, now, fits):
        verdict = self.script.get(req, ADMIT if fits else WAIT)
        return verdict


@pytest.mark.parametrize("engine", [SLoRAConfig(pool_tokens=1000), VLLMConfig(pool_tokens=1000)])
def test_drop_goes_on_picking_and_drop_stop_ends_the_batch(engine):
    # "a" runs; "b" and "c" arrive while it does and are picked in the same batch forming
    tr = Trace.from_columns(
        client=["a", "b", "c"], arrival=[0.0, 0.05, 0.05], prompt_len=[10] * 3, output_len=[50] * 3
    )
    go_on = simulate(tr, Scripted({1: Drop("dropped")}), CONST, engine)
    assert go_on.status.tolist() == [COMPLETED, REJECTED, COMPLETED]
    stop = simulate(tr, Scripted({1: Drop("throttled", stop=True)}), CONST, engine)
    assert stop.status.tolist() == [COMPLETED, REJECTED, COMPLETED]
    assert stop.reason[1] == "throttled"
    # after a plain drop "c" joins the same batch; after a stopping one, a later one
    assert go_on.admitted_at[2] < stop.admitted_at[2]


def test_a_policy_admitting_what_does_not_fit_is_an_internal_error():
    tr = Trace.from_columns(
        client=["a", "b"], arrival=[0.0, 0.0], prompt_len=[600, 600], output_len=[5, 5]
    )
    with pytest.raises(RuntimeError, match="admitted a request that does not fit"):
        simulate(tr, Scripted({1: ADMIT}), CONST, SLoRAConfig(pool_tokens=1000))


def test_vllm_run_past_the_horizon_with_an_arrival_after_it_ends():
    """A decode run may end after the horizon; an arrival between the horizon and that end is
    never delivered. The run used to wait for it forever under a policy charging output tokens
    (found while splitting the engine into runner and step model)."""
    tr = Trace.from_columns(
        client=["a", "b"], arrival=[0.0, 0.955], prompt_len=[10, 10], output_len=[200, 5]
    )
    cost = ConstantStepCost(prefill=0.1, decode=0.1)
    signal.alarm(20)  # a hang fails the test instead of the run
    try:
        tl = simulate(tr, VTC(), cost, VLLMConfig(pool_tokens=10_000, horizon=0.95))
    finally:
        signal.alarm(0)
    assert tl.reason.tolist() == ["running", "not_arrived"]
    assert tl.steps["start"].max() < 0.95 <= tl.steps["end"].max()


def test_fairserve_drops_and_throttles_through_the_seam_on_both_engines():
    """FairServe answers admit() with Drop for a throttled interaction's later calls, and with
    Drop(stop=True) when it throttles a blocked first call."""
    policy = FairServe(user_limit=1)
    tr = Trace.from_columns(
        client=["u"] * 4,
        arrival=[0.0, 0.1, 0.2, 0.3],
        prompt_len=[900, 900, 900, 900],
        output_len=[50] * 4,
        optional={"interaction_id": [0, 1, 1, 2], "call_index": [0, 0, 1, 0]},
    )
    policy.bind(tr)
    for req, t in ((0, 0.0), (1, 0.1), (2, 0.2)):
        policy.on_arrival(req, t, _Queue())
    assert policy.admit(1, 0.2, fits=False) == Drop("user_limit", stop=True)
    assert policy.admit(2, 0.2, fits=True) == Drop("interaction_throttled")
    assert policy.admit(0, 0.2, fits=True) is ADMIT
    for engine in (SLoRAConfig(pool_tokens=2000), VLLMConfig(pool_tokens=2000)):
        tl = simulate(tr, FairServe(user_limit=1), CONST, engine)
        assert set(tl.reason[tl.status == REJECTED]) <= {"user_limit", "interaction_throttled"}


class _Queue:
    """A queue in which nothing waits (for direct policy calls)."""

    last_left_client = None

    def has_waiting(self, client):
        return False

    def waiting_clients(self):
        return []
