from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import a10g_cost, random_trace
from policies import DRR, FCFS, LCF, RPM, VTC
from simulator.core.queue import WaitingQueue
from simulator.core.requests import COMPLETED, REJECTED
from simulator.core.service import ProfiledService
from simulator.engines import SLoRAConfig, simulate
from traces import ClientSpec, Fixed, SyntheticWorkload, Trace, Uniform


def bound_vtc(lift):
    """A VTC policy bound to a three-request trace (a, b, b) with client a already arrived."""
    tr = Trace.from_columns(
        client=["a", "b", "b"], arrival=[0.0, 1.0, 2.0], prompt_len=[5, 5, 5], output_len=[5] * 3
    )
    policy = VTC(lift=lift)
    policy.bind(tr)
    q = WaitingQueue(tr.client.tolist())
    policy.on_arrival(0, 0.0, q)
    q.push(0)
    return policy, q


@pytest.mark.parametrize(("lift", "expected"), [("paper", 100.0), ("artifact", 0.0), ("none", 0.0)])
def test_lift_on_empty_queue_uses_the_last_client_to_leave(lift, expected):
    policy, q = bound_vtc(lift)
    q.remove(0)  # client a leaves the queue last
    policy.counter[:] = [100.0, 0.0]
    policy.on_arrival(1, 1.0, q)
    assert policy.counter[1] == expected


@pytest.mark.parametrize("lift", ["paper", "artifact"])
def test_lift_to_the_minimum_waiting_counter(lift):
    policy, q = bound_vtc(lift)
    policy.counter[:] = [50.0, 0.0]
    policy.on_arrival(1, 1.0, q)
    assert policy.counter[1] == 50.0
    q.push(1)
    policy.counter[1] = 7.0
    policy.on_arrival(2, 2.0, q)  # b already waits: no lift
    assert policy.counter[1] == 7.0


def test_pick_smallest_counter_ties_to_first_seen_client():
    tr = Trace.from_columns(
        client=["b", "a"],
        arrival=[0.0, 0.0],
        prompt_len=[5, 5],
        output_len=[5, 5],
        client_names=["a", "b"],
    )
    policy = VTC()
    policy.bind(tr)
    q = WaitingQueue(tr.client.tolist())
    for r in (0, 1):
        policy.on_arrival(r, 0.0, q)
        q.push(r)
    assert policy.pick(q, 0.0) == 0  # equal counters: client b appeared first
    policy.counter[tr.client_of("b")] = 1.0
    assert policy.pick(q, 0.0) == 1


def test_rpm_sliding_window_is_inclusive_and_counts_accepted_only():
    tr = Trace.from_columns(
        client=["a"] * 5,
        arrival=[0.0, 10.0, 20.0, 61.0, 70.0],
        prompt_len=[5] * 5,
        output_len=[5] * 5,
    )
    tl = simulate(tr, RPM(limit=2), a10g_cost(), SLoRAConfig())
    assert tl.status.tolist() == [COMPLETED, COMPLETED, REJECTED, COMPLETED, REJECTED]
    assert tl.reason[2] == "rpm_limit" and tl.generated[2] == 0


def overload(duration=360, weights=(1.0, 1.0)):
    return SyntheticWorkload(
        [
            ClientSpec(f"client{i}", Uniform(r), Fixed(256), Fixed(256), weight=w)
            for i, (r, w) in enumerate(zip((1.5, 3.0), weights))
        ],
        duration=duration,
    ).build(0)


def served_tokens(tl, until):
    """Prompt + 2 x output tokens of requests finished by `until`, per client."""
    t = tl.trace
    done = tl.finished_at <= until
    cost = t.prompt_len + 2 * t.output_len
    return np.bincount(t.client[done], weights=cost[done], minlength=t.num_clients)


