"""Replicas behind dispatchers (simulator/engines/dispatch.py, simulator/engines/runner.py)."""

import dataclasses
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_vllm_engine import check_invariants
from test_vllm_engine import trace as hashed_trace

from conftest import a10g_cost, check_accounting, random_trace, with_shared_prefixes
from cost_models import ConstantStepCost
from policies import FCFS, VTC
from simulator.core.requests import COMPLETED, IN_FLIGHT
from simulator.engines import DISPATCHERS, ClusterConfig, SLoRAConfig, VLLMConfig, simulate
from simulator.engines.autoscaler import AutoscalerConfig
from simulator.engines.gateway import GatewayConfig
from simulator.engines.runner import Runner
from traces import Trace

CONST = ConstantStepCost(prefill=0.1, decode=0.01)


def trace(arrival, prompt, output, client=None):
    n = len(arrival)
    return Trace.from_columns(
        client=client or ["a"] * n, arrival=arrival, prompt_len=prompt, output_len=output
    )


def test_round_robin_alternates():
    tr = trace(np.arange(9) * 0.01, [50] * 9, [20] * 9)
    tl = simulate(tr, FCFS(), CONST, VLLMConfig(pool_tokens=10_000), ClusterConfig(3))
    assert tl.request_columns["replica"].tolist() == [0, 1, 2] * 3
    steps = tl.steps_frame()
    assert sorted(steps.replica.unique()) == [0, 1, 2]


def test_least_outstanding_balances_and_sends_work_to_the_idle_replica():
    # a long request occupies replica 0. Counting requests, the two short ones at 0.5 s are
    # split (1 vs 0, then 1 vs 1: the tie goes to replica 0); counting tokens, both go to
    # replica 1 (60 tokens left there against ~500). At 2 s the short ones are done.
    tr = trace([0.0, 0.5, 0.5, 2.0], [50, 50, 50, 50], [500, 10, 10, 10])
    cfg = VLLMConfig(pool_tokens=100_000)
    reqs = simulate(tr, FCFS(), CONST, cfg, ClusterConfig(2, "least_requests"))
    assert reqs.request_columns["replica"].tolist() == [0, 1, 0, 1]
    toks = simulate(tr, FCFS(), CONST, cfg, ClusterConfig(2, "least_tokens"))
    assert toks.request_columns["replica"].tolist() == [0, 1, 1, 1]
    # equal loads: ties go to the lowest index, then alternate
    tr2 = trace([0.0, 0.0, 0.0, 0.0], [50] * 4, [100] * 4)
    even = simulate(tr2, FCFS(), CONST, cfg, ClusterConfig(2, "least_requests"))
    assert even.request_columns["replica"].tolist() == [0, 1, 0, 1]


def test_client_affinity_keeps_each_client_on_one_replica():
    tr = random_trace(seed=1, n=60, clients=4, max_prompt=100, max_output=20, rate=10.0)
    tl = simulate(
        tr, FCFS(), CONST, VLLMConfig(pool_tokens=50_000), ClusterConfig(2, "client_affinity")
    )
    rep = tl.request_columns["replica"]
    for c in range(tr.num_clients):
        assert len(set(rep[tr.client == c].tolist())) == 1
        assert rep[tr.client == c][0] == c % 2


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 1000),
    replicas=st.integers(1, 3),
    dispatcher=st.sampled_from(tuple(DISPATCHERS)),
    pool=st.sampled_from([800, 50_000]),
)
def test_every_request_is_accounted_for_on_any_cluster(seed, replicas, dispatcher, pool):
    tr = random_trace(seed=seed, n=60, clients=3, max_prompt=200, max_output=60, rate=20.0)
    cfg = VLLMConfig(pool_tokens=pool, max_num_batched_tokens=256)
    tl = simulate(tr, VTC(), a10g_cost(), cfg, ClusterConfig(replicas, dispatcher))
    check_invariants(tl, cfg)
    done = tl.status == COMPLETED
    assert (tl.request_columns["replica"][done] >= 0).all()
    assert (tl.request_columns["replica"] < replicas).all()


