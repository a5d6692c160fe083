"""Prefill/decode disaggregation (simulator/engines/disaggregation.py, simulator/engines/pools.py):
the journey of a request across the pools, the KV link, the deciders, conservation across pools,
and VTC's service bound with counters shared by both pools."""

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_cluster import backlogged_pair, service_gap
from test_runner import assert_same_timeline, pushed_in_chunks
from test_vllm_engine import trace

from conftest import a10g_cost, check_accounting, random_trace, with_shared_prefixes
from cost_models import ConstantStepCost
from policies import FCFS, LCF, VTC
from simulator.core.errors import ConfigError
from simulator.core.requests import COMPLETED, IN_FLIGHT
from simulator.core.seam import ADMIT, Drop
from simulator.engines import ClusterConfig, SLoRAConfig, VLLMConfig, simulate

CONST = ConstantStepCost(prefill=0.1, decode=0.01)
MB = 1_000_000


def pd(prefill=1, decode=1, **disaggregation):
    return ClusterConfig(
        prefill_replicas=prefill, decode_replicas=decode, disaggregation=disaggregation
    )


def one_request_across_the_link(output_len: int):
    """A 100-token prompt prefilled in one 0.1 s step (its first token); 100 tokens x 1 MB over
    10 GB/s = 0.01 s plus 5 ms latency: the KV arrives at 0.115; decode steps of 10 ms."""
    tl = simulate(
        trace([0.0], [100], [output_len]),
        FCFS(),
        CONST,
        VLLMConfig(pool_tokens=10_000),
        pd(kv_bytes_per_token=MB, link_bandwidth_gbps=10.0, link_latency=0.005),
    )
    check_accounting(tl)
    return tl


def test_a_request_is_prefilled_moved_then_decoded_at_hand_computed_times():
    tl = one_request_across_the_link(5)  # decode steps of 10 ms from 0.115 give tokens 1-4
    cols = tl.request_columns
    assert cols["prefill_replica"][0] == 0 and cols["replica"][0] == 1
    assert tl.first_token_at[0] == pytest.approx(0.1)
    assert cols["kv_transfer_start"][0] == pytest.approx(0.1)
    assert cols["kv_transfer_end"][0] == pytest.approx(0.115)
    assert cols["kv_transfer_bytes"][0] == 100 * MB
    _, _, times = tl.token_times()
    assert times == pytest.approx([0.1, 0.125, 0.135, 0.145, 0.155])
    assert tl.info["kv_transfers"] == 1 and tl.info["kv_bytes_moved"] == 100 * MB
    assert tl.info["kv_used_at_end"] == 0


def test_a_request_whose_kv_arrived_decodes_its_tokens_in_one_run(monkeypatch):
    """Its token run opens when it joins the batch, so nothing keeps the decode replica from a
    run of decode steps: after the decision that admits it (its blocks claimed, the transfer
    started, decoding nothing yet) and the idle wait for its KV, the 40 tokens left come in
    one run, at the hand-computed times of stepping one by one."""
    from simulator.engines.vllm import DecodeRunPlan, VLLMReplica

    plans: list[tuple[int, str]] = []
    schedule = VLLMReplica.schedule

    def recorded(self, frontier):
        plan = schedule(self, frontier)
        if plan is not None:
            plans.append((self.index, "run" if type(plan) is DecodeRunPlan else "step"))
        return plan

    monkeypatch.setattr(VLLMReplica, "schedule", recorded)
    tl = one_request_across_the_link(41)
    assert [kind for replica, kind in plans if replica == 1] == ["run"]
    _, _, times = tl.token_times()
    assert times == pytest.approx([0.1, *(0.115 + 0.01 * np.arange(1, 41))])


