"""Clients that give up (`Trace.client_timeout`): the vLLM engine drops a request whose client
has gone, waiting or running, as vLLM drops one whose connection closed; inference-perf's
client gives up after `load.request_timeout` (aiohttp's 300 s when unset)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_engine import engines as slora_engines
from test_engine import workloads
from test_inference_perf import PROFILE, write
from test_vllm_engine import check_invariants

from conftest import a10g_cost, check_accounting, random_trace, shared_file
from cost_models import ConstantStepCost
from policies import FCFS, VTC
from simulator.core.errors import ConfigError
from simulator.core.requests import COMPLETED, IN_FLIGHT, REJECTED
from simulator.engines import ClusterConfig, SLoRAConfig, VLLMConfig, simulate
from traces import (
    ClientSpec,
    ClosedLoop,
    InferencePerfWorkload,
    Poisson,
    SyntheticWorkload,
    Trace,
    TraceError,
    UniformInt,
)

CONST = ConstantStepCost(prefill=0.1, decode=0.01)


def two_clients(timeout_b: float) -> Trace:
    """A runs 100 tokens with no timeout; B arrives with it, its client giving up after
    `timeout_b` seconds."""
    return Trace.from_columns(
        client=["a", "b"],
        arrival=[0.0, 0.0],
        prompt_len=[10, 10],
        output_len=[100, 100],
        client_timeout=[np.inf, timeout_b],
    )


def two_requests(timeout_b: float, **engine: object) -> tuple[Trace, object]:
    """`two_clients` on the vLLM-style engine under FCFS."""
    trace = two_clients(timeout_b)
    return trace, simulate(trace, FCFS(), CONST, VLLMConfig(pool_tokens=10_000, **engine))


def test_a_running_request_is_dropped_before_the_first_step_after_its_client_gave_up():
    # both prompts in the first step (0 -> 0.1, the first tokens), then a decode step every
    # 0.01 s: the step starting at 0.15 (< 0.155) still serves B, the one at 0.16 does not
    _, tl = two_requests(0.155)
    assert tl.status.tolist() == [COMPLETED, REJECTED]
    assert tl.reason[1] == "client_timeout"
    assert tl.generated[1] == 7  # tokens at 0.10, 0.11, ..., 0.16: they stay emitted
    assert np.isnan(tl.finished_at[1])
    assert tl.info["kv_used_at_end"] == 0, "its blocks were freed"
    check_invariants(tl, VLLMConfig(pool_tokens=10_000))
    # A's steps run on alone once B has gone: 100 tokens, the last at 0.1 + 99 x 0.01
    assert tl.finished_at[0] == pytest.approx(0.1 + 99 * 0.01)


def test_a_waiting_request_leaves_the_queue_when_its_client_gives_up():
    # one sequence at a time: B waits behind A's 1.09 s and its client leaves after 0.5 s
    _, tl = two_requests(0.5, max_num_seqs=1)
    assert tl.reason[1] == "client_timeout" and tl.generated[1] == 0
    assert np.isnan(tl.first_token_at[1]) and np.isnan(tl.admitted_at[1])
    # with a timeout after A ends, B is served in full
    _, tl = two_requests(5.0, max_num_seqs=1)
    assert tl.status.tolist() == [COMPLETED, COMPLETED]


def test_a_client_that_never_gives_up_changes_nothing():
    trace, with_inf = two_requests(np.inf)
    plain = simulate(
        dataclasses.replace(trace, client_timeout=None),
        FCFS(),
        CONST,
        VLLMConfig(pool_tokens=10_000),
    )
    assert with_inf.requests_frame().drop(columns="client_timeout").equals(plain.requests_frame())
    for key in plain.steps:
        assert np.array_equal(with_inf.steps[key], plain.steps[key]), key


timeouts = st.lists(st.sampled_from([0.05, 0.3, 1.0, 4.0, np.inf]), min_size=1, max_size=8)
engines = st.builds(
    VLLMConfig,
    pool_tokens=st.sampled_from([640, 2000, 100_000]),
    max_num_batched_tokens=st.sampled_from([32, 512]),
    max_num_seqs=st.sampled_from([4, 256]),
    horizon=st.sampled_from([None, 3.0]),
    cpu_kv_tokens=st.sampled_from([0, 0, 4000]),  # a CPU tier: requests wait on their KV loads
    kv_bytes_per_token=st.just(131_072),
)
clusters = st.sampled_from(
    [None, ClusterConfig(2, "least_requests"), ClusterConfig(2, "central")]  # coupled, shared
)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads, timeouts, engines, st.sampled_from([FCFS, VTC]), clusters)
@example(  # a client gives up while its request waits behind a run that passes the horizon
    random_trace(seed=0, n=11, clients=2, max_prompt=8, max_output=300, rate=5.0),
    [0.05, 4.0],
    VLLMConfig(pool_tokens=640, max_num_batched_tokens=32, max_num_seqs=4, horizon=3.0),
    FCFS,
    None,
)
@example(  # a request arrives during a run of the full batch and its client gives up before
    # the run ends: the run ends with the step under way then (it was dropped only after the
    # run, so the next arrival's VTC lift saw its client still waiting)
    random_trace(seed=4, n=40, clients=2, max_prompt=8, max_output=64, rate=50.0),
    [1.0, 0.05],
    VLLMConfig(pool_tokens=2000, max_num_seqs=1),
    VTC,
    None,
)
def test_fast_forward_gives_the_timeline_of_stepping_with_clients_giving_up(
    tr, cycle, cfg, make_policy, cluster
):
    tr = dataclasses.replace(tr, client_timeout=np.resize(np.array(cycle), len(tr)))
    on = simulate(tr, make_policy(), a10g_cost(), cfg, cluster)
    stepping = dataclasses.replace(cfg, fast_forward=False)
    off = simulate(tr, make_policy(), a10g_cost(), stepping, cluster)
    check_invariants(on, cfg)
    lost = on.status == REJECTED
    assert set(on.reason[lost].tolist()) <= {"client_timeout"}
    assert on.requests_frame().equals(off.requests_frame())
    for key in on.steps:
        assert np.array_equal(on.steps[key], off.steps[key]), key


@pytest.mark.parametrize("engine", [
    VLLMConfig(pool_tokens=2000, max_num_seqs=2),
    SLoRAConfig(pool_tokens=700, max_wait_tokens=0, running_max_req_size=1),
])  # fmt: skip
@pytest.mark.parametrize("make_policy", [FCFS, VTC])
def test_closed_loop_users_giving_up_get_the_timeline_of_stepping(engine, make_policy):
    # each follow-up is sent when its predecessor ends, so most arrive during a run of steps,
    # and some clients give up before the run ends: 46 of 48 such runs (12 seeds) left
    # stepping's timeline before runs ended where they do
    base = SyntheticWorkload(
        [
            ClientSpec("a", Poisson(3.0), UniformInt(2, 8), UniformInt(5, 64)),
            ClientSpec("b", Poisson(1.0), UniformInt(2, 8), UniformInt(5, 64)),
        ],
        duration=30.0,
    )
    for seed in (0, 1):
        tr = ClosedLoop(base, users=12, num_requests=60, think_time=0.05, think="exponential")
        tr = tr.build(seed)
        tr = dataclasses.replace(tr, client_timeout=np.resize([0.05, 1.0, 0.3], len(tr)))
        on = simulate(tr, make_policy(), a10g_cost(), engine)
        off = simulate(
            tr, make_policy(), a10g_cost(), dataclasses.replace(engine, fast_forward=False)
        )
        assert (on.reason == "client_timeout").sum() > 0, "some clients give up"
        assert on.requests_frame().equals(off.requests_frame())
        for key in on.steps:
            assert np.array_equal(on.steps[key], off.steps[key]), key


def test_replicas_sharing_one_queue_drop_a_request_once():
    tr = dataclasses.replace(
        workloads_trace := _busy_trace(), client_timeout=np.full(len(workloads_trace), 0.4)
    )
    cfg = VLLMConfig(pool_tokens=2000)
    tl = simulate(tr, FCFS(), a10g_cost(), cfg, ClusterConfig(2, "central"))
    check_invariants(tl, cfg)
    assert (tl.reason[tl.status == REJECTED] == "client_timeout").all()
    assert (tl.status == REJECTED).sum() > 0, "the load makes some clients give up"


def _busy_trace() -> Trace:
    rng = np.random.default_rng(3)
    n = 80
    return Trace.from_columns(
        client=["a", "b"] * (n // 2),
        arrival=np.sort(rng.uniform(0, 2, n)),
        prompt_len=rng.integers(50, 400, n),
        output_len=rng.integers(20, 200, n),
    )


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads, timeouts, slora_engines, st.sampled_from([FCFS, VTC]))
@example(  # found by hypothesis on a busy machine: as in the vLLM test's second example
    random_trace(seed=0, n=52, clients=2, max_prompt=8, max_output=64, rate=50.0),
    [1.0, 0.05],
    SLoRAConfig(pool_tokens=700, max_wait_tokens=0, batch_max_tokens=300, running_max_req_size=1),
    VTC,
)
def test_the_slora_router_drops_the_same_requests_stepping_or_taking_runs(
    tr, cycle, cfg, make_policy
):
    tr = dataclasses.replace(tr, client_timeout=np.resize(np.array(cycle), len(tr)))
    on = simulate(tr, make_policy(), a10g_cost(), cfg)
    off = simulate(tr, make_policy(), a10g_cost(), dataclasses.replace(cfg, fast_forward=False))
    check_accounting(on)
    lost = on.status == REJECTED
    assert set(on.reason[lost].tolist()) <= {"client_timeout"}
    if cfg.horizon is None:
        assert (on.status != IN_FLIGHT).all()
    assert on.requests_frame().equals(off.requests_frame())
    for key in on.steps:
        assert np.array_equal(on.steps[key], off.steps[key]), key


def test_the_slora_router_drops_a_running_request_before_its_next_step():
    # the router prefills both in one step (0.1 s), then decodes every 0.01 s: B's client
    # leaves at 0.155, inside the step 0.15 -> 0.16, and B is gone from the step after it
    trace = two_clients(0.155)
    tl = simulate(trace, FCFS(), CONST, SLoRAConfig(pool_tokens=10_000))
    assert tl.status.tolist() == [COMPLETED, REJECTED] and tl.reason[1] == "client_timeout"
    assert tl.generated[1] == 7  # tokens at 0.10, 0.11, ..., 0.16
    check_accounting(tl)
    assert tl.finished_at[0] == pytest.approx(0.1 + 99 * 0.01)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "soon"])
def test_a_bad_client_timeout_names_its_row(bad):
    with pytest.raises(TraceError, match=r"row 1, field 'client_timeout'.*seconds > 0"):
        Trace.from_columns(
            client=["a", "a"],
            arrival=[0, 1],
            prompt_len=[1, 1],
            output_len=[1, 1],
            client_timeout=[1.0, bad],
        )


def test_inference_perf_clients_give_up_after_load_request_timeout_or_aiohttps_300_s(tmp_path):
    unset = InferencePerfWorkload(write(tmp_path, PROFILE)).build(0)
    assert (unset.client_timeout == 300.0).all()
    load = {**PROFILE["load"], "request_timeout": 30}
    given = InferencePerfWorkload(write(tmp_path, {**PROFILE, "load": load}, "p.json")).build(0)
    assert (given.client_timeout == 30.0).all()
    for bad in (0, "x", True):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({**PROFILE, "load": {**load, "request_timeout": bad}}))
        with pytest.raises(TraceError, match="load.request_timeout=.*expected seconds > 0"):
            InferencePerfWorkload(str(path)).build(0)


@pytest.mark.slow
def test_the_overloaded_llama_7b_run_completes_about_as_many_requests_as_measured():
    """The measured Llama-2-7B reasoning run (4,800 requests over 20 minutes, 4 per second)
    completed a fraction of its requests, the rest failing at the client's 300 s timeout. The
    experiment's own command, with nothing set on this run, completes within 15% as many: a
    queue that kept every request (no timeout) would complete all of them."""
    from simulator.api import compose_config, simulate_config
    from simulator.apps.sim2real.runs import experiment_overrides, load_runs

    folder = shared_file("sim2real/inference_sim_training/default_args")
    run = next(r for r in load_runs(folder) if r.name == "llama-2-7b-tp1-reasoning")
    summary = json.loads((run.folder / "results/summary_lifecycle_metrics.json").read_text())
    measured = summary["successes"]["count"]
    assert summary["failures"]["count"] > measured  # most requests failed there
    timeline = simulate_config(compose_config(experiment_overrides(run)))
    done = int((timeline.status == COMPLETED).sum())
    assert done == pytest.approx(measured, rel=0.15)
    lost = timeline.status == REJECTED
    assert lost.sum() + done == len(timeline.status)
    assert (timeline.reason[lost] == "client_timeout").all()


def test_a_table_trace_reads_each_requests_timeout_and_a_transform_sets_one_for_all(tmp_path):
    from simulator.api import build_trace, compose_config, simulate_config
    from traces import ClientTimeout

    table = tmp_path / "trace.csv"
    table.write_text(
        "arrival,prompt_len,output_len,timeout\n0,2000,400,inf\n0.01,2000,400,0.5\n0.02,2000,400,2\n"
    )
    base = [
        "workload=table",
        f"workload.path={table}",
        "+workload.options.columns.client_timeout=timeout",
        "engine=vllm",
        "engine.pool_tokens=4000",  # one request at a time
        "compare_with=null",
    ]
    cfg = compose_config(base)
    assert build_trace(cfg).client_timeout.tolist() == [np.inf, 0.5, 2.0]
    tl = simulate_config(cfg)
    assert tl.status[0] == COMPLETED and (tl.reason[1:] == "client_timeout").all()
    every = compose_config(
        [*base[:2], *base[3:], "workload.transforms=[{_target_: traces.ClientTimeout, seconds: 9}]"]
    )
    assert (build_trace(every).client_timeout == 9.0).all()
    with pytest.raises(TraceError, match="ClientTimeout.seconds must be > 0"):
        ClientTimeout(0).apply(build_trace(every))


def test_replicas_in_forked_processes_drop_the_same_requests_as_in_one():
    tr = dataclasses.replace(
        _busy_trace(), client_timeout=np.resize(np.array([0.3, 1.0, np.inf]), 80)
    )
    cfg = VLLMConfig(pool_tokens=2000)
    one, two = (
        simulate(tr, FCFS(), a10g_cost(), cfg, ClusterConfig(2, "round_robin", processes))
        for processes in (1, 2)
    )
    assert (one.reason == "client_timeout").sum() > 0
    assert one.requests_frame().equals(two.requests_frame())


def test_the_client_timeout_key_gives_every_workloads_requests_one_timeout(tmp_path):
    from simulator.api import build_trace, compose_config

    chat = build_trace(compose_config(["workload=poisson_chat", "client_timeout=20"]))
    assert (chat.client_timeout == 20.0).all()
    assert build_trace(compose_config(["workload=poisson_chat"])).client_timeout is None
    profile = write(tmp_path, PROFILE)
    own = ["workload=inference_perf", f"workload.path={profile}"]
    assert (build_trace(compose_config(own)).client_timeout == 300.0).all()
    assert (build_trace(compose_config([*own, "client_timeout=60"])).client_timeout == 60).all()
    for bad in ("0", "-3", "soon", "true"):
        with pytest.raises(ConfigError, match="client_timeout=.*expected seconds > 0 .*or null"):
            build_trace(compose_config(["workload=poisson_chat", f"client_timeout={bad}"]))


def test_a_request_held_at_the_gateway_leaves_it_when_its_client_gives_up():
    """With flow control, a request waits at the gateway while the pool is saturated: its
    client giving up there ends it there, never dispatched; taking runs of steps or stepping
    one by one ends the same requests."""
    from simulator.api import compose_config, simulate_config

    args = [
        "engine=vllm",
        "engine.pool_tokens=10000",
        "workload=vtc_overload",
        "workload.duration=40",
        "policy=fcfs",
        "cluster.replicas=2",
        "cluster.dispatcher=least_requests",
        "gateway.flow_control.enabled=true",
        "gateway.flow_control.fairness=vtc",
        "gateway.saturation.queue_depth=1",  # a replica has room only while nearly empty
        "gateway.saturation.kv_utilization=0.05",
        "client_timeout=6",
        "compare_with=null",
    ]
    runs = [simulate_config(compose_config([*args, f"engine.fast_forward={ff}"])) for ff in (1, 0)]
    on, off = runs
    assert on.requests_frame().equals(off.requests_frame())
    requests = on.requests_frame()
    gone = requests[requests.reason == "client_timeout"]
    at_gateway = gone[gone.gateway_dispatched_at.isna()]
    assert len(at_gateway) > 0 and (at_gateway.tokens_emitted == 0).all()
    assert len(gone) > len(at_gateway), "others gave up once dispatched"
    assert set(requests.status) <= {"completed", "rejected"}


def test_merged_tenants_keep_each_requests_client_timeout():
    from traces import ClientTimeout, merge

    patient = _busy_trace()
    hasty = ClientTimeout(2.0).apply(_busy_trace())
    both = merge({"patient": patient, "hasty": hasty})
    names = np.array(both.client_names)[both.client]
    assert (both.client_timeout[np.char.startswith(names.astype(str), "hasty")] == 2.0).all()
    assert np.isinf(both.client_timeout[np.char.startswith(names.astype(str), "patient")]).all()
    assert merge({"a": patient, "b": patient}).client_timeout is None


def test_a_request_swapped_out_to_the_cpu_tier_frees_it_when_its_client_gives_up():
    """Preempted by swapping its KV out to the CPU tier, a request waits; its client giving
    up then frees that CPU memory (the replica checks at the end that no request that ended
    still holds any)."""
    from test_cpu_kv_tier import swapping

    tr, cfg = swapping()
    tr = dataclasses.replace(tr, client_timeout=np.resize(np.array([np.inf, 1.0]), len(tr)))
    tl = simulate(tr, FCFS(), a10g_cost(), cfg)
    check_invariants(tl, cfg)
    assert tl.request_columns["swap_ins"].sum() > 0, "requests were swapped out and back"
    assert (tl.reason == "client_timeout").sum() > 0


# ---- what a policy charged ahead of service ------------------------------------------------
@pytest.mark.parametrize(
    "engine", [VLLMConfig(pool_tokens=10_000), SLoRAConfig(pool_tokens=10_000)], ids=str
)
def test_a_predicted_output_charge_is_refunded_for_the_tokens_an_abandoned_request_never_emitted(
    engine,
):
    """VTC with an oracle prediction (the VTC paper's VTC(predict) with a perfect predictor)
    charges a request's whole output when it is admitted and refunds any over-prediction at its
    finish. B's client gives up after a few tokens: B's client pays for what B emitted, as if
    its output had been that long (input price 1, output price 2), not for 100 tokens."""
    trace = two_clients(0.155)
    vtc = VTC(prediction="oracle")
    tl = simulate(trace, vtc, CONST, engine)
    assert tl.reason[1] == "client_timeout" and 0 < tl.generated[1] < 100
    assert vtc.counter.tolist() == [10 + 2 * 100, 10 + 2 * int(tl.generated[1])]
    # the refund is the last entry of B's client in the counter's log
    log = vtc.counter_events()
    last_b = log[log.client == "b"].iloc[-1]
    assert last_b.cause == "refund" and last_b.delta == -2 * (100 - int(tl.generated[1]))


def test_a_request_that_left_is_settled_once():
    """A prefill replica's policy (counters per pool) settles a request when it hands it off;
    if its client then gives up in the decode replica's queue, the runner tells the replica
    it was routed to, that same policy, again: nothing more is refunded."""
    from simulator.core.queue import WaitingQueue
    from simulator.core.seam import Left

    trace = two_clients(np.inf)
    vtc = VTC(prediction="oracle", lift="none")
    vtc.bind(trace)
    vtc.on_arrival(1, 0.0, WaitingQueue(trace.client.tolist()))
    vtc.admit(1, 0.0, True)
    assert vtc.counter[1] == 2 * 100  # the predicted output, charged ahead
    vtc.charge(Left(1, 0.1, 0))  # handed off: the decode pool charges the output
    vtc.charge(Left(1, 0.5, 1))  # its client gave up later, in the decode queue
    assert vtc.counter[1] == 0


def test_gateway_vtc_with_a_prediction_charges_abandoned_requests_only_the_tokens_they_emitted():
    """Flow control's VTC charges a dispatched request's prompt and its predicted output
    ahead. Every client here gives up before its request's 50 tokens are out (0.3 s; a prefill
    step takes 0.1 s and a decode step 0.01 s): each tenant's counter ends at what its
    dispatched requests were served, prompt x 1 + tokens emitted x 2 (no lift: plain sums)."""
    from test_gateway import clients_trace, flow

    from simulator.engines.runner import Runner
    from traces import ClientTimeout

    trace = ClientTimeout(0.3).apply(
        clients_trace({"heavy": 30.0, "light": 12.0}, duration=20.0, burst=5)
    )
    gateway = flow(VTC(prediction="oracle", lift="none"), fairness="vtc")
    cluster = ClusterConfig(2, "least_requests", gateway=gateway)
    runner = Runner(trace, FCFS(), CONST, VLLMConfig(pool_tokens=4000, max_num_seqs=16), cluster)
    tl = runner.close()
    check_accounting(tl)
    dispatched = ~np.isnan(tl.request_columns["gateway_dispatched_at"])
    assert (tl.reason == "client_timeout").all()
    assert (tl.generated[dispatched] > 0).sum() > 50, "many left mid-stream"
    assert runner.gateway is not None
    (band,) = runner.gateway.bands.values()
    served = trace.prompt_len + 2 * tl.generated
    for c in range(trace.num_clients):
        mine = dispatched & (trace.client == c)
        assert band.policy.counter[c] == served[mine].sum()


def test_latency_statistics_leave_out_requests_whose_clients_gave_up_mid_stream():
    """B's client gives up after 7 tokens: B has no end-to-end latency (benchmark clients count
    it as failed), so its client's latency statistics are empty and the run's are A's alone;
    B's 7 tokens still count as output."""
    from simulator.metrics.latency import latency_summary

    _, tl = two_requests(0.155)
    table = latency_summary(tl.requests_frame(), tl.tokens_frame())
    b, a, everyone = table["b"], table["a"], table["all"]
    assert b["requests"] == 1 and b["completed"] == 0 and b["output_tokens"] == 7
    assert np.isnan(b["e2e"]["mean"]) and np.isnan(b["ttft"]["mean"])
    assert np.isnan(b["tbt"]["mean"])
    assert a["e2e"]["mean"] == pytest.approx(0.1 + 99 * 0.01)  # A's last token, arrival 0
    for metric in ("ttft", "tpot", "e2e", "tbt"):
        assert everyone[metric] == a[metric], metric
    assert everyone["output_tokens"] == 107
