"""The vLLM-style engine (simulator/engines/vllm.py): paged blocks, chunked prefill, recompute
preemption, prefix caching, fast-forward, and the policies' charges on it."""

from collections import Counter
from itertools import takewhile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine import workloads

from conftest import a10g_cost, check_accounting, installed_data, random_trace
from cost_models import ConstantStepCost, RooflineCost
from policies import FCFS, LCF, RPM, VTC
from policies.base import BasePolicy
from policies.fairserve import FairServe
from simulator.core.requests import COMPLETED, IN_FLIGHT
from simulator.core.seam import PromptTokens
from simulator.engines import VLLMConfig, simulate
from simulator.engines.kv_blocks import BlockPool, block_keys
from simulator.metrics import replicas
from traces import PrefixHeavyMix, ScaleTokens, Trace
from traces.agentic import load_agentic_sessions

CONST = ConstantStepCost(prefill=0.1, decode=0.01)


def trace(arrival, prompt, output, client=None, hashes=None, hash_block=16):
    n = len(arrival)
    return Trace.from_columns(
        client=client or ["a"] * n,
        arrival=arrival,
        prompt_len=prompt,
        output_len=output,
        block_hashes=hashes,
        hash_block_tokens=hash_block,
    )


def check_invariants(tl, cfg):
    """Accounting, token conservation, ordering and memory, for any vLLM run."""
    rows, index, times = check_accounting(tl)
    assert (np.diff(rows) >= 0).all()
    same = rows[1:] == rows[:-1]
    assert (np.diff(index)[same] == 1).all(), "token indices run 0, 1, 2, ..."
    first = index == 0
    assert (times[first] == tl.first_token_at[rows[first]]).all()
    steps = tl.steps
    assert (steps["kv_used"] <= tl.pool_tokens).all(), "memory never exceeds the pool"
    for rep in np.unique(steps["replica"]):
        mine = steps["replica"] == rep
        assert (steps["start"][mine][1:] >= steps["end"][mine][:-1]).all(), "no overlap"
    assert steps["num_tokens"].max(initial=0) <= cfg.max_num_batched_tokens
    assert steps["batch_size"].max(initial=0) <= cfg.max_num_seqs
    pre = tl.request_columns["preemptions"]
    assert pre.sum() == steps["preempted"].sum(), "every preemption is shown in the steps"
    if cfg.horizon is None:
        assert not (tl.status == IN_FLIGHT).any()
        assert tl.info["kv_used_at_end"] == 0, "blocks are freed on finish"


engines = st.builds(
    VLLMConfig,
    pool_tokens=st.sampled_from([640, 2000, 100_000]),
    block_size=st.sampled_from([1, 16]),
    max_num_batched_tokens=st.sampled_from([32, 512]),
    max_num_seqs=st.sampled_from([4, 256]),
    watermark=st.sampled_from([0.0, 0.05]),
    horizon=st.sampled_from([None, 3.0]),
    step_jitter_cv=st.sampled_from([0.0, 0.0, 0.3]),  # fast-forward draws stepping's factors
)
policies = st.sampled_from([FCFS, VTC, lambda: VTC(victim="max_counter"), LCF])


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads, engines, policies)
def test_fast_forward_gives_the_timeline_of_stepping(tr, cfg, make_policy):
    cost = a10g_cost()
    on = simulate(tr, make_policy(), cost, cfg)
    off = simulate(tr, make_policy(), cost, VLLMConfig(**{**vars(cfg), "fast_forward": False}))
    check_invariants(on, cfg)
    assert on.requests_frame().equals(off.requests_frame())
    for a, b in zip(on.token_times(), off.token_times(), strict=True):
        assert np.array_equal(a, b)
    for key in on.steps:
        assert np.array_equal(on.steps[key], off.steps[key]), key
    if on.counters is not None:
        assert on.counters.equals(off.counters)


