"""The gateway in front of the replicas (simulator/engines/gateway.py): SLO classes, admission,
flow control, the fairness bound of VTC flow control (docs/metrics.md), and its config errors."""

import dataclasses
import subprocess

import numpy as np
import pytest

from conftest import BIN, check_accounting
from cost_models import ConstantStepCost
from policies import DRR, FCFS, VTC, WFQ, Priority, RoundRobin
from simulator.core.errors import ConfigError
from simulator.core.requests import COMPLETED, IN_FLIGHT, REJECTED
from simulator.engines import ClusterConfig, VLLMConfig, simulate
from simulator.engines.gateway import GatewayConfig
from simulator.engines.runner import Runner
from simulator.metrics.fairness import accumulated_service, served_intervals
from simulator.metrics.tiers import tier_summary
from traces import Trace
from traces.loaders import load_table
from traces.schema import TraceError

CONST = ConstantStepCost(prefill=0.05, decode=0.05)
ENGINE = VLLMConfig(pool_tokens=4000, max_num_seqs=16)


def clients_trace(
    rates: dict[str, float], duration: float, prompt=100, output=50, burst=0, seed=None
):
    """Evenly spaced arrivals per client (plus `burst` requests each at time 0, interleaved);
    with a `seed`, lengths drawn uniformly up to twice `prompt` and `output`."""
    rows = []
    for i in range(burst):
        for name in rates:
            rows.append((0.0, i, name))
    for name, rate in rates.items():
        rows += [(k / rate, 0, name) for k in range(1, int(duration * rate) + 1)]
    rows.sort(key=lambda r: (r[0], r[1]))
    n = len(rows)
    rng = None if seed is None else np.random.default_rng(seed)
    return Trace.from_columns(
        client=[r[2] for r in rows],
        arrival=[r[0] for r in rows],
        prompt_len=[prompt] * n if rng is None else rng.integers(1, 2 * prompt + 1, n),
        output_len=[output] * n if rng is None else rng.integers(1, 2 * output + 1, n),
    )


def run(tr, gateway, replicas=1, policy=None, engine=ENGINE, dispatcher="least_requests"):
    if gateway is not None and (gateway.labels(tr)):
        tr = dataclasses.replace(tr, slo_class=gateway.class_codes(tr))
    cluster = ClusterConfig(replicas, dispatcher, gateway=gateway)
    tl = simulate(tr, policy or FCFS(), CONST, engine, cluster)
    check_accounting(tl)
    return tl


def flow(fairness_policy, **flow_control):
    return GatewayConfig(
        flow_control={"enabled": True, **flow_control}, fairness_policy=fairness_policy
    )


# ---- admission ----------------------------------------------------------------------------
def test_token_bucket_admits_exactly_what_the_buckets_hold():
    tr = clients_trace({"heavy": 10.0, "light": 2.0}, duration=10.0)
    gw = GatewayConfig(
        admission={"type": "token_bucket", "rate": 1200.0, "burst": 600.0,
                   "tenant_rate": 700.0, "tenant_burst": 300.0, "output_cost": 1.0}
    )  # fmt: skip
    tl = run(tr, gw, replicas=2)
    # the buckets kept by hand: each full at 0, refilled continuously, a request costing
    # prompt + output tokens passes only if both its buckets hold that much
    level, tenant = 600.0, {"heavy": 300.0, "light": 300.0}
    last, expected = 0.0, []
    for t, c in zip(tr.arrival, tr.client, strict=True):
        name = tr.client_names[c]
        level = min(600.0, level + 1200.0 * (t - last))
        tenant = {k: min(300.0, v + 700.0 * (t - last)) for k, v in tenant.items()}
        last = t
        ok = level >= 150 and tenant[name] >= 150
        if ok:
            level -= 150
            tenant[name] -= 150
        expected.append(ok)
    expected = np.array(expected)
    assert (tl.status[expected] == COMPLETED).all()
    assert (tl.status[~expected] == REJECTED).all()
    assert set(tl.reason[~expected]) == {"gateway_rate_limited"}
    light = tr.client == tr.client_names.index("light")
    assert expected[light].all() and not expected[~light].all()  # the heavy tenant is limited