def test_one_coupled_replica_equals_the_standalone_engine():
    tr = random_trace(seed=7, n=120, clients=3, max_prompt=300, max_output=100, rate=15.0)
    cfg = VLLMConfig(pool_tokens=3000, max_num_batched_tokens=256)
    alone = simulate(tr, VTC(), a10g_cost(), cfg)
    for dispatcher in ("least_requests", "central", "global_vtc"):
        coupled = simulate(tr, VTC(), a10g_cost(), cfg, ClusterConfig(1, dispatcher))
        assert alone.requests_frame().equals(coupled.requests_frame()), dispatcher
        assert np.array_equal(alone.token_times()[2], coupled.token_times()[2])


def service_gap(tl, a, b, until):
    """max |W_a(t) - W_b(t)| over t < until, W = prompt tokens at the first token (w_p = 1)
    plus 2 per output token after it (w_q = 2)."""
    r, tok = tl.requests_frame(), tl.tokens_frame()
    grid = np.linspace(0, until, 2000)
    served = {}
    for c in (a, b):
        mine = r[r.client == c]
        times = np.concatenate(
            [
                mine.first_token_at.dropna(),
                tok.time[tok.request_id.isin(mine.request_id) & (tok["index"] > 0)],
            ]
        )
        worth = np.concatenate(
            [
                mine.prompt_len[mine.first_token_at.notna()],
                np.full(len(times) - mine.first_token_at.notna().sum(), 2.0),
            ]
        )
        order = np.argsort(times, kind="stable")
        cum = np.cumsum(worth[order])
        served[c] = np.concatenate(([0.0], cum))[np.searchsorted(times[order], grid, side="right")]
    return float(np.abs(served[a] - served[b]).max())


def backlogged_pair():
    """Two clients backlogged for the whole run: "a" sends 3x as many requests as "b"."""
    n_a, n_b = 600, 200
    arrival = np.concatenate([np.linspace(0, 20, n_a), np.linspace(0, 20, n_b)])
    client = ["a"] * n_a + ["b"] * n_b
    order = np.argsort(arrival, kind="stable")
    return Trace.from_columns(
        client=[client[i] for i in order],
        arrival=arrival[order],
        prompt_len=[64] * (n_a + n_b),
        output_len=[64] * (n_a + n_b),
    )


def test_global_vtc_bounds_service_difference_across_replicas_and_fcfs_does_not():
    tr = backlogged_pair()
    cfg = VLLMConfig(pool_tokens=4000, max_num_batched_tokens=512, max_num_seqs=16)
    cost = a10g_cost()
    fair = simulate(tr, VTC(), cost, cfg, ClusterConfig(2, "global_vtc"))
    fcfs = simulate(tr, FCFS(), cost, cfg, ClusterConfig(2, "round_robin"))
    until = 0.8 * min(fair.finished_at[tr.client == 1].max(), fcfs.finished_at.max())
    # U for a request of 64 + 64 tokens at w_p = 1, w_q = 2, times the two replicas' batches
    bound = 2 * 16 * (64 + 2 * 64)
    assert service_gap(fair, "a", "b", until) < bound
    assert service_gap(fair, "a", "b", until / 2) < bound
    # FCFS serves in arrival proportion: the gap keeps growing with time
    half, full = service_gap(fcfs, "a", "b", until / 2), service_gap(fcfs, "a", "b", until)
    assert full > 4 * bound and full > 1.6 * half


def test_global_vtc_needs_a_counter_policy_and_configs_are_checked():
    tr = trace([0.0], [10], [2])
    with pytest.raises(ValueError, match="global_vtc needs a policy with per-client counters"):
        simulate(tr, FCFS(), CONST, VLLMConfig(pool_tokens=100), ClusterConfig(2, "global_vtc"))
    with pytest.raises(ValueError, match="cluster.dispatcher must be one of"):
        ClusterConfig(2, "random")
    with pytest.raises(ValueError, match="cluster.replicas"):
        ClusterConfig(0)