@pytest.mark.parametrize("shared, second_end", [(False, 0.115), (True, 0.125)])
def test_a_shared_link_makes_transfers_queue(shared, second_end):
    # both prompts are prefilled in one step and handed off at 0.1; on one shared link the
    # second transfer's bytes wait for the first's (0.11), then take 0.01 s, then the latency
    tl = simulate(
        trace([0.0, 0.0], [100, 100], [3, 3]),
        FCFS(),
        CONST,
        VLLMConfig(pool_tokens=10_000),
        pd(
            kv_bytes_per_token=MB,
            link_bandwidth_gbps=10.0,
            link_latency=0.005,
            shared_link=shared,
        ),
    )
    ends = sorted(tl.request_columns["kv_transfer_end"].tolist())
    assert ends == pytest.approx([0.115, second_end])


def test_the_deciders_choose_which_prompts_cross():
    cfg = VLLMConfig(pool_tokens=10_000)
    tr = trace([0.0, 0.0], [100, 200], [3, 3])
    above = simulate(
        tr, FCFS(), CONST, cfg, pd(decider="prompt_above", threshold=150, kv_bytes_per_token=1)
    )
    assert above.request_columns["prefill_replica"].tolist() == [-1, 0]
    never = simulate(tr, FCFS(), CONST, cfg, pd(decider="never", kv_bytes_per_token=1))
    assert never.request_columns["prefill_replica"].tolist() == [-1, -1]
    assert never.info["kv_transfers"] == 0
    # the second request shares the first's 160-token prompt: once the first's KV has reached
    # the decode replica (and entered its prefix cache), the second's miss is under 50 tokens
    hashes = [np.arange(10), np.arange(10)]
    tr2 = trace([0.0, 2.0], [160, 160], [3, 3], hashes=hashes)
    miss = simulate(
        tr2, FCFS(), CONST, cfg, pd(decider="cache_miss_above", threshold=50, kv_bytes_per_token=1)
    )
    assert miss.request_columns["prefill_replica"].tolist() == [0, -1]
    assert miss.request_columns["cached_tokens"][1] >= 160 - 16


def test_decider_never_serves_as_co_located_replicas_do():
    tr = random_trace(seed=3, n=150, clients=3, max_prompt=300, max_output=60, rate=25.0)
    cfg = VLLMConfig(pool_tokens=3000, max_num_batched_tokens=256)
    co = simulate(tr, VTC(), a10g_cost(), cfg, ClusterConfig(2, "least_requests"))
    never = simulate(
        tr,
        VTC(),
        a10g_cost(),
        cfg,
        pd(1, 2, decider="never", decode_dispatcher="least_requests", kv_bytes_per_token=1),
    )
    for key in ("first_token_at", "finished_at", "admitted_at"):
        assert np.array_equal(getattr(co, key), getattr(never, key), equal_nan=True), key
    assert np.array_equal(co.request_columns["replica"] + 1, never.request_columns["replica"])
    for a, b in zip(co.token_times(), never.token_times(), strict=True):
        assert np.array_equal(a, b)