def test_saturation_admission_sheds_only_negative_priorities_and_only_when_saturated():
    gw = GatewayConfig(
        classes={"a": "critical", "b": "standard", "c": "sheddable", "d": "batch"},
        admission={"type": "saturation"},
    )
    light = run(clients_trace({n: 0.2 for n in "abcd"}, duration=20.0), gw)
    assert (light.status == COMPLETED).all(), "an unsaturated pool sheds nothing"
    tr = clients_trace({n: 8.0 for n in "abcd"}, duration=20.0)
    tl = run(tr, gw)
    rejected = {
        tr.client_names[c]: int((tl.status[tr.client == c] == REJECTED).sum()) for c in range(4)
    }
    assert rejected["a"] == rejected["b"] == 0
    assert rejected["c"] > 0 and rejected["d"] > 0
    assert set(tl.reason[tl.status == REJECTED]) == {"gateway_saturated"}


def test_tier_shedding_sheds_the_lowest_tier_first_and_never_standard():
    gw = GatewayConfig(
        classes={"bg": "background", "batch": "batch", "shed": "sheddable", "std": "standard"},
        admission={"type": "tier_shedding", "overload_queue_depth": 4.0},
    )
    tr = clients_trace({n: 6.0 for n in ("bg", "batch", "shed", "std")}, duration=30.0)
    tl = run(tr, gw)
    share = {
        name: float((tl.status[tr.client == c] == REJECTED).mean())
        for c, name in enumerate(tr.client_names)
    }
    assert share["std"] == 0.0
    assert share["bg"] > share["batch"] > share["shed"] > 0.0
    assert set(tl.reason[tl.status == REJECTED]) == {"gateway_tier_shed"}
    summary = tier_summary(tl.requests_frame(), None, total=600.0)
    assert summary["tiers"]["background"]["rejected"] == {
        "gateway_tier_shed": int(
            (tl.status[tr.client == tr.client_names.index("bg")] == REJECTED).sum()
        )
    }
    assert summary["rejected_per_tenant"]["bg"]["background"]["gateway_tier_shed"] > 0


# ---- flow control ---------------------------------------------------------------------------
def waiting_at(times, since, until):
    """How many of the intervals [since, until) contain each time."""
    return np.array([int(((since <= t) & (t < until)).sum()) for t in times])


def test_flow_control_keeps_the_replica_queue_within_its_depth():
    tr = clients_trace({"a": 10.0, "b": 5.0}, duration=20.0)
    engine = VLLMConfig(pool_tokens=100_000, max_num_seqs=8)
    plain = run(tr, None, engine=engine)
    gw = GatewayConfig(
        flow_control={"enabled": True, "fairness": "round_robin"},
        saturation={"queue_depth": 3, "kv_utilization": 1.0},
        fairness_policy=RoundRobin(),
    )
    tl = run(tr, gw, engine=engine)
    sent = tl.request_columns["gateway_dispatched_at"]
    assert (sent >= tl.arrival).all() and (tl.admitted_at >= sent).all()
    probe = np.unique(np.concatenate([sent, tl.admitted_at]))
    in_replica_queue = waiting_at(probe, sent, tl.admitted_at)
    assert in_replica_queue.max() <= 3, "dispatched only while the replica had room"
    in_plain_queue = waiting_at(probe, plain.arrival, plain.admitted_at)
    assert in_plain_queue.max() > 50  # without the gateway the queue is the engine's
    assert (tl.status == COMPLETED).all()
    # the work is the same: the gateway holds requests, it does not slow the engine down
    assert tl.finished_at.max() == pytest.approx(plain.finished_at.max(), rel=0.05)


