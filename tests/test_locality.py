"""Prefix-locality scheduling (policies/lpm.py) on engine=vllm with prefix caching: LPM serves
the longest cached prefix first and so starves a client whose prompts share nothing; DLPM keeps
the deficit bound between backlogged clients on random prefix-heavy workloads and serves more
than VTC on the prefix-heavy mix."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fairness_theory import backlog_intervals, intersect, pair_swings

from conftest import a10g_cost
from policies import DLPM, FCFS, LPM, VTC, Andes
from simulator.core.errors import ConfigError
from simulator.core.seam import (
    ADMIT,
    Finished,
    OutputTokens,
    PromptTokens,
    ReplicaAware,
    Rescheduler,
)
from simulator.engines import SLoRAConfig, VLLMConfig, simulate
from traces import PrefixHeavyMix, Trace

W_P, W_Q = 1.0, 2.0


def three_requests() -> Trace:
    """a (client 0) fills the cache with a 512-token prefix; b (client 1, nothing shared) and
    c (client 0, the same prefix) wait behind it, b first."""
    prefix = np.arange(8)
    return Trace.from_columns(
        client=["c0", "c1", "c0"],
        arrival=[0.0, 0.01, 0.02],
        prompt_len=[600, 600, 600],
        output_len=[40, 40, 40],
        block_hashes=[np.r_[prefix, 100], np.arange(200, 210), np.r_[prefix, 101]],
        hash_block_tokens=64,
    )


def test_lpm_tries_the_longest_cached_prefix_first_where_fcfs_keeps_arrival_order():
    engine = VLLMConfig(pool_tokens=20_000, max_num_seqs=1)
    lpm = simulate(three_requests(), LPM(), a10g_cost(), engine)
    fcfs = simulate(three_requests(), FCFS(), a10g_cost(), engine)
    assert lpm.admitted_at[2] < lpm.admitted_at[1]  # c (cache hit) before b
    assert fcfs.admitted_at[1] < fcfs.admitted_at[2]
    assert lpm.request_columns["cached_tokens"].tolist() == [0, 0, 512]


@pytest.mark.parametrize("policy", [LPM(), DLPM(), Andes()], ids=lambda p: p.name)
def test_a_policy_that_reads_its_replica_is_refused_by_an_engine_without_that_hook(policy):
    """The engine checks the policy's optional hooks when it builds its replicas, so the error
    comes before any request is served (a trace whose only request arrives past the horizon)
    and names the engine that offers them."""
    late = Trace.from_columns(client=["a"], arrival=[50.0], prompt_len=[10], output_len=[5])
    engine = SLoRAConfig(pool_tokens=20_000, horizon=1.0)
    with pytest.raises(ConfigError, match=r"which engine=slora does not offer; use engine=vllm$"):
        simulate(late, policy, a10g_cost(), engine)
    with pytest.raises(ConfigError, match="needs a prefix cache"):  # a policy used by hand
        LPM().ranked_window(None)  # type: ignore[arg-type]


def test_the_typed_hooks_say_what_each_policy_needs():
    assert isinstance(LPM(), ReplicaAware) and not isinstance(LPM(), Rescheduler)
    assert isinstance(Andes(), ReplicaAware) and isinstance(Andes(), Rescheduler)
    assert not isinstance(FCFS(), ReplicaAware) and not isinstance(VTC(), Rescheduler)


def service_bound(trace: Trace, pool: int, quantum: float) -> float:
    """2 (U + Q): U the VTC paper's U (longest prompt, KV pool), Q DLPM's quantum."""
    return 2 * (max(W_P * trace.prompt_len.max(), W_Q * pool) + quantum)


def timeline_service(tl, client: int, times: np.ndarray) -> np.ndarray:
    """Service client `client` received by each time, priced as DLPM charges it: w_p per prompt
    token computed (cache hits free) at admission, w_q per output token after the first."""
    t = tl.trace
    mine = np.flatnonzero(t.client == client)
    admitted = tl.admitted_at[mine]
    computed = t.prompt_len[mine] - tl.request_columns["cached_tokens"][mine]
    rows, index, when = tl.token_times()
    out = np.isin(rows, mine) & (index > 0)
    events = np.concatenate([admitted[~np.isnan(admitted)], when[out]])
    amounts = np.concatenate([W_P * computed[~np.isnan(admitted)], np.full(out.sum(), W_Q)])
    order = np.argsort(events, kind="stable")
    total = np.concatenate(([0.0], np.cumsum(amounts[order])))
    return total[np.searchsorted(events[order], times, side="right")]


@pytest.mark.slow
def test_lpm_starves_a_client_without_shared_prefixes_beyond_dlpms_bound():
    """Constructed: shared0 keeps a queue of cache-hitting turns, unique0's prompts share
    nothing. Under LPM unique0's backlog sees shared0 served far beyond 2 (U + Q); DLPM on the
    same trace stays within it."""
    mix = PrefixHeavyMix(duration=40, shared_clients=1, unique_clients=1, rate=2.0,
                         think_time=0.0, turns=6)  # fmt: skip
    trace = mix.build(1)
    engine = VLLMConfig(pool_tokens=12_000, max_num_batched_tokens=2048)
    bound = service_bound(trace, 12_000, 10_000.0)
    swings = {}
    for policy in (LPM(), DLPM()):
        tl = simulate(trace, policy, a10g_cost(), engine)
        worst = 0.0
        for lo, hi in backlog_intervals(tl, 1):  # while unique0 waits
            times = np.linspace(lo, min(hi, float(np.nanmax(tl.finished_at))), 400)
            gap = timeline_service(tl, 0, times) - timeline_service(tl, 1, times)
            worst = max(worst, float((gap - np.minimum.accumulate(gap)).max()))
        swings[policy.name] = worst
    print({k: round(v) for k, v in swings.items()}, "bound", round(bound))
    assert swings["lpm"] > 2 * bound
    assert swings["dlpm"] <= bound


small_mixes = st.builds(
    PrefixHeavyMix,
    duration=st.sampled_from([15.0, 30.0]),
    shared_clients=st.integers(1, 2),
    unique_clients=st.integers(1, 2),
    rate=st.sampled_from([0.5, 2.0]),
    system_prompt=st.sampled_from([256, 1500]),
    turns=st.integers(1, 4),
    user_tokens=st.sampled_from([50, 300]),
    output_tokens=st.sampled_from([20, 150]),
    unique_prompt=st.sampled_from([200, 1500]),
    think_time=st.sampled_from([0.0, 1.0]),
)


class CheckedDLPM(DLPM):
    """DLPM that measures U': the most its client's running requests still owed right after one
    of its admissions (prompt tokens not yet charged x w_p, output tokens after the first not
    yet charged x w_q). A client is only picked in credit, so its counter never falls below
    -U'; with refills reaching backlogged clients alike, their service differs by at most
    2 (U' + Q). U' replaces the VTC paper's U for the reason tests/test_fairness_theory.py
    gives: chunked prefill and several admissions in one step let a client owe more than one
    prompt and the pool's tokens."""

    charged = DLPM.charged | {Finished}

    def bind(self, trace):
        super().bind(trace)
        self.owed_by: dict[int, float] = {}  # running request -> charges still to come
        self.u_prime = 0.0

    def admit(self, req, now, fits):
        verdict = super().admit(req, now, fits)
        if verdict is ADMIT and req not in self.owed_by:
            t = self.trace
            self.owed_by[req] = W_P * t.prompt_len[req] + W_Q * (t.output_len[req] - 1)
            c = t.client[req]
            owed = sum(v for r, v in self.owed_by.items() if t.client[r] == c)
            self.u_prime = max(self.u_prime, owed)
        return verdict

    def charge(self, event):
        super().charge(event)
        if isinstance(event, PromptTokens) and event.req in self.owed_by:
            self.owed_by[event.req] -= W_P * event.tokens
        elif isinstance(event, OutputTokens):
            for req in event.rows.tolist():
                if req in self.owed_by:
                    self.owed_by[req] -= W_Q * event.step_ends.shape[0]
        elif isinstance(event, Finished):
            self.owed_by.pop(event.req, None)


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_mixes, st.integers(0, 1000), st.sampled_from([500.0, 10_000.0]))
def test_dlpm_keeps_backlogged_clients_within_its_bound(mix, seed, quantum):
    trace = mix.build(seed)
    policy = CheckedDLPM(quantum=quantum)
    tl = simulate(trace, policy, a10g_cost(), VLLMConfig(pool_tokens=8000))
    bound = 2 * (policy.u_prime + quantum)
    for f in range(trace.num_clients):
        for g in range(trace.num_clients):
            if f != g and intersect(backlog_intervals(tl, f), backlog_intervals(tl, g)):
                both, _ = pair_swings(tl, policy, f, g)
                assert both <= bound