def check_pools(tl, prefill_cfg, decode_cfg, prefill):
    """Conservation across pools: accounting and tokens, each replica within its own pool and
    limits, the first token at the prefill's end, no decode before the KV has arrived."""
    rows, index, times = check_accounting(tl)
    steps, cols = tl.steps, tl.request_columns
    for rep in np.unique(steps["replica"]):
        mine = steps["replica"] == rep
        cfg = prefill_cfg if rep < prefill else decode_cfg
        assert (steps["kv_used"][mine] <= cfg.pool_tokens).all(), "a replica's pool holds"
        assert (steps["start"][mine][1:] >= steps["end"][mine][:-1]).all(), "no overlap"
        assert steps["num_tokens"][mine].max(initial=0) <= cfg.max_num_batched_tokens
        assert steps["batch_size"][mine].max(initial=0) <= cfg.max_num_seqs
    # made with nothing left to run: the horizon came first, or the clients left gave up
    unrecorded = tl.info.get("preemptions_not_in_steps", 0)
    assert cols["preemptions"].sum() == steps["preempted"].sum() + unrecorded
    gave_up = (tl.reason == "client_timeout").any()
    assert unrecorded == 0 or decode_cfg.horizon is not None or gave_up
    crossed = cols["prefill_replica"] >= 0
    moved = np.isfinite(cols["kv_transfer_end"])
    assert not (moved & ~crossed).any(), "only disaggregated requests move KV"
    assert (cols["replica"][moved] >= prefill).all(), "they end on a decode replica"
    first = index == 0
    on_prefill = crossed[rows[first]]
    prefill_ends = steps["end"][steps["replica"] < prefill]
    assert np.isin(times[first][on_prefill], prefill_ends).all(), "first token: prefill's end"
    later = (index > 0) & crossed[rows]
    arrived = cols["kv_transfer_end"][rows[later]]
    assert (times[later] > arrived).all(), "no decode token before the transfer ends"
    for r in np.flatnonzero(moved):  # the first decode step starts once the KV is there
        t1 = times[(rows == r) & (index == 1)]
        if t1.size:
            step = (steps["replica"] == cols["replica"][r]) & (steps["end"] == t1[0])
            assert (steps["start"][step] >= cols["kv_transfer_end"][r]).all()
    if decode_cfg.horizon is None:
        assert not (tl.status == IN_FLIGHT).any()
        assert tl.info["kv_used_at_end"] == 0, "both pools free every block"
    else:
        assert set(tl.reason[tl.status == IN_FLIGHT]) <= {
            "not_arrived",
            "queued",
            "running",
            "preempted",
            "kv_transfer",
            "kv_load",
        }


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 1000),
    prefill=st.integers(1, 2),
    decode=st.integers(1, 3),
    decider=st.sampled_from(["always", "prompt_above", "cache_miss_above"]),
    shared_link=st.booleans(),
    counters=st.sampled_from(["per_pool", "shared"]),
    pools=st.sampled_from([(800, 800), (4000, 1200), (50_000, 50_000)]),
    horizon=st.sampled_from([None, 2.0]),
    make_policy=st.sampled_from([FCFS, VTC, LCF]),
    cpu_tier=st.sampled_from(["none", "recompute", "swap"]),
    dispatcher=st.sampled_from(
        ["least_requests", "round_robin", "least_tokens", "scored", "stale"]
    ),
    gives_up=st.sampled_from([None, None, (0.2, 1.0, np.inf)]),  # clients' timeouts, cycled
)
# found by this search: a decode run's one step spanning an arrival took its blocks only at
# its end, so the decider read a prefix cache stepping one by one had already evicted from
@example(384, 1, 1, "cache_miss_above", False, "per_pool", (4000, 1200), None, FCFS, "none",
         "least_requests", None)  # fmt: skip