def test_flow_control_serves_the_higher_band_first_and_accounts_for_what_waits():
    gw = GatewayConfig(
        classes={"vip": "critical"},
        flow_control={"enabled": True, "fairness": "fcfs"},
        fairness_policy=FCFS(),
    )
    tr = clients_trace({"vip": 2.0, "bulk": 10.0}, duration=30.0)  # the pool serves about 6/s
    engine = dataclasses.replace(ENGINE, horizon=40.0)
    tl = run(tr, gw, engine=engine)
    vip = tr.client == tr.client_names.index("vip")
    wait = tl.request_columns["gateway_dispatched_at"] - tl.arrival
    # a critical request waits only for the next free seat (at most a request's own service,
    # 50 decode steps of 0.05 s and its prefill), the bulk ones behind the whole backlog
    assert np.nanmax(wait[vip]) < 2.6 and np.nanmean(wait[vip]) < 1.0 < 5.0 < np.nanmean(wait[~vip])
    left = tl.status == IN_FLIGHT
    assert left.any() and not left[vip].any()
    assert set(tl.reason[left]) <= {"gateway_queued", "queued", "running"}
    assert "gateway_queued" in set(tl.reason[left])


def test_ttl_and_queue_bound_turn_requests_away_with_their_reasons():
    tr = clients_trace({"a": 20.0}, duration=20.0)
    ttl = run(tr, flow(FCFS(), fairness="fcfs", ttl=3.0))
    expired = ttl.reason == "gateway_ttl_expired"
    assert expired.any()
    sent = ttl.request_columns["gateway_dispatched_at"]
    assert (sent[~expired] - ttl.arrival[~expired] <= 3.0).all()
    assert np.isnan(sent[expired]).all()
    bound = run(tr, flow(FCFS(), fairness="fcfs", queue_bound=10))
    full = bound.reason == "gateway_queue_full"
    assert full.any() and (bound.status[full] == REJECTED).all()
    # at each arrival turned away the gateway held its 10 (the other arrivals waited or went)
    sent = bound.request_columns["gateway_dispatched_at"]
    held = waiting_at(bound.arrival[full], bound.arrival, np.where(full, -1.0, sent))
    assert (held == 10).all()


@pytest.mark.parametrize("fairness", ["round_robin", "wfq", "vtc", "drr"])
def test_fair_flow_control_splits_the_pool_evenly_between_backlogged_tenants(fairness):
    policy = {"round_robin": RoundRobin(), "wfq": WFQ(), "vtc": VTC(), "drr": DRR(quantum=200)}
    tr = clients_trace({"heavy": 30.0, "light": 10.0}, duration=60.0, burst=20)
    fair = run(tr, flow(policy[fairness], fairness=fairness), replicas=2)
    first_come = run(tr, flow(FCFS(), fairness="fcfs"), replicas=2)
    heavy = tr.client == tr.client_names.index("heavy")

    def split(tl):
        done = (tl.status == COMPLETED) & (tl.finished_at <= 60.0)
        return done[heavy].sum() / max(1, done[~heavy].sum())

    assert split(fair) == pytest.approx(1.0, abs=0.1)
    assert split(first_come) > 2.0


def service_gap_and_bound(tl, tr, until):
    """The largest |W_heavy(s, t) - W_light(s, t)| over windows in [0, until] (service h = prompt
    + 2 x output, spread over each request's tokens), and the bound of docs/metrics.md:
    2 (U_p + R U_o + R max(U_p, U_o)), R the most requests dispatched and not yet ended."""
    requests, tokens = tl.requests_frame(), tl.tokens_frame()
    times = np.linspace(0.0, until, 600)
    acc = accumulated_service(served_intervals(requests, tokens), times)
    gap = (acc["heavy"] - acc["light"]).to_numpy()
    largest = float(gap.max() - gap.min())  # the worst window [s, t] with s, t on the grid
    sent = tl.request_columns["gateway_dispatched_at"]
    ended = np.where(np.isnan(tl.finished_at), np.inf, tl.finished_at)
    events = np.unique(sent[~np.isnan(sent)])
    in_flight = waiting_at(events, np.where(np.isnan(sent), np.inf, sent), ended).max()
    u_p, u_o = 1.0 * tr.prompt_len.max(), 2.0 * tr.output_len.max()
    return largest, 2 * (u_p + in_flight * u_o + in_flight * max(u_p, u_o))