def test_dlpm_bound_on_the_case_hypothesis_found():
    """Two shared clients with chained turns and one unshared client whose longest prompts the
    pool refuses: hypothesis found a swing of 55,410 here while the backlog helper still
    counted refused requests (and chained calls' placeholder arrival times) as waiting; with
    waiting as it is, the swing is a tenth of the bound."""
    mix = PrefixHeavyMix(duration=15.0, shared_clients=2, unique_clients=1, rate=2.0,
                         system_prompt=256, turns=3, user_tokens=300, output_tokens=150,
                         unique_prompt=1500, think_time=0.0)  # fmt: skip
    trace = mix.build(208)
    policy = CheckedDLPM(quantum=500.0)
    tl = simulate(trace, policy, a10g_cost(), VLLMConfig(pool_tokens=8000))
    assert (tl.status == 2).any()  # some prompts never fit: refused on arrival
    swings = [pair_swings(tl, policy, f, g)[0] for f in range(3) for g in range(3) if f != g]
    assert max(swings) <= 2 * (policy.u_prime + 500.0)


@pytest.mark.slow
def test_dlpm_serves_more_than_vtc_on_the_prefix_heavy_mix():
    """The paper's headline (up to 2.87x VTC's throughput), on the built-in mix under overload
    with more clients' system prompts than the KV pool holds: VTC interleaves clients and
    evicts their prefixes; DLPM lets a client in credit keep its prefix hot."""
    mix = PrefixHeavyMix(duration=60, shared_clients=8, unique_clients=2, rate=0.3,
                         system_prompt=4000, turns=3, think_time=1.0)  # fmt: skip
    trace = mix.build(0)
    engine = VLLMConfig(pool_tokens=16_000)
    dlpm = DLPM()
    runs = {p.name: simulate(trace, p, a10g_cost(), engine) for p in (VTC(), dlpm)}
    done = {k: np.nanmax(tl.finished_at) for k, tl in runs.items()}
    tokens = {k: (tl.trace.prompt_len + tl.trace.output_len)[tl.status == 0].sum()
              for k, tl in runs.items()}  # fmt: skip
    rate = {k: tokens[k] / done[k] for k in runs}
    hits = {k: tl.request_columns["cached_tokens"].sum() / tl.trace.prompt_len.sum()
            for k, tl in runs.items()}  # fmt: skip
    print(f"throughput DLPM / VTC = {rate['dlpm'] / rate['vtc']:.2f}; "
          f"prefix hit rate VTC {hits['vtc']:.2f}, DLPM {hits['dlpm']:.2f}")  # fmt: skip
    assert hits["dlpm"] > hits["vtc"] + 0.2
    assert rate["dlpm"] > 1.2 * rate["vtc"]
    bound = service_bound(trace, 16_000, dlpm.quantum)  # ... while keeping its bound
    tl = runs["dlpm"]
    for f in range(trace.num_clients):
        for g in range(f + 1, trace.num_clients):
            assert pair_swings(tl, dlpm, f, g)[0] <= bound