def test_every_request_and_block_is_accounted_for_across_the_pools(
    seed,
    prefill,
    decode,
    decider,
    shared_link,
    counters,
    pools,
    horizon,
    make_policy,
    cpu_tier,
    dispatcher,
    gives_up,
):
    if counters == "shared" and make_policy is FCFS:
        counters = "per_pool"
    tr = random_trace(seed=seed, n=80, clients=3, max_prompt=300, max_output=60, rate=30.0)
    tr = with_shared_prefixes(tr, seed)  # prefix caches, and CPU-tier loads, on both pools
    if gives_up is not None:  # waiting, prefilling, handed off, moving or decoding
        tr = dataclasses.replace(tr, client_timeout=np.resize(np.array(gives_up), len(tr)))
    tier = {} if cpu_tier == "none" else {"cpu_kv_tokens": 640, "preemption_mode": cpu_tier}
    base = VLLMConfig(
        max_num_batched_tokens=256,
        max_num_seqs=8,
        horizon=horizon,
        kv_bytes_per_token=128 * 1024,
        **tier,
    )
    prefill_cfg = VLLMConfig(**{**vars(base), "pool_tokens": pools[0]})
    decode_cfg = VLLMConfig(**{**vars(base), "pool_tokens": pools[1]})
    # "stale": the scored dispatcher reading snapshots taken every 0.3 s, seen 0.1 s later
    routing = {"scrape_interval": 0.3, "delay": 0.1} if dispatcher == "stale" else {}
    name = "scored" if dispatcher == "stale" else dispatcher
    cluster = pd(
        prefill,
        decode,
        prefill_dispatcher=name,
        decode_dispatcher=name,
        decider=decider,
        threshold=100,
        shared_link=shared_link,
        counters=counters,
        kv_bytes_per_token=128 * 1024,
        link_bandwidth_gbps=1.0,
        prefill_engine={"pool_tokens": pools[0]},
        decode_engine={"pool_tokens": pools[1]},
    )
    cluster = ClusterConfig(
        prefill_replicas=prefill,
        decode_replicas=decode,
        disaggregation=cluster.disaggregation,
        routing=routing,
    )
    tl = simulate(tr, make_policy(), a10g_cost(), base, cluster)
    check_pools(tl, prefill_cfg, decode_cfg, prefill)
    # fast-forward off (each decode replica steps one at a time) gives the same run, bit for bit
    stepping = VLLMConfig(**{**vars(base), "fast_forward": False})
    again = simulate(tr, make_policy(), a10g_cost(), stepping, cluster)
    assert tl.requests_frame().equals(again.requests_frame())
    for a, b in zip(tl.token_times(), again.token_times(), strict=True):
        assert np.array_equal(a, b)
    for key in tl.steps:
        assert np.array_equal(tl.steps[key], again.steps[key]), key


def requests_held(tl):
    """The most requests admitted (on either pool) and not yet finished at one instant."""
    times = np.concatenate([tl.admitted_at, tl.finished_at])
    step = np.concatenate([np.ones(len(tl.admitted_at)), -np.ones(len(tl.finished_at))])
    order = np.lexsort((step, times))  # at one instant, finishes before admissions
    return int(np.cumsum(step[order]).max())


def test_shared_counters_keep_backlogged_clients_within_the_bound_and_fcfs_does_not():
    # docs/metrics.md, "Fairness across disaggregated pools": with one set of counters charged
    # by both pools, two clients backlogged in the prefill queue stay within N x U, N the most
    # requests admitted and unfinished at once, U = w_p L_in + w_q L_out of one request
    tr = backlogged_pair()
    cfg = VLLMConfig(pool_tokens=4000, max_num_batched_tokens=512, max_num_seqs=16)
    cost = a10g_cost()
    fair = simulate(
        tr, VTC(), cost, cfg, pd(1, 2, counters="shared", kv_bytes_per_token=512 * 1024)
    )
    fcfs = simulate(tr, FCFS(), cost, cfg, pd(1, 2, kv_bytes_per_token=512 * 1024))
    until = 0.8 * min(fair.finished_at[tr.client == 1].max(), fcfs.finished_at.max())
    bound = requests_held(fair) * (64 + 2 * 64)
    assert requests_held(fair) >= 3 * 16, "the pools held more than their running batches"
    assert service_gap(fair, "a", "b", until) <= bound
    assert service_gap(fair, "a", "b", until / 2) <= bound
    half, full = service_gap(fcfs, "a", "b", until / 2), service_gap(fcfs, "a", "b", until)
    assert full > bound and full > 1.6 * half


