"""The elastic fleet (simulator/engines/autoscaler.py): HPA-style decisions, loading delays,
draining, GPU-seconds, and fairness at the gateway while the fleet scales."""

import signal

import numpy as np
import pytest
from test_gateway import clients_trace, flow, service_gap_and_bound

from conftest import check_accounting
from cost_models import ConstantStepCost
from policies import FCFS, VTC
from simulator.core.errors import ConfigError
from simulator.core.requests import COMPLETED
from simulator.engines import ClusterConfig, VLLMConfig, simulate
from simulator.engines.autoscaler import Autoscaler, AutoscalerConfig, LoadingDelay
from simulator.metrics.replicas import fleet_summary

CONST = ConstantStepCost(prefill=0.05, decode=0.05)
ENGINE = VLLMConfig(pool_tokens=4000, max_num_seqs=16)


def test_recommendations_follow_the_hpa_rule_and_its_stabilisation_windows():
    scaler = Autoscaler(
        AutoscalerConfig(enabled=True, target=4.0, scale_up_window=30.0,
                         scale_down_window=60.0, min_replicas=1, max_replicas=6)
    )  # fmt: skip
    # (time, signal summed over the ready replicas, replicas provisioned) -> decision
    steps = [
        (0.0, 10.0, 1, 3),  # asks ceil(10 / 4) = 3; the lowest of the last 30 s is 3: up
        (15.0, 30.0, 3, 3),  # asks 8 -> capped at 6; the lowest of 30 s ago (3) holds it
        (30.0, 30.0, 3, 3),  # window [0, 30] still holds the 3 of time 0
        (45.0, 30.0, 3, 6),  # now the last 30 s asked 6 and 6: up to 6
        (60.0, 0.0, 6, 6),  # asks 1; the highest of the last 60 s is 6: stays
        (105.0, 0.0, 6, 6),  # window [45, 105] holds the 6 of time 45
        (120.0, 0.0, 6, 1),  # window [60, 120]: 1, 1, 1: down to 1
    ]
    got = [scaler.recommend(t, load, have) for t, load, have, _ in steps]
    assert got == [want for *_, want in steps]


def test_loading_delays_are_drawn_as_configured():
    rng = np.random.default_rng(0)
    assert LoadingDelay("fixed", seconds=42).draw(rng) == 42.0
    uniform = [LoadingDelay("uniform", low=10, high=20).draw(rng) for _ in range(2000)]
    assert (
        min(uniform) >= 10 and max(uniform) <= 20 and np.mean(uniform) == pytest.approx(15, abs=0.3)
    )
    logn = [LoadingDelay("lognormal", seconds=60, sigma=0.5).draw(rng) for _ in range(4000)]
    assert np.median(logn) == pytest.approx(60, rel=0.05)


def elastic(**settings):
    base = dict(enabled=True, target=4.0, interval=5.0, scale_down_window=30.0,
                min_replicas=1, max_replicas=4, loading={"seconds": 20.0})  # fmt: skip
    return AutoscalerConfig(**{**base, **settings})


def surge_trace():
    """Light load, a surge (8x) from 60 s to 120 s, light again until 240 s."""
    light = clients_trace({"a": 1.0}, duration=240.0)
    surge = clients_trace({"a": 7.0}, duration=60.0)
    arrival = np.concatenate([light.arrival, surge.arrival + 60.0])
    order = np.argsort(arrival, kind="stable")
    from traces import Trace

    return Trace.from_columns(
        client=["a"] * len(arrival), arrival=arrival[order],
        prompt_len=[100] * len(arrival), output_len=[50] * len(arrival),
    )  # fmt: skip


def fleet_run(tr, cluster, policy=None):
    tl = simulate(tr, policy or FCFS(), CONST, ENGINE, cluster)
    check_accounting(tl)
    return tl


def intervals_of(changes, replica, state):
    """[start, end) of each time `replica` was in `state`."""
    out, since = [], None
    for t, i, s in changes:
        if i != replica:
            continue
        if s == state and since is None:
            since = t
        elif s != state and since is not None:
            out.append((since, t))
            since = None
    return out + ([(since, np.inf)] if since is not None else [])


def test_a_fleet_whose_dispatcher_takes_snapshots_ends_when_its_requests_do():
    """The snapshots' timer and the autoscaler's each saw the other still scheduled, so a run
    with both never ended once its requests had."""
    routing = {"scorers": {"queue_depth": 1}, "scrape_interval": 0.3}
    cluster = ClusterConfig(1, "scored", routing=routing, autoscaler=elastic())
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the run did not end"))
    signal.alarm(60)  # a hang fails the test instead of the run
    try:
        tl = fleet_run(surge_trace(), cluster)
    finally:
        signal.alarm(0)
    assert (tl.status == COMPLETED).all()
    last_finish = float(np.max(tl.finished_at))
    assert tl.info["fleet"]["changes"][-1][0] <= last_finish + 30.0 + 5.0  # a window, a tick