def test_vtc_equalises_backlogged_clients_where_fcfs_follows_the_arrival_ratio():
    tr = overload()
    vtc = served_tokens(simulate(tr, VTC(), a10g_cost(), SLoRAConfig()), 300)
    fcfs = served_tokens(simulate(tr, FCFS(), a10g_cost(), SLoRAConfig()), 300)
    assert vtc[0] / vtc[1] == pytest.approx(1.0, abs=0.05)
    assert fcfs[0] / fcfs[1] == pytest.approx(0.5, abs=0.08)


def test_weighted_vtc_serves_in_proportion_to_weights():
    tr = overload(weights=(1.0, 2.0))
    served = served_tokens(simulate(tr, VTC(), a10g_cost(), SLoRAConfig()), 300)
    assert served[1] / served[0] == pytest.approx(2.0, rel=0.08)
    tr = overload()  # weights given in the policy instead of the trace
    served = served_tokens(
        simulate(tr, VTC(weights={"client1": 2.0}), a10g_cost(), SLoRAConfig()), 300
    )
    assert served[1] / served[0] == pytest.approx(2.0, rel=0.08)


def test_lcf_lets_a_returning_client_starve_the_other_vtc_does_not():
    wl = SyntheticWorkload(
        [
            ClientSpec("early", Uniform(3.0), Fixed(256), Fixed(256)),
            ClientSpec("late", Uniform(3.0), Fixed(256), Fixed(256)),
        ],
        duration=400,
    ).build(0)
    late = wl.client == 1
    keep = ~late | (wl.arrival >= 200)  # the late client only starts at 200 s
    tr = Trace.from_columns(
        client=np.array(wl.client_names)[wl.client[keep]],
        arrival=wl.arrival[keep],
        prompt_len=wl.prompt_len[keep],
        output_len=wl.output_len[keep],
    )

    def early_share(policy):
        tl = simulate(tr, policy, a10g_cost(), SLoRAConfig())
        window = (tl.admitted_at >= 210) & (tl.admitted_at < 270)
        return (tr.client[window] == 0).mean()

    assert early_share(LCF()) < 0.05  # the late client catches up on everything first
    assert early_share(VTC()) == pytest.approx(0.5, abs=0.1)


workloads = st.builds(
    random_trace,
    seed=st.integers(0, 10_000),
    n=st.integers(1, 100),
    clients=st.integers(1, 4),
    max_prompt=st.sampled_from([8, 300]),
    max_output=st.sampled_from([1, 64, 300]),
    rate=st.sampled_from([2.0, 50.0]),
)
policies = st.sampled_from(
    [
        lambda: VTC(),
        lambda: VTC(lift="artifact", counting="artifact"),
        lambda: VTC(weights={"c0": 3.0, "c1": 0.7}),
        lambda: LCF(),
        lambda: RPM(limit=3),
        lambda: VTC(service="profiled"),
        lambda: VTC(prediction="oracle", predict_range=0.5, seed=3),
        lambda: VTC(prediction="moving_average", service="profiled"),
        lambda: DRR(quantum=50.0),
        lambda: DRR(quantum=500.0, service="profiled"),
    ]
)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads, policies, st.sampled_from([2000, 10_000]))
def test_fast_forward_is_bit_identical_with_stateful_policies(tr, make, pool):
    from hypothesis import assume

    if isinstance(make(), VTC) and make().weights:
        assume({"c0", "c1"} <= set(tr.client_names))
    cfg = SLoRAConfig(pool_tokens=pool)
    p_fast, p_slow = make(), make()
    fast = simulate(tr, p_fast, a10g_cost(), cfg)
    slow = simulate(tr, p_slow, a10g_cost(), replace(cfg, fast_forward=False))
    for name in ("status", "admitted_at", "first_token_at", "finished_at", "generated"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name), err_msg=name)
    if isinstance(p_fast, VTC):
        np.testing.assert_array_equal(p_fast.counter, p_slow.counter)
    if isinstance(p_fast, DRR):
        np.testing.assert_array_equal(p_fast.credit, p_slow.credit)
    assert (fast.counters is None) == (slow.counters is None)
    if fast.counters is not None:
        pd.testing.assert_frame_equal(fast.counters, slow.counters)