def test_per_pool_counters_log_each_replicas_charges():
    tr = random_trace(seed=5, n=60, clients=2, max_prompt=200, max_output=30, rate=20.0)
    cfg = VLLMConfig(pool_tokens=5000)
    per_pool = simulate(tr, VTC(), a10g_cost(), cfg, pd(1, 1, kv_bytes_per_token=1))
    shared = simulate(
        tr, VTC(), a10g_cost(), cfg, pd(1, 1, counters="shared", kv_bytes_per_token=1)
    )
    assert sorted(per_pool.counters.replica.unique()) == [0, 1]
    assert "replica" not in shared.counters
    # the prefill replica charges prompts, the decode replica output tokens; shared, one log
    # holds both, and the service charged agrees (the lifts differ: they follow the counters)
    logs = per_pool.counters
    assert set(logs.cause[logs.replica == 0]) - {"lift"} == {"prompt"}
    assert set(logs.cause[logs.replica == 1]) - {"lift"} == {"decode"}

    def served(f):
        return f[f.cause.isin(["prompt", "decode"])].groupby("client").delta.sum().sort_index()

    assert served(logs).equals(served(shared.counters))


def test_per_pool_counters_charge_a_predicted_output_to_the_decode_pool_alone():
    """VTC with an oracle prediction charges a request's whole output when it is admitted. A
    prefill replica serves the prompt and hands the request off: under per-pool counters its
    policy gives the prediction back then (the decode pool's policy charges the output), so
    the two pools together charge what one shared set of counters does, and the prefill pool
    keeps only the prompts (and the outputs of one-token requests, which end there)."""
    tr = random_trace(seed=5, n=60, clients=2, max_prompt=200, max_output=30, rate=20.0)
    cfg = VLLMConfig(pool_tokens=5000)
    runs = {
        counters: simulate(
            tr,
            VTC(prediction="oracle"),
            a10g_cost(),
            cfg,
            pd(1, 1, counters=counters, kv_bytes_per_token=1),
        )  # fmt: skip
        for counters in ("per_pool", "shared")
    }

    def charged(log):
        return log[log.cause != "lift"].groupby("client").delta.sum().sort_index()

    per_pool = runs["per_pool"].counters
    assert charged(per_pool).tolist() == pytest.approx(charged(runs["shared"].counters).tolist())
    requests = runs["per_pool"].requests_frame()
    ended_at_prefill = ((requests.replica == 0) & (requests.status == "completed")).to_numpy()
    assert ended_at_prefill.sum() > 0 and (tr.output_len[ended_at_prefill] == 1).all()
    prefill = per_pool[(per_pool.replica == 0) & (per_pool.cause != "lift")]
    for c, name in enumerate(tr.client_names):
        prompts = tr.prompt_len[(tr.client == c)].sum()
        outputs = 2 * tr.output_len[(tr.client == c) & ended_at_prefill].sum()
        assert prefill[prefill.client == name].delta.sum() == pytest.approx(prompts + outputs)


class DropsAtDecode(VTC):
    """VTC that drops every third request the second time it is admitted (by the decode
    pool, one policy object shared by both pools): a decode replica's policy rejecting a
    handed-off request."""

    def bind(self, trace):
        super().bind(trace)
        self.admitted_once = set()

    def admit(self, req, now, fits):
        if req in self.admitted_once and req % 3 == 0:
            return Drop("dropped_at_decode")
        verdict = super().admit(req, now, fits)
        if verdict is ADMIT:
            self.admitted_once.add(req)
        return verdict


def test_a_request_the_decode_pool_drops_frees_its_kv_on_the_prefill_replica():
    tr = random_trace(seed=4, n=60, clients=2, max_prompt=300, max_output=40, rate=20.0)
    cfg = VLLMConfig(pool_tokens=4000, max_num_batched_tokens=256)
    tl = simulate(
        tr, DropsAtDecode(), a10g_cost(), cfg, pd(2, 1, counters="shared", kv_bytes_per_token=1)
    )
    dropped = tl.reason == "dropped_at_decode"
    assert dropped.sum() >= 10 and (tl.generated[dropped] == 1).all(), "after the first token"
    assert np.isnan(tl.request_columns["kv_transfer_start"][dropped]).all(), "nothing moved"
    check_pools(tl, cfg, cfg, prefill=2)  # every block of both pools free at the end