@pytest.mark.slow
def test_the_policy_table_puts_the_locality_policies_beside_vtc_with_the_papers_figure(
    capsys, tmp_path
):
    from simulator.apps.papers.policy_table import main

    rows = tmp_path / "rows.json"
    args = ["--policy", "vtc", "--policy", "lpm", "--policy", "dlpm", "--json", str(rows)]
    main([*args, "workload.duration=20"])
    out = capsys.readouterr().out
    dlpm_line = next(line for line in out.splitlines() if line.startswith("dlpm"))
    assert "up to 2.87x VTC's" in dlpm_line  # the paper's claim beside the measured ratio
    measured = json.loads(rows.read_text())
    hit = {k: v["prefix_hit_rate"] for k, v in measured.items()}
    assert hit["lpm"] >= hit["dlpm"] > hit["vtc"]  # locality: LPM, then DLPM, then VTC


class FakeReplica:
    """What D2LPM reads of a replica: its cache's match for a request, the work it brings."""

    def __init__(self, matches: dict[int, int]) -> None:
        self.matches = matches

    def cached_tokens_now(self, req: int) -> int:
        return self.matches.get(req, 0)

    def remaining_tokens(self, req: int) -> int:
        return 5000


def test_d2lpm_follows_the_cache_among_replicas_in_load_credit():
    from simulator.engines.dispatch import D2LPM

    dispatcher = D2LPM(2, [0] * 60)
    replicas = [FakeReplica({}), FakeReplica({r: 4000 for r in range(60)})]  # 1 caches all
    routes = [dispatcher.route(r, replicas) for r in range(60)]  # type: ignore[arg-type]
    # on replica 1 a request is 1,000 tokens of work, on replica 0 5,000: replica 1 takes
    # requests until its credit is spent, then replica 0 takes some, and the work each was
    # charged stays within a quantum (plus a request) of the other's
    assert routes[:16] == [1] * 16 and 0 in routes
    work = [routes.count(0) * 5000, routes.count(1) * 1000]
    assert abs(work[0] - work[1]) <= D2LPM.quantum + 5000