def test_huge_pool_no_preemption_and_hand_computed_ttfts():
    # A: 300-token prompt, budget 128 -> chunks 128, 128, 44 (three prefill steps, 0.1 s each);
    # B arrives at 0.505 while A decodes (steps end 0.31, 0.32, ...): admitted in the step that
    # starts at 0.51, a mixed step (0.1 prefill + 0.01 decode) ending at 0.62.
    tr = trace([0.0, 0.505], [300, 100], [40, 5])
    cfg = VLLMConfig(pool_tokens=1_000_000, max_num_batched_tokens=128)
    tl = simulate(tr, FCFS(), CONST, cfg)
    check_invariants(tl, cfg)
    assert tl.request_columns["preemptions"].sum() == 0
    assert tl.first_token_at[0] == pytest.approx(0.3)
    assert tl.first_token_at[1] == pytest.approx(0.62)
    # tokens 1-21 by decode steps, 22 by the mixed step, 23-39 by 17 more decode steps
    assert tl.finished_at[0] == pytest.approx(0.3 + 0.01 * 21 + 0.11 + 0.01 * 17)
    kinds = tl.steps_frame().kind.astype(str).tolist()
    assert kinds[:4] == ["prefill", "prefill", "prefill", "decode"]
    assert "mixed" in kinds


class Spy(BasePolicy):
    """FCFS that records prompt charges."""

    name = "spy"
    charged = frozenset({PromptTokens})

    def bind(self, trace):
        super().bind(trace)
        self.prompt_tokens = np.zeros(len(trace), dtype=np.int64)

    def pick(self, queue, now):
        return queue.oldest()

    def charge(self, event):
        self.prompt_tokens[event.req] += event.tokens


def test_recompute_restores_exactly_prompt_plus_generated_tokens():
    # pool 48 tokens = 3 blocks of 16; two 8-token prompts decode until both need a second
    # block at 16 tokens (9 generated): the later one is preempted, the earlier finishes alone
    # (8 + 30 - 1 tokens fit 3 blocks), then the victim recomputes 8 + 9 tokens in one step.
    tr = trace([0.0, 0.0], [8, 8], [30, 30])
    cfg = VLLMConfig(
        pool_tokens=48, block_size=16, charge_recompute=True, enable_prefix_caching=False
    )
    spy = Spy()
    tl = simulate(tr, spy, CONST, cfg)
    check_invariants(tl, cfg)
    assert tl.request_columns["preemptions"].tolist() == [0, 1], "FCFS: the tail of running"
    steps = tl.steps_frame()
    resume = steps[(steps.start >= tl.finished_at[0]) & (steps.kind == "prefill")]
    assert resume.num_tokens.iloc[0] == 8 + 9
    # charged: the prompt once, then the 16 positions computed before (the 9th generated
    # token's KV was never computed, so it is new work, not recomputation)
    assert spy.prompt_tokens.tolist() == [8, 8 + 16]
    uncharged = Spy()
    simulate(tr, uncharged, CONST, VLLMConfig(**{**vars(cfg), "charge_recompute": False}))
    assert uncharged.prompt_tokens.tolist() == [8, 8]
    rows, _, times = tl.token_times()
    gaps = np.diff(times[rows == 1])
    assert (gaps > 0.05).sum() == 1, "one stall: the preemption"
    # the victim's block is freed in the step that preempts it: one block each before, then
    # the survivor's two (its new one taken, the victim's returned), not three
    at = int(np.flatnonzero(steps.preempted > 0)[0])
    assert steps.kv_used.iloc[at - 1] == 2 * 16
    assert steps.kv_used.iloc[at] == 2 * 16


def test_the_victim_goes_back_to_the_head_of_the_queue():
    tr = trace([0.0, 0.0, 0.001], [8, 8, 8], [30, 30, 5])
    cfg = VLLMConfig(pool_tokens=48, block_size=16, enable_prefix_caching=False)
    tl = simulate(tr, FCFS(), CONST, cfg)
    check_invariants(tl, cfg)
    assert tl.request_columns["preemptions"].tolist() == [0, 1, 0]
    rows, _, times = tl.token_times()
    mine = times[rows == 1]
    resumed = mine[1:][np.diff(mine) > 0.05][0]
    # request 2 arrived before request 1 was preempted but waits behind it
    assert tl.first_token_at[2] >= resumed


def test_max_counter_victim_is_the_most_served_clients_latest_request():
    v = VTC(victim="max_counter")
    tr = trace([0, 0, 0], [10, 10, 10], [5, 5, 5], client=["a", "b", "a"])
    v.bind(tr)
    v.counter[:] = [1.0, 7.0]
    assert v.victim([0, 1, 2]) == 1
    v.counter[:] = [9.0, 7.0]
    assert v.victim([0, 1, 2]) == 2
    assert VTC().victim([2, 0, 1]) == 1
    with pytest.raises(ValueError, match="victim"):
        VTC(victim="random")