@pytest.mark.parametrize("counters", ["per_pool", "shared"])
def test_arrivals_pushed_while_the_pools_run_give_the_offline_timeline(counters):
    # live mode's way in: arrivals known only up to a frontier that moves in chunks
    tr = random_trace(seed=9, n=120, clients=3, max_prompt=300, max_output=50, rate=25.0)
    cfg = VLLMConfig(pool_tokens=3000, max_num_batched_tokens=256, max_num_seqs=8)
    cluster = pd(2, 2, counters=counters, kv_bytes_per_token=128 * 1024, link_bandwidth_gbps=1.0)
    offline = simulate(tr, VTC(), a10g_cost(), cfg, cluster)
    online = pushed_in_chunks(tr, VTC, cfg, cluster, cuts=[0.7, 1.3, 2.05, 3.5])
    assert_same_timeline(offline, online)


def test_bad_disaggregation_configs_get_one_line_naming_the_key():
    cases = [
        (dict(prefill_replicas=1), "cluster.prefill_replicas > 0 needs cluster.decode_replicas"),
        (dict(decode_replicas=2), "cluster.decode_replicas is set"),
        (dict(prefill_replicas=-1), "cluster.prefill_replicas must be an integer"),
        (dict(prefill_replicas=1, decode_replicas=1, replicas=3), "cluster.replicas=3"),
        (
            dict(prefill_replicas=1, decode_replicas=1, disaggregation={"decider": "coin"}),
            "decider",
        ),
        (
            dict(prefill_replicas=1, decode_replicas=1, disaggregation={"link_bandwidth_gbps": 0}),
            "link_bandwidth_gbps",
        ),
        (dict(prefill_replicas=1, decode_replicas=1, disaggregation={"linkbw": 1}), "unknown key"),
        # text where a number belongs (the CLI fuzz test's find: it was an internal error)
        (dict(disaggregation={"threshold": "abc"}), "threshold must be an integer >= 0"),
        (dict(disaggregation={"link_latency": "abc"}), "link_latency must be a number"),
        (dict(disaggregation={"kv_bytes_per_token": "x"}), "kv_bytes_per_token must be null"),
        (dict(disaggregation={"shared_link": "yes"}), "shared_link must be true or false"),
        (
            dict(
                prefill_replicas=1,
                decode_replicas=1,
                disaggregation={"decode_dispatcher": "central"},
            ),
            "decode_dispatcher",
        ),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            ClusterConfig(**kwargs)
    tr = trace([0.0], [10], [2])
    with pytest.raises(ConfigError, match="needs engine=vllm"):
        simulate(tr, FCFS(), CONST, SLoRAConfig(pool_tokens=100), pd(kv_bytes_per_token=1))
    with pytest.raises(ConfigError, match="kv_bytes_per_token is null"):
        simulate(tr, FCFS(), CONST, VLLMConfig(pool_tokens=100), pd())
    with pytest.raises(ConfigError, match="counters=shared needs a policy with per-client"):
        simulate(
            tr,
            FCFS(),
            CONST,
            VLLMConfig(pool_tokens=100),
            pd(counters="shared", kv_bytes_per_token=1),
        )
    with pytest.raises(ConfigError, match="prefill_engine: unknown setting"):
        simulate(
            tr,
            FCFS(),
            CONST,
            VLLMConfig(pool_tokens=100),
            pd(kv_bytes_per_token=1, prefill_engine={"pool": 1}),
        )


def test_a_prompt_no_prefill_replica_can_hold_is_refused():
    tl = simulate(
        trace([0.0, 0.0], [500, 50], [5, 5]),
        FCFS(),
        CONST,
        VLLMConfig(pool_tokens=10_000),
        pd(kv_bytes_per_token=1, prefill_engine={"pool_tokens": 256}),
    )
    assert tl.reason[0] == "kv_pool_too_small" and tl.status[1] == COMPLETED