@pytest.mark.parametrize("seed", [7, 8])
@pytest.mark.parametrize("running_max", [1, 3])
def test_drr_runs_like_stepping_when_the_batch_is_full(seed, running_max):
    # DRR's pick refills credits: stepping used to ask it at every step of a full batch, runs
    # did not (these seeds differed before the router stopped asking on a full batch)
    tr = random_trace(seed=seed, n=50, clients=3, max_prompt=64, max_output=64, rate=50.0)
    cfg = SLoRAConfig(pool_tokens=2000, max_wait_tokens=0, running_max_req_size=running_max)
    fast, slow = DRR(quantum=50.0), DRR(quantum=50.0)
    on = simulate(tr, fast, a10g_cost(), cfg)
    off = simulate(tr, slow, a10g_cost(), replace(cfg, fast_forward=False))
    assert on.requests_frame().equals(off.requests_frame())
    np.testing.assert_array_equal(fast.credit, slow.credit)


def test_unknown_weight_client_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown client 'zz'"):
        simulate(overload(20), VTC(weights={"zz": 2.0}), a10g_cost(), SLoRAConfig())


def single_request_trace(prompt=40, output=30, clients=("a",)):
    return Trace.from_columns(
        client=list(clients),
        arrival=[0.0] * len(clients),
        prompt_len=[prompt] * len(clients),
        output_len=[output] * len(clients),
    )


def run_alone(policy, tr):
    simulate(tr, policy, a10g_cost(), SLoRAConfig(fast_forward=False))
    return policy


H = ProfiledService()


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (VTC(), 1 * 40 + 2 * 29),  # the first token (from prefill) is free
        (VTC(prediction="oracle"), 1 * 40 + 2 * 30),  # Algorithm 3: exact prediction up front
        (VTC(service="profiled"), float(H(40, 0) + H(40, 30) - H(40, 1))),
        (VTC(weights={"a": 4.0}), (40 + 2 * 29) / 4),
        # the artifact's router (manager.py, vtc_req_queue.py): a decode step charges w_q per
        # request before it, and the step where the request finishes charges it once more
        (VTC(counting="artifact"), 1 * 40 + 2 * 29 + 2),
        (LCF(counting="artifact"), 1 * 40 + 2 * 29 + 2),
        # vtc_oracle_req_queue.py: only tokens past the prediction, never with an exact one
        (VTC(prediction="oracle", counting="artifact"), 1 * 40 + 2 * 30),
        # the token step k + 1 makes costs h(40, k) - h(40, k - 1), k = 1 .. 29, then the
        # finish charges h(40, 30) - h(40, 29) again: h(40, 0) + h(40, 30) - h(40, 0)
        (VTC(service="profiled", counting="artifact"), float(H(40, 30))),
    ],
    ids=[
        "linear",
        "oracle",
        "profiled",
        "weighted",
        "artifact-linear",
        "artifact-lcf",
        "artifact-oracle",
        "artifact-profiled",
    ],
)
def test_total_charge_of_one_request(policy, expected):
    run_alone(policy, single_request_trace())
    assert policy.counter[0] == pytest.approx(expected, rel=1e-12)
    events = policy.counter_events()
    assert events["delta"].sum() == pytest.approx(expected, rel=1e-12)
    assert events["value"].iloc[-1] == policy.counter[0]
    extra = events[events["cause"].astype(str) == "finish_extra"]
    assert len(extra) == (policy.counting == "artifact" and policy.prediction == "none")