def test_chained_calls_on_a_cluster_wait_for_their_predecessor():
    tr = Trace.from_columns(
        client=["u", "u", "u", "v"],
        arrival=[0.0, 0.0, 0.0, 0.1],
        prompt_len=[30, 30, 30, 30],
        output_len=[20, 20, 20, 20],
        optional={"interaction_id": [1, 1, 1, 2], "call_index": [0, 1, 2, 0]},
        think_time=[0.0, 0.5, 0.5, 0.0],
    )
    cfg = VLLMConfig(pool_tokens=10_000)
    tl = simulate(tr, FCFS(), CONST, cfg, ClusterConfig(2))
    check_invariants(tl, cfg)
    rows = {int(c): i for i, c in enumerate(tr.call_index[:3])}
    assert tl.arrival[rows[1]] == pytest.approx(tl.finished_at[rows[0]] + 0.5)
    assert tl.arrival[rows[2]] == pytest.approx(tl.finished_at[rows[1]] + 0.5)


# ---- S-LoRA replicas (the runner hosts either step model behind any dispatcher) ---------------


def check_slora_cluster(tl, cfg, replicas):
    """Accounting, token conservation and each replica's KV bound, for S-LoRA replicas."""
    check_accounting(tl)
    steps = tl.steps
    assert set(np.unique(steps["replica"]).tolist()) <= set(range(replicas))
    for rep in range(replicas):
        mine = steps["replica"] == rep
        assert (steps["kv_used"][mine] <= cfg.pool_tokens).all(), "a replica's pool holds"
        assert (steps["start"][mine][1:] >= steps["end"][mine][:-1]).all(), "no overlap"
    done = tl.status == COMPLETED
    assert (tl.request_columns["replica"][done] >= 0).all()
    assert (tl.request_columns["replica"] < replicas).all()
    if cfg.horizon is None:
        assert (tl.status != IN_FLIGHT).all()
        assert tl.info["kv_used_at_end"] == 0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 1000),
    replicas=st.integers(1, 4),
    # d2lpm routes by the replicas' prefix caches, which only engine=vllm keeps
    dispatcher=st.sampled_from(tuple(d for d in DISPATCHERS if d != "d2lpm")),
    pool=st.sampled_from([800, 20_000]),
    horizon=st.sampled_from([None, 2.0]),
)
def test_slora_replicas_account_for_every_request_on_any_dispatcher(
    seed, replicas, dispatcher, pool, horizon
):
    tr = random_trace(seed=seed, n=80, clients=3, max_prompt=200, max_output=60, rate=25.0)
    cfg = SLoRAConfig(pool_tokens=pool, horizon=horizon)
    tl = simulate(tr, VTC(), a10g_cost(), cfg, ClusterConfig(replicas, dispatcher))
    check_slora_cluster(tl, cfg, replicas)


def test_one_coupled_slora_replica_equals_the_standalone_engine():
    tr = random_trace(seed=7, n=120, clients=3, max_prompt=300, max_output=100, rate=15.0)
    cfg = SLoRAConfig(pool_tokens=3000)
    alone = simulate(tr, VTC(), a10g_cost(), cfg)
    for dispatcher in ("least_requests", "central", "global_vtc"):
        coupled = simulate(tr, VTC(), a10g_cost(), cfg, ClusterConfig(1, dispatcher))
        assert alone.requests_frame().equals(coupled.requests_frame()), dispatcher
        assert np.array_equal(alone.token_times()[2], coupled.token_times()[2])
        assert alone.counters.equals(coupled.counters)


