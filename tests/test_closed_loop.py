"""Chained traces and closed-loop users: the schema's chains, the ClosedLoop generator, and the
engine sending each follow-up when its predecessor ends (checked against the rules and against
what a lone request must see)."""

import numpy as np
import pandas as pd
import pytest

from cost_models import LinearStepCost
from policies.fcfs import FCFS
from policies.rpm import RPM
from simulator.core.queue import WaitingQueue
from simulator.engines import SLoRAConfig, simulate
from traces import ClientSpec, ClosedLoop, Poisson, SyntheticWorkload, Trace, UniformInt
from traces.schema import TraceError

COST = LinearStepCost(
    prefill_per_token=2e-4,
    prefill_per_request=4e-4,
    decode_base=0.016,
    decode_per_seq=2.5e-4,
    decode_per_context_token=2e-6,
    step_overhead=0.004,
)


def chat(rates=(1.0,), **kw):
    clients = [
        ClientSpec(f"c{i}", Poisson(r), UniformInt(20, 400), UniformInt(5, 120))
        for i, r in enumerate(rates)
    ]
    return SyntheticWorkload(clients, duration=100.0, **kw)


def chained_trace(think, prompt=(10, 10, 10), output=(5, 5, 5), **kw):
    """Interaction 0 has calls 0 and 1; interaction 1 has one call at t = 0.5."""
    return Trace.from_columns(
        client=["a", "a", "b"],
        arrival=[0.0, 0.0, 0.5],
        prompt_len=list(prompt),
        output_len=list(output),
        optional={"interaction_id": [0, 0, 1], "call_index": [0, 1, 0]},
        think_time=think,
        **kw,
    )


def in_system(requests):
    """Requests arrived but not yet ended, sampled at every arrival."""
    arr = requests.arrival.to_numpy()
    end = np.where(requests.status == "completed", requests.finished_at, requests.arrival).astype(
        float
    )
    return np.array([((arr <= t) & (end > t)).sum() for t in arr])


# ---- the schema -------------------------------------------------------------------------------
def test_predecessor_links_each_call_to_the_previous_call_of_its_interaction():
    t = Trace.from_columns(
        client=["a"] * 5,
        arrival=[0, 0, 0, 1, 1],
        prompt_len=[1] * 5,
        output_len=[1] * 5,
        optional={"interaction_id": [7, 3, 7, 3, 7], "call_index": [2, 0, 0, 1, 1]},
        think_time=[0.0] * 5,
    )
    # rows sort by (arrival, id): (7,2) (3,0) (7,0) (3,1) (7,1)
    assert t.predecessor().tolist() == [4, -1, -1, 1, 2]
    assert t.chained and not t.open_loop().chained
    assert t.open_loop().predecessor().tolist() == [-1] * 5


def test_chain_errors_name_the_row_and_field():
    with pytest.raises(TraceError, match="field 'interaction_id'.*'think_time'"):
        Trace.from_columns(
            client=["a"], arrival=[0], prompt_len=[1], output_len=[1], think_time=[0.0]
        )
    with pytest.raises(TraceError, match=r"row 1, field 'call_index': got 2.*expected 1"):
        Trace.from_columns(
            client=["a", "a"],
            arrival=[0, 0],
            prompt_len=[1, 1],
            output_len=[1, 1],
            optional={"interaction_id": [0, 0], "call_index": [0, 2]},
            think_time=[0.0, 0.0],
        )
    with pytest.raises(TraceError, match=r"row 2, field 'think_time': got -1.0"):
        chained_trace([0.0, 0.0, -1.0])


def test_queue_order_is_arrival_order_not_row_order():
    q = WaitingQueue([0, 1, 0, 1, 0, 1])
    for req in (5, 2, 4):
        q.push(req)
    assert q.oldest() == 5
    q.remove(5)
    assert q.oldest() == 2 and q.head(0) == 2


