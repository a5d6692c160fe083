"""The CPU tier for KV blocks on engine=vllm (simulator/engines/kv_blocks.py `CPUTier`,
simulator/engines/vllm.py): prefix blocks evicted from the GPU are loaded back over PCIe instead
of recomputed, and a preempted request may be swapped out whole."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_vllm_engine import check_invariants, trace

from conftest import a10g_cost, random_trace, with_shared_prefixes
from cost_models import ConstantStepCost
from policies import FCFS, VTC
from simulator.core.errors import ConfigError
from simulator.core.requests import COMPLETED
from simulator.engines import VLLMConfig, simulate
from simulator.engines.kv_blocks import CPUTier

CONST = ConstantStepCost(prefill=0.1, decode=0.01)
MB = 1_000_000


def evicted_then_reused(cpu_kv_tokens):
    """A's 160-token prompt (10 blocks) is cached after it ends; B's prompt, with other keys,
    needs 11 of the 12 blocks and evicts A's last nine (its tail first); C repeats A."""
    hashes = [np.arange(10), np.arange(100, 110), np.arange(10)]
    tr = trace([0.0, 1.0, 2.0], [160, 160, 160], [2, 2, 2], hashes=hashes)
    cfg = VLLMConfig(
        pool_tokens=12 * 16, cpu_kv_tokens=cpu_kv_tokens, cpu_kv_gbps=10.0, kv_bytes_per_token=MB
    )
    return simulate(tr, FCFS(), CONST, cfg), cfg


def test_an_evicted_prefix_is_loaded_from_the_cpu_tier_at_hand_computed_times():
    tl, cfg = evicted_then_reused(cpu_kv_tokens=1600)
    check_invariants(tl, cfg)
    cols = tl.request_columns
    # C: key 0 is still cached on the GPU (16 tokens); keys 1-8 come back from the CPU (the hit
    # is capped at 159 tokens: 9 blocks): 128 tokens x 1 MB over 10 GB/s = 12.8 ms
    assert cols["cached_tokens"][2] == 16 and cols["cpu_cached_tokens"][2] == 128
    assert tl.first_token_at[2] == pytest.approx(2.0 + 0.0128 + 0.1)
    steps = tl.steps_frame()
    assert steps.num_tokens[np.isclose(steps.start, 2.0128)].tolist() == [16]
    assert tl.info["cpu_kv_bytes_loaded"] == 128 * MB
    # to the CPU went nine of A's blocks when B took room, then nine of B's as C did
    assert tl.info["cpu_kv_bytes_offloaded"] == 18 * 16 * MB


def test_without_the_tier_the_same_prefix_is_recomputed():
    tl, _ = evicted_then_reused(cpu_kv_tokens=0)
    assert tl.request_columns["cached_tokens"][2] == 16
    assert "cpu_cached_tokens" not in tl.request_columns
    assert tl.first_token_at[2] == pytest.approx(2.1)
    steps = tl.steps_frame()
    assert steps.num_tokens[steps.start == 2.0].tolist() == [144]


def test_a_small_tier_keeps_the_most_recently_evicted_blocks():
    tier = CPUTier(3)
    for key in (9, 8, 7, 6):
        tier.store(key)
    assert list(tier.keys) == [8, 7, 6]  # 9, stored first, was dropped
    assert tier.run([8, 7, 5]) == 2  # a hit makes them the most recently used: 6, 8, 7
    assert tier.swap_out(req=1, blocks=2) and list(tier.keys) == [7]
    assert not tier.swap_out(req=2, blocks=2), "swapped requests are never dropped for room"
    tier.release_swap(1)
    tier.check()


def preempting_trace():
    # three long requests on a pool that holds two of them: the youngest is preempted
    return trace([0.0, 0.0, 0.0], [100, 100, 100], [300, 300, 300])