def test_global_vtc_on_slora_replicas_bounds_the_service_difference_and_fcfs_does_not():
    tr = backlogged_pair()
    cfg, replicas = SLoRAConfig(pool_tokens=2000), 2
    fair = simulate(tr, VTC(), a10g_cost(), cfg, ClusterConfig(replicas, "global_vtc"))
    fcfs = simulate(tr, FCFS(), a10g_cost(), cfg, ClusterConfig(replicas, "round_robin"))
    check_slora_cluster(fair, cfg, replicas)
    until = 0.8 * min(fair.finished_at[tr.client == 1].max(), fcfs.finished_at.max())
    # Theorem 4.4's 2U with U = max(w_p L_input, w_q M), the replicas' pools together as M
    bound = 2 * max(64, 2 * replicas * cfg.pool_tokens)
    assert service_gap(fair, "a", "b", until) < bound
    assert service_gap(fair, "a", "b", until / 2) < bound
    half, full = service_gap(fcfs, "a", "b", until / 2), service_gap(fcfs, "a", "b", until)
    assert full > bound and full > 1.6 * half  # FCFS: past the bound and still growing


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 1000),
    dispatcher=st.sampled_from(["round_robin", "client_affinity"]),
    pool=st.sampled_from([800, 20_000]),
)
def test_static_slora_replicas_fast_forward_like_stepping(seed, dispatcher, pool):
    """Statically dispatched replicas run alone, with fast-forward: the same timeline."""
    tr = random_trace(seed=seed, n=90, clients=3, max_prompt=200, max_output=80, rate=30.0)
    cluster = ClusterConfig(2, dispatcher)
    fast = simulate(tr, VTC(), a10g_cost(), SLoRAConfig(pool_tokens=pool), cluster)
    slow = simulate(
        tr, VTC(), a10g_cost(), SLoRAConfig(pool_tokens=pool, fast_forward=False), cluster
    )
    assert fast.requests_frame().equals(slow.requests_frame())
    for a, b in zip(fast.token_times(), slow.token_times(), strict=True):
        assert np.array_equal(a, b)
    for key in fast.steps:
        assert np.array_equal(fast.steps[key], slow.steps[key]), key
    assert fast.counters.equals(slow.counters)


GATEWAYS = {
    "none": lambda: None,
    "vtc_flow": lambda: GatewayConfig(flow_control={"enabled": True}, fairness_policy=VTC()),
    "flow_with_ttl": lambda: GatewayConfig(
        flow_control={"enabled": True, "ttl": 1.5}, fairness_policy=FCFS()
    ),
    "saturation": lambda: GatewayConfig(
        admission={"type": "saturation"}, classes={"c0": "sheddable"}
    ),
}
REPORTS = {"scorers": {"queue_depth": 1, "kv_utilization": 1}}  # what the replicas report
ROUTINGS = {  # the dispatcher, and its routing settings
    "least_requests": ("least_requests", {}),
    "least_tokens": ("least_tokens", {}),
    "scored": ("scored", REPORTS),
    "stale": ("scored", {**REPORTS, "scrape_interval": 0.3, "delay": 0.1}),
    "d2lpm": ("d2lpm", {}),
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 1000),
    slora=st.booleans(),
    replicas=st.integers(2, 3),
    routing=st.sampled_from(sorted(ROUTINGS)),
    gateway=st.sampled_from(sorted(GATEWAYS)),
    autoscaler=st.sampled_from([None, "queue_depth", "kv_utilization", "in_flight_tokens"]),
    make_policy=st.sampled_from([FCFS, VTC]),
    pool=st.sampled_from([1_500, 20_000]),
    horizon=st.sampled_from([None, 2.0]),
    even=st.booleans(),
)
def test_coupled_replicas_fast_forward_like_stepping(
    seed, slora, replicas, routing, gateway, autoscaler, make_policy, pool, horizon, even
):
    """Replicas that read each other through a dispatcher, a gateway or an autoscaler take runs
    of decode steps cut where anything from outside could reach or read them: the timeline of
    stepping one by one, bit for bit. `even`: evenly spaced arrivals on a constant step cost
    (arrivals on step ends)."""
    if slora and routing == "d2lpm":
        routing = "least_tokens"  # (d2lpm reads vLLM's prefix cache)
    tr = random_trace(seed=seed, n=90, clients=3, max_prompt=200, max_output=80, rate=30.0)
    tr = with_shared_prefixes(tr, seed)
    cost = a10g_cost()
    if even:
        tr = Trace.from_columns(
            client=[tr.client_names[c] for c in tr.client], arrival=np.arange(len(tr)) * 0.04,
            prompt_len=tr.prompt_len, output_len=tr.output_len, block_hashes=tr.block_hashes,
        )  # fmt: skip
        cost = ConstantStepCost(prefill=0.02, decode=0.01)
    dispatcher, settings_ = ROUTINGS[routing]
    elastic = None
    if autoscaler is not None:
        target = 300 if autoscaler == "in_flight_tokens" else 2.0
        elastic = AutoscalerConfig(
            enabled=True, metric=autoscaler, target=target, interval=0.5, scale_down_window=1.0,
            min_replicas=1, max_replicas=replicas, loading={"seconds": 0.3},
        )  # fmt: skip
    gw = GATEWAYS[gateway]()
    if gw is not None and gw.labels(tr):
        tr = dataclasses.replace(tr, slo_class=gw.class_codes(tr))
    fleet = {} if elastic is None else {"autoscaler": elastic}
    cluster = ClusterConfig(
        1 if elastic else replicas, dispatcher, routing=settings_, gateway=gw, **fleet
    )
    engine = SLoRAConfig if slora else VLLMConfig
    fast, slow = (
        simulate(tr, make_policy(), cost, engine(pool_tokens=pool, horizon=horizon,
                                                 fast_forward=ff), cluster)
        for ff in (True, False)
    )  # fmt: skip
    check_accounting(fast)
    assert fast.requests_frame().equals(slow.requests_frame())
    for a, b in zip(fast.token_times(), slow.token_times(), strict=True):
        assert np.array_equal(a, b)
    for key in fast.steps:
        assert np.array_equal(fast.steps[key], slow.steps[key]), key
    assert fast.info.get("fleet") == slow.info.get("fleet")