# ---- the generator ----------------------------------------------------------------------------
def test_users_are_shared_out_in_proportion_to_client_rates():
    assert ClosedLoop(chat((1.0, 3.0)), 8, 100).users_per_client().tolist() == [2, 6]
    assert ClosedLoop(chat((1.0, 1.0, 1.0)), 4, 100).users_per_client().tolist() == [2, 1, 1]
    assert ClosedLoop(chat((1.0, 3.0)), 1, 10).users_per_client().tolist() == [0, 1]


def test_closed_loop_trace_splits_requests_over_users_and_is_seeded():
    cl = ClosedLoop(chat((1.0, 3.0)), users=3, num_requests=10, think_time=0.5)
    t = cl.build(4)
    assert len(t) == 10 and t.chained
    assert np.bincount(t.interaction_id).tolist() == [4, 3, 3]
    first = t.call_index == 0
    assert np.all(t.think_time[first] == 0) and np.all(t.think_time[~first] == 0.5)
    again = cl.build(4)
    assert np.array_equal(t.prompt_len, again.prompt_len)
    assert np.array_equal(t.output_len, again.output_len)
    assert not np.array_equal(t.prompt_len, cl.build(5).prompt_len)
    # adding a user keeps the first users' lengths (one seed stream per user)
    more = ClosedLoop(chat((1.0, 3.0)), users=4, num_requests=10, think_time=0.5).build(4)
    user0 = (t.interaction_id == 0) & (t.call_index < 3)
    user0_more = (more.interaction_id == 0) & (more.call_index < 3)
    assert np.array_equal(t.prompt_len[user0], more.prompt_len[user0_more])


def test_exponential_think_times_have_the_configured_mean():
    cl = ClosedLoop(chat(), users=4, num_requests=8000, think_time=2.0, think="exponential")
    t = cl.build(0)
    gaps = t.think_time[t.call_index > 0]
    assert gaps.mean() == pytest.approx(2.0, rel=0.05)
    assert np.std(gaps) == pytest.approx(2.0, rel=0.05)  # exponential: sd = mean


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"users": 0}, "users must be an integer >= 1"),
        ({"num_requests": 2}, r"num_requests \(2\) must be >= users \(3\)"),
        ({"think_time": -1.0}, "think_time must be a number >= 0"),
        ({"think": "gamma"}, "think: got 'gamma'; accepted"),
    ],
)
def test_closed_loop_configuration_errors(kw, match):
    args = {"users": 3, "num_requests": 10, **kw}
    with pytest.raises(ValueError, match=match):
        ClosedLoop(chat(), **args)


# ---- the engine -------------------------------------------------------------------------------
def test_each_follow_up_arrives_think_time_after_its_predecessor_ends():
    cl = ClosedLoop(chat((1.0, 2.0)), users=6, num_requests=300, think_time=0.25)
    r = simulate(cl.build(1), FCFS(), COST, SLoRAConfig()).requests_frame()
    assert (r.status == "completed").all()
    r = r.sort_values(["interaction_id", "call_index"])
    previous_end = r.groupby("interaction_id").finished_at.shift(1)
    follow = r.call_index > 0
    assert np.array_equal(r.arrival[follow], previous_end[follow] + 0.25)
    assert np.all(r.arrival[~follow] == 0.0)
    assert in_system(r).max() <= 6


def test_without_think_time_the_population_stays_at_the_number_of_users():
    users = 5
    r = simulate(
        ClosedLoop(chat(), users, 200).build(2), FCFS(), COST, SLoRAConfig()
    ).requests_frame()
    counts = in_system(r)
    # every user has one request in the system until users start running out of requests
    last_first_exhausted = r.groupby("interaction_id").finished_at.max().min()
    assert np.all(counts[r.arrival.to_numpy() < last_first_exhausted] == users)