def test_identical_prompts_hit_all_but_the_last_token():
    p = 16 * 8 + 1  # the hit is whole blocks, capped at prompt - 1 tokens
    n = 6
    hashes = [np.arange(9, dtype=np.int64)] * n  # same content: the same block ids
    tr = trace(np.arange(n) * 1.0, [p] * n, [4] * n, hashes=hashes, hash_block=16)
    cfg = VLLMConfig(pool_tokens=10_000)
    tl = simulate(tr, FCFS(), CONST, cfg)
    check_invariants(tl, cfg)
    assert tl.request_columns["cached_tokens"].tolist() == [0] + [p - 1] * (n - 1)
    off = simulate(tr, FCFS(), CONST, VLLMConfig(pool_tokens=10_000, enable_prefix_caching=False))
    assert off.request_columns["cached_tokens"].sum() == 0
    # a hit saves prefill work: a later request's TTFT is a 1-token step, not a whole prompt
    cost = a10g_cost()
    hit = simulate(tr, FCFS(), cost, cfg)
    miss = simulate(tr, FCFS(), cost, VLLMConfig(pool_tokens=10_000, enable_prefix_caching=False))
    assert (hit.first_token_at - tr.arrival)[1] < (miss.first_token_at - tr.arrival)[1]


def test_prefix_hits_are_free_for_vtc_and_reported_per_client():
    p, n = 16 * 4 + 1, 4
    hashes = [np.arange(5, dtype=np.int64)] * n
    tr = trace(np.arange(n) * 1.0, [p] * n, [3] * n, client=["a", "b", "a", "b"], hashes=hashes)
    v = VTC(lift="none")
    tl = simulate(tr, v, CONST, VLLMConfig(pool_tokens=10_000))
    # a: 65 computed + 1 (the hit leaves one token), outputs 2 charged tokens each at w_q = 2
    assert v.counter[tr.client_of("a")] == (p + 1) + 2 * 2 * 2
    assert v.counter[tr.client_of("b")] == (1 + 1) + 2 * 2 * 2
    from simulator.metrics.replicas import engine_counts

    counts = engine_counts(tl.requests_frame())
    assert counts["per_client"]["b"]["prefix_hit_rate"] == pytest.approx((2 * (p - 1)) / (2 * p))


def test_lru_eviction_frees_the_oldest_unreferenced_blocks_first():
    pool = BlockPool(num_blocks=4, block_size=2, caching=True)
    assert pool.fits([10, 11], 0, 4, reserve=0)
    pool.admit(0, [10, 11], 0, 4, reserve=0)
    pool.register(0, [10, 11], 4)
    pool.release(0)  # both cached, unreferenced; free again
    assert pool.free == 4 and pool.cached_prefix([10, 11], 5) == 2
    assert pool.fits([20, 21, 22], 0, 6, reserve=0)  # needs 3: evicts one cached block
    pool.admit(1, [20, 21, 22], 0, 6, reserve=0)
    pool.check()
    # the tail block (11) went first, so the shared prefix (10) survives
    assert pool.cached_prefix([10, 11], 5) == 1
    assert not pool.fits([], 0, 4, reserve=0)  # 1 free: a 2-block request must wait
    pool.check()


def test_block_keys_follow_the_trace_hash_granularity():
    # 512-token hash blocks (Mooncake) cut into 16-token engine blocks
    keys = block_keys(np.array([7, 9]), 512, 16, 1024)
    assert len(keys) == 64 and len(set(keys)) == 64
    assert keys[:32] == block_keys(np.array([7, 3]), 512, 16, 600)[:32]
    assert keys[32] != block_keys(np.array([7, 3]), 512, 16, 600)[32]


def test_block_keys_stop_at_the_prompt_or_the_listed_ids_whichever_comes_first():
    # 16-token hash blocks, 16-token engine blocks: one key per id, the last token's offset 15
    assert block_keys(np.array([3, 5, 8]), 16, 16, 100) == [3 * 16 + 15, 5 * 16 + 15, 8 * 16 + 15]
    assert block_keys(np.array([3, 5, 8]), 16, 16, 40) == [3 * 16 + 15, 5 * 16 + 15]  # 2 full
    # 32-token engine blocks over 16-token hash blocks: block j ends in hash block 2j + 1
    assert block_keys(np.array([3, 5, 8, 9]), 16, 32, 200) == [5 * 16 + 15, 9 * 16 + 15]
    # 10-token hash blocks: engine block 0 ends at token 15, in hash block 1 at offset 5; block
    # 1 ends at token 31, past the 3 ids' 30 tokens: no key (it is never shared)
    assert block_keys(np.array([3, 5, 8]), 10, 16, 64) == [5 * 10 + 5]
    assert block_keys(np.array([], dtype=np.int64), 512, 16, 1024) == []