def test_the_fleet_grows_under_a_surge_serves_only_when_loaded_and_drains_before_it_frees():
    tr = surge_trace()
    tl = fleet_run(tr, ClusterConfig(1, "least_requests", autoscaler=elastic()))
    assert (tl.status == COMPLETED).all()
    changes = tl.info["fleet"]["changes"]
    summary = fleet_summary(tl.info["fleet"], tl.requests_frame())
    assert summary["max_ready"] == 4
    assert summary["replicas_over_time"][-1][1] == 1, "back to one replica after the surge"
    steps = tl.steps_frame()
    for replica in range(4):
        ready = intervals_of(changes, replica, "ready")
        draining = intervals_of(changes, replica, "draining")
        serving = ready + draining
        mine = steps[steps.replica == replica]
        # no replica steps before it has loaded, nor after it was freed
        inside = [any(a <= s < b for a, b in serving) for s in mine["start"]]
        assert all(inside)
        for lo, _ in intervals_of(changes, replica, "loading"):
            became = [a for a, _ in ready if a >= lo][0]
            assert became == pytest.approx(lo + 20.0)
        # a replica freed after draining had finished everything it was sent
        for start, end in draining:
            if end < np.inf:
                sent_here = (tl.request_columns["replica"] == replica) & (tl.arrival < start)
                assert (tl.finished_at[sent_here] <= end).all()
    # GPU-seconds: every interval a replica was held, until the run's end
    end = max(rep_end for rep_end in steps.groupby("replica")["end"].max())
    held = sum(
        min(b, end) - a
        for r in range(4)
        for state in ("loading", "ready", "draining")
        for a, b in intervals_of(changes, r, state)
    )
    assert tl.info["fleet"]["gpu_seconds"] == pytest.approx(held)
    assert summary["under_provisioned_requests"] > 0
    fixed = fleet_run(tr, ClusterConfig(1, "least_requests"))
    ttft = lambda t: np.mean(t.first_token_at - t.arrival)  # noqa: E731
    assert ttft(tl) < ttft(fixed) / 3, "the added replicas serve the surge"


def test_a_fleet_held_at_its_size_is_the_fixed_fleet_bit_for_bit():
    tr = clients_trace({"a": 6.0, "b": 3.0}, duration=60.0, seed=3)
    fixed = fleet_run(tr, ClusterConfig(2, "least_requests"), VTC())
    held = fleet_run(
        tr,
        ClusterConfig(2, "least_requests", autoscaler=elastic(min_replicas=2, max_replicas=2)),
        VTC(),
    )
    assert fixed.token_times()[2].tobytes() == held.token_times()[2].tobytes()
    assert np.array_equal(fixed.finished_at, held.finished_at)
    assert held.info["fleet"]["gpu_seconds"] == pytest.approx(2 * fixed.info["end_time"])


def test_vtc_at_the_gateway_keeps_its_bound_while_the_fleet_scales():
    tr = clients_trace({"heavy": 30.0, "light": 12.0}, duration=120.0, burst=20, seed=7)
    scaling = elastic(
        max_replicas=3, interval=10.0, scale_down_window=20.0, loading={"seconds": 15.0}
    )
    tl = fleet_run(tr, ClusterConfig(1, "least_requests", gateway=flow(VTC(), fairness="vtc"),
                                     autoscaler=scaling))  # fmt: skip
    ready = [
        row[1] for row in fleet_summary(tl.info["fleet"], tl.requests_frame())["replicas_over_time"]
    ]
    assert max(ready) == 3 and min(ready) == 1, "the fleet scaled"
    gap, bound = service_gap_and_bound(tl, tr, until=120.0)
    assert gap <= bound
    fcfs = fleet_run(tr, ClusterConfig(1, "least_requests", gateway=flow(FCFS(), fairness="fcfs"),
                                       autoscaler=scaling))  # fmt: skip
    assert service_gap_and_bound(fcfs, tr, until=120.0)[0] > bound


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"min_replicas": 5, "max_replicas": 2}, r"min_replicas \(5\) is above"),
        ({"target": -1}, "target must be a number > 0"),
        ({"metric": "gpu_temperature"}, "metric must be one of"),
        ({"interval": 0}, "interval must be a number > 0"),
        ({"loading": {"distribution": "gamma"}}, "loading.distribution must be one of"),
        ({"loading": {"low": 9, "high": 3}}, "low .9. is above"),
        ({"loading": {"secs": 3}}, r"unknown key\(s\) \['secs'\]"),
        ({"max_replicas": 0}, "max_replicas must be an integer >= 1"),
    ],
)
def test_bad_autoscaler_settings_name_the_key(settings, message):
    with pytest.raises(ConfigError, match=message):
        AutoscalerConfig(**{"enabled": True, **settings})


def test_the_fleet_refuses_what_it_cannot_scale():
    with pytest.raises(ConfigError, match="must be within cluster.autoscaler.min_replicas"):
        ClusterConfig(6, "least_requests", autoscaler=elastic(max_replicas=4))
    with pytest.raises(ConfigError, match="not cluster.dispatcher=central"):
        ClusterConfig(1, "central", autoscaler=elastic())
    with pytest.raises(ConfigError, match="co-located replicas only"):
        ClusterConfig(prefill_replicas=1, decode_replicas=1, autoscaler=elastic())