def test_artifact_counting_charges_a_finishing_steps_whole_batch_once():
    """Three requests decode together; two finish in the same step (and one at its prefill,
    with the one it was prefilled with): every request of those steps pays one more token,
    once per step however many finished in it."""
    tr = Trace.from_columns(
        client=["a", "a", "b", "c", "c"],
        arrival=[0.0, 0.0, 0.0, 100.0, 100.0],
        prompt_len=[10, 10, 10, 10, 10],
        output_len=[20, 20, 30, 1, 5],
    )
    policy = run_alone(VTC(counting="artifact", lift="artifact"), tr)
    events = policy.counter_events()
    extra = events[events["cause"].astype(str) == "finish_extra"]
    # the step where a and a finish: a pays 2 x 2 (both its requests), b 2; b's own finish:
    # b 2 alone; c's prefill (one output token): both of c's requests, 2 x 2
    assert sorted(zip(extra["client"].astype(str), extra["delta"], strict=True)) == [
        ("a", 4.0),
        ("b", 2.0),
        ("b", 2.0),
        ("c", 2.0),
        ("c", 4.0),
    ]
    paper = run_alone(VTC(lift="artifact"), tr)  # this lift: c, arriving alone, is not lifted
    # the decodes cost the same (linear: one price per token); only the extra charges differ
    np.testing.assert_allclose(policy.counter - paper.counter, [4.0, 4.0, 6.0])


def test_over_prediction_is_refunded_and_under_prediction_charged_as_it_comes():
    tr = single_request_trace(prompt=10, output=100, clients=("a", "b"))
    policy = VTC(prediction="oracle", predict_range=0.5, seed=11)
    run_alone(policy, tr)
    # whatever the draws, the final charge is the exact service h(p, L)
    np.testing.assert_allclose(policy.counter, [10 + 2 * 100] * 2)
    # the prompt is charged as computed, the predicted output at admission
    causes = set(policy.counter_events()["cause"].astype(str))
    assert causes <= {"prompt", "admit", "decode", "refund"} and {"prompt", "admit"} <= causes
    # its own seeded stream: same seed same draws, another seed other draws
    draws = [policy.charges.predicted.copy()]
    for seed in (11, 12):
        p = VTC(prediction="oracle", predict_range=0.5, seed=seed)
        p.bind(tr)
        draws.append(p.charges.predicted)
    np.testing.assert_array_equal(draws[0], draws[1])
    assert not np.array_equal(draws[0], draws[2])
    assert np.all((draws[0] >= 50) & (draws[0] <= 150))


def test_moving_average_prediction_follows_the_papers_update():
    outputs = [100, 50, 200]
    tr = Trace.from_columns(
        client=["a"] * 3, arrival=[0.0, 100.0, 200.0], prompt_len=[5] * 3, output_len=outputs
    )
    policy = run_alone(VTC(prediction="moving_average"), tr)
    # predictions at admission: 0 (nothing finished), 100, (4 * 100 + 50) / 5 = 90
    np.testing.assert_allclose(policy.charges.predicted, [0.0, 100.0, 90.0])
    assert policy.mean_output[0] == pytest.approx((4 * 90 + 200) / 5)
    # charges still add up to the service actually received (prompt + every output token but
    # the free first one of the unpredicted request)
    assert policy.counter[0] == pytest.approx(15 + 2 * (99 + 50 + 200))


def test_drr_refills_in_rounds_and_converges_to_vtc_with_a_small_quantum():
    tr = overload(120)
    cfg = SLoRAConfig()
    vtc = simulate(tr, VTC(), a10g_cost(), cfg)
    tiny = simulate(tr, DRR(quantum=1e-3), a10g_cost(), cfg)
    big = simulate(tr, DRR(quantum=1e6), a10g_cost(), cfg)

    def gap(tl):  # service gap between the two backlogged clients by t = 100 s
        done = tl.requests_frame()
        done = done[done.finished_at <= 100]
        per = done.groupby("client", observed=True).output_len.sum()
        return abs(per.iloc[0] - per.iloc[1]) / per.sum()

    assert gap(tiny) == pytest.approx(gap(vtc), abs=0.02)
    assert gap(big) > 3 * gap(tiny)  # one huge quantum: whole bursts per client, FCFS-like