def test_refuses_requests_that_can_never_finish():
    tr = trace([0.0, 0.0], [100, 10], [100, 10])
    cfg = VLLMConfig(pool_tokens=160, block_size=16)
    tl = simulate(tr, FCFS(), CONST, cfg)
    assert tl.reason[0] == "kv_pool_too_small"
    assert tl.status[1] == COMPLETED


def test_engine_does_not_use_output_lengths_to_admit():
    # Both fit at admission though their final KV does not: vLLM admits and later preempts.
    tr = trace([0.0, 0.0], [16, 16], [40, 40])
    tl = simulate(tr, FCFS(), CONST, VLLMConfig(pool_tokens=80, block_size=16))
    assert tl.admitted_at[1] == 0.0
    assert tl.request_columns["preemptions"].sum() >= 1


@pytest.mark.parametrize(
    "make",
    [
        VTC,
        lambda: VTC(weights={"a": 2.0}),
        LCF,
        lambda: RPM(limit=5),
        FairServe,
    ],
)
def test_fair_policies_run_on_the_vllm_engine(make):
    tr = random_trace(seed=3, n=150, clients=3, max_prompt=300, max_output=64, rate=20.0)
    tr = Trace.from_columns(
        client=[("a", "b", "c")[c] for c in tr.client],
        arrival=tr.arrival,
        prompt_len=tr.prompt_len,
        output_len=tr.output_len,
    )
    cfg = VLLMConfig(pool_tokens=3000, max_num_batched_tokens=256)
    tl = simulate(tr, make(), RooflineCost(), cfg)
    check_invariants(tl, cfg)


def test_vtc_counters_charge_computed_prompt_tokens_and_outputs():
    tr = random_trace(seed=5, n=60, clients=2, max_prompt=300, max_output=40, rate=30.0)
    v = VTC(lift="none")
    cfg = VLLMConfig(pool_tokens=1200, max_num_batched_tokens=128, enable_prefix_caching=False)
    tl = simulate(tr, v, a10g_cost(), cfg)
    r = tl.requests_frame()
    assert r.preemptions.sum() > 0  # recompute happened, and was not charged
    admitted = r.admitted_at.notna().to_numpy()
    for c in range(2):
        mine = (tr.client == c) & admitted
        outputs = np.maximum(tl.generated[mine] - 1, 0).sum()
        expected = tr.prompt_len[mine].sum() + 2 * outputs
        assert v.counter[c] == pytest.approx(expected)


def test_drr_charges_prompt_chunks_on_the_vllm_engine():
    """DRR takes prompts chunk by chunk like VTC: its credit log adds up to each client's
    prompt tokens plus 2 per output token after the first, less the quantum refills."""
    from policies import DRR

    tr = random_trace(seed=4, n=80, clients=2, max_prompt=300, max_output=40, rate=30.0)
    drr = DRR(quantum=200.0)
    cfg = VLLMConfig(pool_tokens=100_000, max_num_batched_tokens=128, enable_prefix_caching=False)
    tl = simulate(tr, drr, a10g_cost(), cfg)
    check_invariants(tl, cfg)
    events = drr.counter_events()
    assert {"prompt", "decode", "refill"} <= set(events["cause"].astype(str))
    for c, name in enumerate(tr.client_names):
        mine = events[events.client == name]
        spent = -mine[mine.cause.astype(str) != "refill"].delta.sum()
        served = tr.client == c
        expected = tr.prompt_len[served].sum() + 2 * (tl.generated[served] - 1).sum()
        assert spent == pytest.approx(expected)
        assert mine.value.iloc[-1] == pytest.approx(drr.credit[c])


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="engine.block_size"):
        VLLMConfig(block_size=0)
    with pytest.raises(ValueError, match="engine.watermark"):
        VLLMConfig(watermark=1.5)
    with pytest.raises(ValueError, match="engine.pool_tokens is null"):
        simulate(trace([0.0], [10], [2]), FCFS(), CONST, VLLMConfig())