def test_one_user_is_served_alone_so_ttft_is_the_prefill_time():
    """A single closed-loop user never queues: each request is prefilled the instant it arrives,
    its TTFT is exactly the cost model's prefill time, and each step decodes a batch of one."""
    trace = ClosedLoop(chat(), users=1, num_requests=40, think_time=0.1).build(3)
    tl = simulate(trace, FCFS(), COST, SLoRAConfig())
    r = tl.requests_frame()
    assert np.array_equal(r.admitted_at, r.arrival)
    expected = np.array([COST.prefill_time(np.array([p])) for p in r.prompt_len])
    assert np.allclose(r.first_token_at - r.arrival, expected, rtol=0, atol=1e-12)
    assert tl.steps["batch_size"].max() == 1


def test_rejected_and_refused_calls_release_their_successors():
    # a 60 s RPM limit of 1 rejects interaction 0's second call; its third call still comes
    t = Trace.from_columns(
        client=["a"] * 3,
        arrival=[0.0] * 3,
        prompt_len=[10, 10, 10],
        output_len=[5, 5, 5],
        optional={"interaction_id": [0, 0, 0], "call_index": [0, 1, 2]},
        think_time=[0.0, 1.0, 2.0],
    )
    r = simulate(t, RPM(limit=1), COST, SLoRAConfig()).requests_frame()
    assert r.status.tolist() == ["completed", "rejected", "rejected"]
    assert r.arrival[1] == r.finished_at[0] + 1.0 and r.arrival[2] == r.arrival[1] + 2.0
    # a prompt that can never fit is refused at its arrival; the next call follows it
    big = chained_trace([0.0, 0.5, 0.0], prompt=(5000, 10, 10))
    r = simulate(big, FCFS(), COST, SLoRAConfig(batch_max_tokens=3072)).requests_frame()
    assert r.status.tolist() == ["refused", "completed", "completed"]
    assert r.arrival[1] == 0.5


def test_calls_not_sent_by_the_horizon_are_accounted_as_in_flight():
    trace = ClosedLoop(chat(), users=2, num_requests=200).build(0)
    tl = simulate(trace, FCFS(), COST, SLoRAConfig(horizon=20.0))
    r = tl.requests_frame()
    never = r.arrival.isna()
    assert never.any() and (r.status[never] == "in_flight").all()
    assert (r.reason[never] == "not_arrived").all()
    assert (r.arrival.dropna() <= 20.0).all()
    assert r.status.value_counts().sum() == len(trace)


def test_closed_loop_runs_are_bit_identical_and_open_loop_replay_differs():
    trace = ClosedLoop(chat((1.0, 2.0)), users=4, num_requests=120, think_time=0.3).build(9)
    a = simulate(trace, FCFS(), COST, SLoRAConfig()).requests_frame()
    b = simulate(trace, FCFS(), COST, SLoRAConfig()).requests_frame()
    pd.testing.assert_frame_equal(a, b)
    # open loop: every call at its trace time (all at 0 here), no chaining
    c = simulate(trace.open_loop(), FCFS(), COST, SLoRAConfig()).requests_frame()
    assert (c.arrival == 0.0).all()


def test_chained_follow_up_waits_behind_requests_that_arrived_earlier():
    """FCFS serves by arrival: a follow-up (a low row) arriving after another client's request
    is queued behind it."""
    t = Trace.from_columns(
        client=["a", "a", "b"],
        arrival=[0.0, 0.0, 0.01],
        prompt_len=[100, 100, 100],
        output_len=[400, 400, 400],
        optional={"interaction_id": [0, 0, 1], "call_index": [0, 1, 0]},
        think_time=[0.0, 0.0, 0.0],
    )
    # a pool of 600 tokens holds only one of these at a time
    r = simulate(t, FCFS(), COST, SLoRAConfig(pool_tokens=600)).requests_frame()
    assert r.arrival[1] > r.arrival[2]
    assert r.admitted_at[2] == r.finished_at[0] == r.arrival[1]
    assert r.admitted_at[1] == r.finished_at[2]