def test_vtc_flow_control_keeps_backlogged_tenants_within_the_derived_bound():
    tr = clients_trace({"heavy": 30.0, "light": 12.0}, duration=120.0, burst=20, seed=7)
    tl = run(tr, flow(VTC(), fairness="vtc"), replicas=2)
    # both tenants wait at the gateway through the whole window (their lanes never empty)
    sent = tl.request_columns["gateway_dispatched_at"]
    never = np.where(np.isnan(sent), np.inf, sent)
    grid = np.linspace(1.0, 120.0, 400)
    for c in range(2):
        mine = tr.client == c
        assert (waiting_at(grid, tl.arrival[mine], never[mine]) > 0).all()
    gap, bound = service_gap_and_bound(tl, tr, until=120.0)
    assert gap <= bound
    # the bound can fail: first come, first served at the gateway gives the heavy tenant more
    fcfs = run(tr, flow(FCFS(), fairness="fcfs"), replicas=2)
    fcfs_gap, fcfs_bound = service_gap_and_bound(fcfs, tr, until=120.0)
    assert fcfs_gap > fcfs_bound


def test_vtc_flow_control_counts_every_token_but_keeps_no_log_of_it():
    """The gateway's fairness counters decide, and nothing reads their log: it keeps no
    events (one a token cost 24 bytes of memory: gigabytes over a simulated day), while the
    engine policy's own log is kept for the run folder."""
    tr = clients_trace({"heavy": 30.0, "light": 12.0}, duration=20.0, burst=5)
    cluster = ClusterConfig(2, "least_requests", gateway=flow(VTC(), fairness="vtc"))
    runner = Runner(tr, VTC(), CONST, ENGINE, cluster)
    tl = runner.close()
    check_accounting(tl)
    assert runner.gateway is not None
    (band,) = runner.gateway.bands.values()
    assert isinstance(band.policy, VTC)
    assert band.policy.counter.sum() >= tr.prompt_len.sum()  # it charged what it dispatched
    assert len(band.policy.counter_events()) == 0
    assert len(runner.policies[0].counter_events()) > 0


@pytest.mark.parametrize(
    "settings", [{}, {"prediction": "oracle"}, {"service": "profiled"}], ids=str
)
def test_gateway_vtc_charges_each_stream_its_whole_price_once(settings):
    """Flow control's VTC charges a request's prompt when it is dispatched and its output when
    its stream ends: every completed request costs its client h(P, O) exactly, the service
    function of its whole prompt and output, with a predicted output charged ahead and the
    paper's profiled h as with the linear one (no lift: plain sums)."""
    tr = clients_trace({"heavy": 30.0, "light": 12.0}, duration=20.0, burst=5, seed=3)
    vtc = VTC(lift="none", **settings)
    cluster = ClusterConfig(2, "least_requests", gateway=flow(vtc, fairness="vtc"))
    runner = Runner(tr, FCFS(), CONST, ENGINE, cluster)
    tl = runner.close()
    assert (tl.status == COMPLETED).all()
    assert runner.gateway is not None
    (band,) = runner.gateway.bands.values()
    price = band.policy.service(tr.prompt_len, tr.output_len)
    for c in range(tr.num_clients):
        assert band.policy.counter[c] == pytest.approx(price[tr.client == c].sum(), rel=1e-9)


# ---- classes in the engine, in traces ---------------------------------------------------
def test_priority_by_slo_class_admits_critical_requests_first():
    tr = clients_trace({"a": 10.0, "b": 10.0}, duration=10.0)
    classes = np.where(np.arange(len(tr)) % 3 == 0, "critical", "batch")
    tr = dataclasses.replace(tr, slo_class=Trace.from_columns(
        client=["x"] * len(tr), arrival=tr.arrival, prompt_len=tr.prompt_len,
        output_len=tr.output_len, slo_class=classes).slo_class)  # fmt: skip
    tl = simulate(tr, Priority(by_slo_class=True), CONST, ENGINE)
    critical = classes == "critical"
    ttft = tl.first_token_at - tl.arrival
    assert np.mean(ttft[critical]) * 3 < np.mean(ttft[~critical])
    with pytest.raises(ConfigError, match="by_slo_class=true needs SLO classes"):
        simulate(clients_trace({"a": 1.0}, 2.0), Priority(by_slo_class=True), CONST, ENGINE)