def test_swap_preemption_brings_the_kv_back_instead_of_recomputing_it():
    tr = preempting_trace()
    base = dict(pool_tokens=48 * 16, kv_bytes_per_token=MB, cpu_kv_gbps=10.0)
    swap = simulate(
        tr, FCFS(), CONST, VLLMConfig(**base, cpu_kv_tokens=4096, preemption_mode="swap")
    )
    again = simulate(tr, FCFS(), CONST, VLLMConfig(**base))
    check_invariants(swap, VLLMConfig(**base))
    cols = swap.request_columns
    assert cols["preemptions"].sum() > 0 and (cols["swap_ins"] == cols["preemptions"]).all()
    # every token's KV computed exactly once: prompts and outputs (the last output's KV never)
    computed = swap.steps["num_tokens"].sum()
    assert computed == (tr.prompt_len + tr.output_len - 1).sum()
    assert again.steps["num_tokens"].sum() > computed, "recompute computes some twice"
    assert swap.info["cpu_kv_bytes_swapped_out"] == cols["recompute_avoided_tokens"].sum() * MB


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 1000),
    cpu_blocks=st.sampled_from([4, 40, 400]),
    mode=st.sampled_from(["recompute", "swap"]),
    pool=st.sampled_from([640, 2000]),
    horizon=st.sampled_from([None, 3.0]),
    make_policy=st.sampled_from([FCFS, VTC]),
)
def test_the_cpu_tier_keeps_every_invariant_and_fast_forward_changes_nothing(
    seed, cpu_blocks, mode, pool, horizon, make_policy
):
    tr = random_trace(seed=seed, n=60, clients=3, max_prompt=300, max_output=60, rate=20.0)
    tr = with_shared_prefixes(tr, seed)
    cfg = VLLMConfig(
        pool_tokens=pool,
        max_num_batched_tokens=256,
        horizon=horizon,
        cpu_kv_tokens=cpu_blocks * 16,
        preemption_mode=mode,
        kv_bytes_per_token=64 * 1024,
        cpu_kv_gbps=2.0,
    )
    on = simulate(tr, make_policy(), a10g_cost(), cfg)
    check_invariants(on, cfg)
    off = simulate(
        tr, make_policy(), a10g_cost(), VLLMConfig(**{**vars(cfg), "fast_forward": False})
    )
    assert on.requests_frame().equals(off.requests_frame())
    for a, b in zip(on.token_times(), off.token_times(), strict=True):
        assert np.array_equal(a, b)
    for key in on.steps:
        assert np.array_equal(on.steps[key], off.steps[key]), key
    done = on.status == COMPLETED
    assert (on.request_columns["cpu_cached_tokens"][done] <= tr.prompt_len[done]).all()


def test_cpu_tier_settings_are_checked():
    with pytest.raises(ConfigError, match="engine.cpu_kv_tokens must be an integer >= 0"):
        VLLMConfig(cpu_kv_tokens=-1)
    with pytest.raises(ConfigError, match="engine.preemption_mode must be recompute or swap"):
        VLLMConfig(preemption_mode="drop")
    with pytest.raises(ConfigError, match="preemption_mode=swap needs a CPU tier"):
        VLLMConfig(preemption_mode="swap")
    with pytest.raises(ConfigError, match="engine.cpu_kv_gbps must be a number > 0"):
        VLLMConfig(cpu_kv_gbps=0)
    with pytest.raises(ConfigError, match="engine.kv_bytes_per_token is null"):
        simulate(
            trace([0.0], [10], [2]), FCFS(), CONST, VLLMConfig(pool_tokens=100, cpu_kv_tokens=64)
        )


def test_a_request_swapped_out_by_one_replica_and_resumed_by_another_is_recomputed_there():
    """Replicas sharing one queue (dispatcher central): the KV a preempted request swapped out
    sits in its replica's CPU memory, which another replica cannot read. Resumed elsewhere, it
    recomputes, and the first replica's CPU tier lets go of it (the replica checks at the end
    that no request that ended still holds any)."""
    from simulator.engines import ClusterConfig

    tr, cfg = swapping()
    tl = simulate(tr, FCFS(), a10g_cost(), cfg, ClusterConfig(2, "central"))
    check_invariants(tl, cfg)
    cols = tl.request_columns
    assert cols["swap_ins"].sum() > 0, "some resume where they were swapped out"
    assert cols["preemptions"].sum() > cols["swap_ins"].sum(), "others resume elsewhere"


def swapping() -> tuple:
    """A trace and an engine under which preempted requests swap their KV out to the CPU tier
    (a tight GPU pool, outputs up to 300 tokens)."""
    tr = random_trace(seed=878722, n=102, clients=1, max_prompt=8, max_output=300, rate=5.0)
    cfg = VLLMConfig(
        pool_tokens=640,
        block_size=1,
        cpu_kv_tokens=4000,
        kv_bytes_per_token=131_072,
        preemption_mode="swap",
    )
    return tr, cfg