def test_drr_credit_log_accounts_for_every_change():
    tr = overload(40)
    policy = DRR(quantum=300.0)
    simulate(tr, policy, a10g_cost(), SLoRAConfig())
    ev = policy.counter_events()
    for i, name in enumerate(tr.client_names):
        mine = ev[ev.client == name]
        assert mine["delta"].sum() == pytest.approx(policy.credit[i])
        assert mine["value"].iloc[-1] == pytest.approx(policy.credit[i])
    assert {"refill", "prompt", "decode"} <= set(ev["cause"].astype(str))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prediction": "psychic"}, "policy.prediction must be one of"),
        ({"predict_range": 0.5}, "applies only to prediction=oracle"),
        ({"prediction": "oracle", "predict_range": 1.5}, r"predict_range must be in \[0, 1\]"),
        ({"service": "cubic"}, "policy.service must be one of"),
        ({"counting": "exact"}, "policy.counting must be one of"),
    ],
)
def test_bad_vtc_options_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        VTC(**kwargs)


def test_bad_drr_quantum_is_a_clear_error():
    with pytest.raises(ValueError, match="policy.quantum must be a number > 0"):
        DRR(quantum=0)


def test_counter_log_frame_keeps_every_event_with_its_client_and_cause_in_time_order():
    """CounterLog shares one (client, cause) entry among consecutive calls alike: single events
    and runs, merged or not, each keep their own client, cause, delta and value."""
    from simulator.core.counters import ADMIT, DECODE, CounterLog

    log = CounterLog()
    log.add(0.5, 0, 10.0, 10.0, ADMIT)
    log.add_many(np.array([1.0, 2.0]), 0, np.array([1.0, 1.0]), np.array([11.0, 12.0]), DECODE)
    log.add(3.0, 0, 1.0, 13.0, DECODE)  # merges with the run before
    log.add(1.5, 1, 5.0, 5.0, ADMIT)  # another client, earlier: sorted into place
    log.add_many(np.array([2.5]), 1, np.array([2.0]), np.array([7.0]), DECODE)
    frame = log.frame(["a", "b"])
    assert frame.time.tolist() == [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    assert frame.client.astype(str).tolist() == ["a", "a", "b", "a", "b", "a"]
    assert frame.cause.astype(str).tolist() == [
        "admit",
        "decode",
        "admit",
        "decode",
        "decode",
        "decode",
    ]
    assert frame.value.tolist() == [10.0, 11.0, 5.0, 12.0, 7.0, 13.0]
    assert frame.delta.tolist() == [10.0, 1.0, 5.0, 1.0, 2.0, 1.0]


@pytest.mark.parametrize("make", [VTC, lambda: VTC(weights={"c0": 2.0}), DRR, LCF])
def test_a_single_steps_charge_in_plain_floats_logs_what_the_numpy_path_logs(make, monkeypatch):
    """`TokenCharges.decode_step` (one step at a constant price, the common case) and the
    general `decode` give the same counters and the same log, bit for bit."""
    from policies.charging import TokenCharges
    from simulator.engines import VLLMConfig

    tr = random_trace(seed=4, n=120, clients=3, max_prompt=300, max_output=60, rate=6.0)
    engine = VLLMConfig(pool_tokens=3000, fast_forward=False)  # one step per charge
    fast = make()
    simulate(tr, fast, a10g_cost(), engine)
    monkeypatch.setattr(TokenCharges, "decode_step", lambda self, clients: None)
    general = make()
    simulate(tr, general, a10g_cost(), engine)
    a, b = fast.counter_events(), general.counter_events()
    assert len(a) > 1000
    pd.testing.assert_frame_equal(a, b, check_exact=True)