# ---- runs past arrivals -----------------------------------------------------------------------


def decisions_counted(runner):
    """Count each replica's decisions (a step or a run of decode steps each)."""
    counts = [0] * len(runner.replicas)
    for rep in runner.replicas:
        decide = rep.schedule

        def counted(frontier, i=rep.index, decide=decide):
            counts[i] += 1
            return decide(frontier)

        rep.schedule = counted
    return counts


def test_an_arrival_cuts_only_the_run_of_the_replica_it_reaches():
    """Behind least_requests, replica 0 decodes two long requests and replica 1 one; ten short
    requests then arrive, each routed to replica 1 (each ends before the next comes). Replica
    0's run of decode steps goes on past every arrival, where replica 1's is cut at each:
    replica 0 decides a few times only, where ending every run at every arrival takes a
    decision per arrival on each; the timeline is the same as stepping one by one and as
    ending every run at every arrival, bit for bit."""
    arrival = [0.0, 0.0, 0.0] + [1.0 + 0.25 * k for k in range(10)]
    output = [400, 400, 400] + [5] * 10  # requests 0 and 2 go to replica 0, 1 to replica 1
    tr = trace(arrival, [40] * 13, output)
    engine = VLLMConfig(pool_tokens=50_000)
    cluster = ClusterConfig(2, "least_requests")

    def run(cuts: bool, fast: bool = True):
        runner = Runner(tr, FCFS(), CONST, dataclasses.replace(engine, fast_forward=fast), cluster)
        if not cuts:  # every run ends at the next arrival, as before runs were cut
            runner.cuts_runs = False
            for rep in runner.replicas:
                rep.runs_cut = False
        counts = decisions_counted(runner)
        return runner.close(), counts, runner.cuts_runs

    cut, cut_counts, on = run(cuts=True)
    whole, whole_counts, _ = run(cuts=False)
    stepping, _, _ = run(cuts=True, fast=False)
    assert on
    assert tl_equal(cut, stepping) and tl_equal(cut, whole)
    assert cut.request_columns["replica"].tolist() == [0, 1, 0] + [1] * 10
    assert cut_counts[0] <= 4 < 10 < whole_counts[0]  # replica 0: not cut by the arrivals
    assert cut_counts[1] >= 10  # replica 1: a decision at least at each arrival