def test_agentic_sessions_reuse_their_growing_context():
    path = installed_data("data:agentic/claude_code_sessions_flat.csv")
    tr = load_agentic_sessions(path, sessions=2, block_hashes=True)
    assert tr.hash_block_tokens == 64
    assert all(len(h) == p // 64 for h, p in zip(tr.block_hashes, tr.prompt_len, strict=True))
    cfg = VLLMConfig(pool_tokens=2_000_000, max_num_batched_tokens=8192)
    tl = simulate(tr, FCFS(), RooflineCost(gpu="h100"), cfg)
    check_invariants(tl, cfg)
    from simulator.metrics.replicas import engine_counts

    # about 96% of an agent's blocks repeat its previous call's
    assert engine_counts(tl.requests_frame())["prefix_hit_rate"] > 0.8


def test_a_prefix_trace_scaled_to_an_eighth_keeps_its_prefix_hit_rate():
    """ScaleTokens scales the tokens each block id covers with the prompt, so the shared share
    of each prompt, and the cache's hit rate, stay about the same (they differ by the engine's
    16-token block rounding). Kept at 64 tokens per id, the ids would cover only the first
    eighth of each prompt, mostly the shared system prompt: 0.84 instead of 0.76 here."""
    tr = PrefixHeavyMix(duration=60, system_prompt=4096, user_tokens=400).build(0)
    small = ScaleTokens(prompt=0.125, output=0.125).apply(tr)
    cfg = VLLMConfig(pool_tokens=2_000_000)  # nothing evicted: hits depend on the ids alone

    def hit_rate(t: Trace) -> float:
        tl = simulate(t, FCFS(), RooflineCost(gpu="h100"), cfg)
        return replicas.engine_counts(tl.requests_frame())["prefix_hit_rate"]

    full = hit_rate(tr)
    assert 0.5 < full < 0.9
    assert hit_rate(small) == pytest.approx(full, abs=0.02)


def test_priority_admits_the_most_urgent_client_and_preempts_the_least():
    from policies import Priority

    # a (priority 0) arrives first; b (priority -1) later, while a waits for room
    tr = trace([0.0, 0.0, 0.01], [8, 8, 8], [30, 30, 30], client=["a", "a", "b"])
    pol = Priority({"b": -1})
    tl = simulate(tr, pol, CONST, VLLMConfig(pool_tokens=48, enable_prefix_caching=False))
    pre = tl.request_columns["preemptions"]
    assert pre[2] == 0, "the urgent client's request is never the victim"
    assert pre[:2].sum() >= 1
    # the largest (priority, arrival): the later of a's two requests
    assert pol.victim([0, 1, 2]) == 1
    with pytest.raises(ValueError, match="unknown client"):
        Priority({"zz": 1}).bind(tr)


def unlimited_cache_bound(tr: Trace) -> np.ndarray:
    """Independent of the engine: the most prompt tokens each request could find in an
    unlimited cache holding every other request's blocks, i.e. its longest run of leading hash
    ids that another request of the trace also starts with, in tokens, capped at prompt - 1.
    (Hash ids name their whole prefix here, as in Mooncake and the agentic traces.)"""
    assert tr.block_hashes is not None
    prefixes = []
    for ids in tr.block_hashes:
        keys, key = [], 0
        for h in ids.tolist():
            key = hash((key, h))
            keys.append(key)
        prefixes.append(keys)
    counts = Counter(k for keys in prefixes for k in keys)
    depth = np.array(
        [sum(1 for _ in takewhile(lambda k: counts[k] > 1, keys)) for keys in prefixes]
    )
    return np.minimum(depth * tr.hash_block_tokens, tr.prompt_len - 1)


def conversations(n_conv: int, turns: int, system_blocks: int, seed: int) -> Trace:
    """Multi-turn conversations sharing a system prompt: turn t's prompt is turn t-1's plus new
    blocks (fresh hash ids), so later turns hit the cache; long outputs fill a small pool."""
    rng = np.random.default_rng(seed)
    fresh = iter(range(system_blocks, 10**9))
    rows = []
    for c in range(n_conv):
        ids = list(range(system_blocks))
        for t in range(turns):
            ids = ids + [next(fresh) for _ in range(int(rng.integers(1, 4)))]
            rows.append((c * 0.05 + t * 2.0, list(ids), f"c{c % 3}"))
    rows.sort(key=lambda r: r[0])
    return trace(
        [r[0] for r in rows],
        [len(r[1]) * 16 + 5 for r in rows],
        [int(x) for x in rng.integers(100, 300, len(rows))],
        client=[r[2] for r in rows],
        hashes=[np.asarray(r[1], dtype=np.int64) for r in rows],
    )


def test_prefix_hit_rate_counts_each_prompt_once_within_the_unlimited_cache_bound():
    tr = conversations(n_conv=12, turns=6, system_blocks=6, seed=5)
    cfg = VLLMConfig(pool_tokens=2_400)
    tl = simulate(tr, FCFS(), a10g_cost(), cfg)
    check_invariants(tl, cfg)
    cols = tl.request_columns
    assert cols["preemptions"].sum() > 0, "the small pool preempts: resumes hit their own blocks"
    assert cols["recompute_avoided_tokens"].sum() > 0
    bound = unlimited_cache_bound(tr)
    assert (cols["cached_tokens"] <= bound).all()
    summary = replicas.engine_counts(tl.requests_frame())
    admitted = ~np.isnan(tl.admitted_at)
    assert 0 < summary["prefix_hit_rate"] <= bound[admitted].sum() / tr.prompt_len[admitted].sum()
    assert summary["recompute_avoided_tokens"] == cols["recompute_avoided_tokens"].sum()


@pytest.mark.slow
def test_prefix_hit_rate_on_the_agentic_sessions_stays_within_the_unlimited_cache_bound():
    path = installed_data("data:agentic/claude_code_sessions_flat.csv")
    tr = load_agentic_sessions(path, sessions=4, block_hashes=True, mode="open_loop")
    cfg = VLLMConfig(pool_tokens=400_000, max_num_batched_tokens=8192)
    tl = simulate(tr, FCFS(), RooflineCost(gpu="h100"), cfg)
    bound = unlimited_cache_bound(tr)
    assert (tl.request_columns["cached_tokens"] <= bound).all()
    summary = replicas.engine_counts(tl.requests_frame())
    admitted = ~np.isnan(tl.admitted_at)
    assert summary["prefix_hit_rate"] <= bound[admitted].sum() / tr.prompt_len[admitted].sum()


def pool_state(pool):
    """Everything a BlockPool decides with: blocks held, cache keys and eviction order, empty
    blocks, tracked matches."""
    trackers = {k: dict(v) for k, v in pool._trackers.items()}
    return pool.empty, pool.held, pool.refs, list(pool.lru), pool.tracked, trackers


def pool_with_history(seed: int) -> tuple[BlockPool, list[int], list[int]]:
    """A small pool after random admissions (prompt blocks of three shared families),
    registrations and releases, with three waiting requests' matches tracked; the requests
    still running and the tokens each holds blocks for."""
    rng = np.random.default_rng(seed)
    pool = BlockPool(num_blocks=18, block_size=4, caching=True)
    rows, tokens = [], []
    for req in range(10):
        keys = [int(rng.integers(0, 3)) * 100 + j for j in range(3)] + [1000 * req]
        n = int(rng.integers(5, 17))
        hit = pool.cached_prefix(keys, n)
        if pool.fits(keys, hit, n, 0):
            pool.admit(req, keys, hit, n, 0)
            pool.register(req, keys, n)
            if rng.random() < 0.5:
                pool.release(req)  # its full blocks stay cached, to be evicted
            else:
                rows.append(req)
                tokens.append(n)
    for req in range(10, 13):
        pool.tracked_prefix(req, [int(rng.integers(0, 3)) * 100 + j for j in range(3)], 13)
    return pool, rows, tokens


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 10_000), steps=st.integers(2, 12), data=st.data())
def test_a_cut_run_leaves_the_pool_as_the_shorter_run_would_have(seed, steps, data):
    """A run of decode steps takes every step's blocks when it is decided (evicting cached
    blocks once the empty ones run out); cut to its first `kept` steps (`shorten`), the pool is
    exactly what deciding only those steps leaves: held blocks, empty blocks, cached keys in
    their eviction order, and the matches tracked for waiting requests."""
    kept = data.draw(st.integers(1, steps - 1))
    (long, rows, tokens), (short, _, _) = pool_with_history(seed), pool_with_history(seed)
    steps = min(steps, long.decode_steps_that_fit(rows, tokens, steps))  # a run's blocks fit
    if not rows or kept >= steps:
        return
    _, evicted = long.decode(rows, tokens, steps)
    long.shorten(rows, tokens, steps, kept, evicted)
    short.decode(rows, tokens, kept)
    long.check()
    assert pool_state(long) == pool_state(short)