def test_a_table_carries_slo_classes_and_a_bad_one_is_named(tmp_path):
    good = tmp_path / "t.csv"
    good.write_text("arrival,prompt_len,output_len,tier\n0,10,5,critical\n1,10,5,batch\n")
    tr = load_table(good, columns={"slo_class": "tier"})
    assert [
        ("critical", "standard", "sheddable", "batch", "background")[c] for c in tr.slo_class
    ] == [
        "critical",
        "batch",
    ]
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival,prompt_len,output_len,tier\n0,10,5,critical\n1,10,5,gold\n")
    with pytest.raises(TraceError, match=r"slo_class.*gold.*critical"):
        load_table(bad, columns={"slo_class": "tier"})


def test_an_inactive_gateway_changes_nothing():
    tr = clients_trace({"a": 10.0, "b": 4.0}, duration=10.0)
    plain = simulate(tr, VTC(), CONST, ENGINE, ClusterConfig(2, "least_requests"))
    labelled = run(tr, GatewayConfig(classes={"a": "critical"}), replicas=2, policy=VTC())
    for name in ("status", "first_token_at", "finished_at", "admitted_at"):
        assert np.array_equal(getattr(plain, name), getattr(labelled, name), equal_nan=True)
    assert plain.token_times()[2].tobytes() == labelled.token_times()[2].tobytes()


def test_round_robin_and_wfq_run_as_engine_policies():
    tr = clients_trace({"a": 20.0, "b": 20.0, "c": 20.0}, duration=5.0)
    one_seat = VLLMConfig(pool_tokens=100_000, max_num_seqs=1)
    order = np.argsort(simulate(tr, RoundRobin(), CONST, one_seat).admitted_at, kind="stable")
    served = [tr.client_names[c] for c in tr.client[order][:9]]
    assert served == ["a", "b", "c"] * 3
    weighted = simulate(tr, WFQ(weights={"a": 2.0}), CONST, one_seat)
    early = weighted.admitted_at <= np.sort(weighted.admitted_at)[39]
    counts = np.bincount(tr.client[early], minlength=3)
    assert counts[0] == pytest.approx(2 * counts[1], abs=2) and counts[1] == pytest.approx(
        counts[2], abs=1
    )


# ---- bad configs ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"admission": {"type": "token_bucket", "rate": -5}},
            "gateway.admission.rate must be a number > 0",
        ),
        ({"admission": {"type": "token_bucket"}}, "needs gateway.admission.rate"),
        ({"admission": {"type": "bouncer"}}, "gateway.admission.type must be one of"),
        ({"admission": {"rates": 1}}, r"gateway.admission: unknown key\(s\) \['rates'\]"),
        ({"flow_control": {"fairness": "lottery"}}, "gateway.flow_control.fairness must be one of"),
        ({"flow_control": {"queue_bound": 0}}, "queue_bound must be an integer >= 1"),
        ({"flow_control": {"ttl": -1}}, "gateway.flow_control.ttl must be a number > 0"),
        ({"classes": {"a": "gold"}}, r"gateway.classes.a must be one of \('critical'"),
        ({"saturation": {"kv_utilization": 0}}, "kv_utilization must be a number > 0"),
        ({"saturation": {"queue_depth": "abc"}}, "saturation.queue_depth must be a number >= 1"),
        ({"saturation": {"queue_depth": 2.5}}, "saturation.queue_depth must be an integer >= 1"),
        ({"admission": {"input_cost": 0, "output_cost": 0}}, "both 0"),
    ],
)
def test_bad_gateway_settings_name_the_key(settings, message):
    with pytest.raises(ConfigError, match=message):
        GatewayConfig(**settings)


def test_the_cli_refuses_bad_gateway_settings_in_one_line():
    pd = ["cluster.prefill_replicas=1", "cluster.decode_replicas=1", "engine=vllm"]
    for args, key in [
        (["gateway.admission.type=token_bucket", "gateway.admission.rate=-1"], "admission.rate"),
        (["gateway.flow_control.enabled=true", "gateway.flow_control.fairness=vtcc"], "fairness"),
        (["gateway.admission.type=saturation", *pd, "engine.pool_tokens=20000"], "co-located"),
    ]:
        res = subprocess.run(
            [str(BIN / "fairsim"), *args, "compare_with=null", "workload.duration=5"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 2, res.stderr
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and key in lines[0], res.stderr