def tl_equal(a, b) -> bool:
    same = a.requests_frame().equals(b.requests_frame())
    same &= all(np.array_equal(x, y) for x, y in zip(a.token_times(), b.token_times(), strict=True))
    return same and all(np.array_equal(a.steps[k], b.steps[k]) for k in a.steps)


POOL = {"pool_tokens": 9000}
PD = {"kv_bytes_per_token": 1024}  # (the constant cost model knows no model's KV size)
FLOW = GatewayConfig(flow_control={"enabled": True}, fairness_policy=VTC())


@pytest.mark.parametrize(
    ("cluster", "engine", "cuts"),
    [
        (ClusterConfig(3, "least_requests"), VLLMConfig(**POOL), True),
        (ClusterConfig(3, "round_robin", gateway=FLOW), VLLMConfig(**POOL), True),
        (ClusterConfig(3, "scored", routing={"scorers": {"running_requests": 1}}),
         VLLMConfig(**POOL), True),
        # dispatchers reading what a run changes before its end: each routed request's tokens
        # left, the replicas' caches, their reports at the instant
        (ClusterConfig(3, "least_tokens"), VLLMConfig(**POOL), False),
        (ClusterConfig(3, "d2lpm"), VLLMConfig(**POOL), False),
        (ClusterConfig(3, "scored", routing=REPORTS), VLLMConfig(**POOL), False),
        # a CPU tier (blocks evicted there cannot be taken back), fast-forward off, S-LoRA
        (ClusterConfig(3, "least_requests"), VLLMConfig(**POOL, **PD, cpu_kv_tokens=4096), False),
        (ClusterConfig(3, "least_requests"), VLLMConfig(**POOL, fast_forward=False), False),
        (ClusterConfig(3, "least_requests"), SLoRAConfig(**POOL), False),
        # pools: handoffs cut decode runs; not where the decider reads a decode replica's cache
        (ClusterConfig(prefill_replicas=1, decode_replicas=2, disaggregation=PD),
         VLLMConfig(**POOL), True),
        (ClusterConfig(prefill_replicas=1, decode_replicas=2,
                       disaggregation={**PD, "decider": "cache_miss_above"}),
         VLLMConfig(**POOL), False),
    ],
)  # fmt: skip
def test_runs_go_past_arrivals_only_where_nothing_read_at_an_arrival_changes_inside_a_run(
    cluster, engine, cuts
):
    tr = trace([0.0, 0.1], [40, 40], [5, 5])
    assert Runner(tr, FCFS(), CONST, engine, cluster).cuts_runs is cuts


# ---- the scored dispatcher (an inference gateway's endpoint picker) ---------------------------


def scored(**scorers):
    return {"scorers": scorers}


@pytest.mark.parametrize("engine", ["vllm", "slora"])
def test_scored_with_one_load_scorer_routes_as_the_load_aware_dispatchers_bit_for_bit(engine):
    tr = random_trace(seed=11, n=150, clients=3, max_prompt=300, max_output=80, rate=30.0)
    cfg = VLLMConfig(pool_tokens=3000) if engine == "vllm" else SLoRAConfig(pool_tokens=3000)
    for load, same_as in (
        ("running_requests", "least_requests"),
        ("in_flight_tokens", "least_tokens"),
    ):
        ours = simulate(
            tr, VTC(), a10g_cost(), cfg, ClusterConfig(3, "scored", routing=scored(**{load: 2.0}))
        )
        theirs = simulate(tr, VTC(), a10g_cost(), cfg, ClusterConfig(3, same_as))
        assert ours.requests_frame().equals(theirs.requests_frame()), load
        assert np.array_equal(ours.token_times()[2], theirs.token_times()[2])