def test_d2lpm_needs_the_vllm_engine():
    from simulator.engines import ClusterConfig

    trace = PrefixHeavyMix(duration=10).build(0)
    with pytest.raises(ConfigError, match="d2lpm needs engine=vllm"):
        simulate(trace, VTC(), a10g_cost(), SLoRAConfig(pool_tokens=40_000),
                 ClusterConfig(2, "d2lpm"))  # fmt: skip


@pytest.mark.slow
def test_d2lpm_with_dlpm_lowers_per_client_latency_below_round_robin_with_vtc():
    """The paper's distributed claim (per-client latency up to 7.18x lower than a distributed
    baseline), on two replicas serving the prefix-heavy mix: the mean over clients of each
    client's mean E2E latency. The clients without shared prefixes are slower under DLPM (their
    prompts never hit the cache), so the worst client is not always better: reported, not
    asserted."""
    from simulator.engines import ClusterConfig

    mix = PrefixHeavyMix(duration=60, shared_clients=8, unique_clients=2, rate=0.25,
                         system_prompt=4000, turns=3, think_time=1.0)  # fmt: skip
    trace = mix.build(0)
    engine = VLLMConfig(pool_tokens=16_000)
    e2e = {}
    for name, policy, dispatcher in (("rr+vtc", VTC(), "round_robin"),
                                     ("d2lpm+dlpm", DLPM(), "d2lpm")):  # fmt: skip
        tl = simulate(trace, policy, a10g_cost(), engine, ClusterConfig(2, dispatcher))
        r = tl.requests_frame()
        done = r[r.status == "completed"]
        e2e[name] = (done.finished_at - done.arrival).groupby(done.client, observed=True).mean()
    mean = {k: float(v.mean()) for k, v in e2e.items()}
    worst = {k: float(v.max()) for k, v in e2e.items()}
    print(f"mean per-client E2E: D2LPM {mean['d2lpm+dlpm']:.1f} s, round robin + VTC "
          f"{mean['rr+vtc']:.1f} s; worst client {worst['d2lpm+dlpm']:.1f} s vs "
          f"{worst['rr+vtc']:.1f} s")  # fmt: skip
    assert mean["d2lpm+dlpm"] < 0.9 * mean["rr+vtc"]