def test_stale_queue_depths_send_a_burst_to_one_replica_and_fresh_ones_spread_it():
    # 12 long requests in the first 0.12 s; only the queue-depth scorer. Read at the instant of
    # routing, each new request sees the queues grow and the ties go round. From snapshots every
    # 10 s: the first request sees none yet (all equal: replica 0); the snapshot at 0, taken
    # after that arrival, shows one waiting on replica 0, and every later request reads it and
    # goes to replica 1, the lowest index of the empty ones
    tr = trace(np.arange(12) * 0.01, [500] * 12, [200] * 12)
    cfg = VLLMConfig(pool_tokens=2000, max_num_seqs=1)
    fresh = simulate(
        tr, FCFS(), CONST, cfg, ClusterConfig(3, "scored", routing=scored(queue_depth=1.0))
    )
    stale = simulate(
        tr,
        FCFS(),
        CONST,
        cfg,
        ClusterConfig(3, "scored", routing={**scored(queue_depth=1.0), "scrape_interval": 10.0}),
    )
    assert sorted(np.bincount(fresh.request_columns["replica"], minlength=3)) == [4, 4, 4]
    assert stale.request_columns["replica"].tolist() == [0] + [1] * 11
    assert stale.finished_at.max() > 2 * fresh.finished_at.max(), "one replica did all the work"


@pytest.mark.parametrize("delay, last", [(0.0, 0), (0.5, 1)])
def test_a_delayed_snapshot_is_seen_only_after_its_delay(delay, last):
    # one request runs at a time per replica, each for 3.09 s. A and B at 0 see no snapshot
    # (replica 0); the snapshot at 0 shows two waiting there, so C (0.5) and D (0.6) go to
    # replica 1; the one at 1.0 shows one waiting on each. E at 1.2 reads it and takes the
    # tie's replica 0, unless it is seen only 0.5 s later: E then still reads the one at 0
    tr = trace([0.0, 0.0, 0.5, 0.6, 1.2], [500] * 5, [300] * 5)
    cfg = VLLMConfig(pool_tokens=2000, max_num_seqs=1)
    routing = {**scored(queue_depth=1.0), "scrape_interval": 1.0, "delay": delay}
    tl = simulate(tr, FCFS(), CONST, cfg, ClusterConfig(2, "scored", routing=routing))
    assert tl.request_columns["replica"].tolist() == [0, 0, 1, 1, last]


def test_the_prefix_scorer_keeps_requests_sharing_a_prompt_on_one_replica():
    # two system prompts, their requests in pairs (A A B B A A ...), all still running when the
    # last arrives: the prefix scorer (weight 2) keeps each prompt where its first request
    # went against the load scorer (weight 1); the load scorer alone splits every pair
    prompt_of = [(i // 2) % 2 for i in range(12)]
    hashes = [np.arange(8) + 100 * p for p in prompt_of]
    tr = hashed_trace(np.arange(12) * 0.01, [512] * 12, [200] * 12, hashes=hashes, hash_block=64)
    cfg = VLLMConfig(pool_tokens=20_000)

    def replicas(routing):
        tl = simulate(tr, FCFS(), CONST, cfg, ClusterConfig(2, "scored", routing=routing))
        return tl.request_columns["replica"], tl

    rep, tl = replicas(scored(prefix_match=2.0, running_requests=1.0))
    on = {p: set(rep[np.array(prompt_of) == p].tolist()) for p in (0, 1)}
    assert on == {0: {0}, 1: {1}}
    assert tl.request_columns["cached_tokens"][3:].min() > 0, "their prefixes were cached there"
    load_only, _ = replicas(scored(running_requests=1.0))
    assert load_only.tolist() == [0, 1] * 6


@pytest.mark.parametrize(
    ("routing", "message"),
    [
        ({"scorers": {"queue_lenght": 1.0}}, "unknown scorer(s) ['queue_lenght']; accepted"),
        ({"scorers": {"queue_depth": 0.0}}, "the weights sum to 0"),
        (
            {"scorers": {"queue_depth": -1.0}},
            "cluster.routing.scorers.queue_depth must be a weight",
        ),
        ({"scrape_interval": -1}, "cluster.routing.scrape_interval must be a number of seconds"),
        ({"delay": 1.0}, "cluster.routing.delay needs cluster.routing.scrape_interval > 0"),
        ({"freshness": 1.0}, "cluster.routing: unknown key(s) ['freshness']"),
    ],
)
def test_bad_routing_configs_name_the_key(routing, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ClusterConfig(2, "scored", routing=routing)
