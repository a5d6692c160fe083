"""Hybrid models' sliding-window layers in the KV pool (`WindowedBlockPool` of
simulator/engines/kv_blocks.py): each request holds, in every window group, the blocks its last
window reads, as vLLM's hybrid allocator keeps them; checked against vLLM's rule step by step,
against stepping one by one, and in whole runs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_real_engine_settings import GPT_OSS_120B
from test_vllm_engine import check_invariants, trace

from conftest import random_trace, with_shared_prefixes
from cost_models import ConstantStepCost, CostModelError, FittedCost, RooflineCost
from cost_models.base import chunked_pairs, step_shape, windowed_pairs
from cost_models.hf_config import model_from_hf_config
from policies import DLPM, FCFS, LPM, VTC, Andes
from simulator.core.errors import ConfigError
from simulator.core.requests import COMPLETED
from simulator.engines import ClusterConfig, SLoRAConfig, VLLMConfig, simulate
from simulator.engines.kv_blocks import (
    ChunkedBlockPool,
    SlidingBlockPool,
    WindowedBlockPool,
    window_cap,
)

B = 16  # tokens per block

# Gemma 3 27B's config.json (text part): 62 layers, every sixth full attention, the others a
# 1,024-token window
GEMMA_3_27B = {
    "hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 62,
    "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
    "vocab_size": 262208, "sliding_window": 1024, "torch_dtype": "bfloat16",
    "model_type": "gemma3_text",
    "layer_types": [
        "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(62)
    ],
}  # fmt: skip


def vllm_window_blocks(computed: int, tokens: int, window: int) -> int:
    """One window group's blocks in vLLM once a step computing up to `tokens` tokens from
    `computed` is allocated: the blocks before position computed - window + 1 were freed
    (vLLM's `remove_skipped_blocks`), then blocks up to `tokens` allocated."""
    return -(-tokens // B) - max(0, computed - window + 1) // B


@dataclass(frozen=True)
class WindowedConstant(ConstantStepCost):
    """Constant step times, for a model whose sliding layers keep `window` tokens in
    `groups` window groups."""

    window: int = 64
    groups: int = 2

    def kv_window(self) -> tuple[int, int]:
        return self.window, self.groups

    def with_full_attention(self) -> ConstantStepCost:
        return ConstantStepCost(self.prefill, self.decode)


@dataclass(frozen=True)
class ChunkedConstant(WindowedConstant):
    """Constant step times, for a model whose windowed layers attend within chunks."""

    def kv_chunked(self) -> bool:
        return True


@dataclass(frozen=True)
class SlidingEverywhere(ConstantStepCost):
    """Constant step times, for a model whose every layer slides over `window` tokens."""

    window: int = 64

    def all_layers_window(self) -> int:
        return self.window

    def with_full_attention(self) -> ConstantStepCost:
        return ConstantStepCost(self.prefill, self.decode)


def test_the_window_groups_follow_vllms_grouping_of_layers():
    # vLLM groups layers in groups as large as the smaller kind: gpt-oss, 18 and 18 (one window
    # group of the full layers' size); Gemma 3 27B, 52 sliding and 10 full (6 window groups)
    assert model_from_hf_config(GPT_OSS_120B, "g").kv_window() == (128, 1)
    assert model_from_hf_config(GEMMA_3_27B, "g").kv_window() == (1024, 6)
    assert RooflineCost(model=model_from_hf_config(GEMMA_3_27B, "g"), gpu="h100").kv_window() == (
        1024,
        6,
    )
    # Gemma 3's configs written before `layer_types` say it with `sliding_window_pattern`
    older = {k: v for k, v in GEMMA_3_27B.items() if k != "layer_types"}
    assert model_from_hf_config({**older, "sliding_window_pattern": 6}, "g") == (
        model_from_hf_config(GEMMA_3_27B, "g")
    )
    assert RooflineCost(model="llama-2-7b", gpu="h100").kv_window() is None
    without = {k: v for k, v in GEMMA_3_27B.items() if k != "sliding_window"}
    with pytest.raises(CostModelError, match="g: config.json has no sliding_window"):
        model_from_hf_config(without, "g")


def test_the_published_gemma_configs_read_with_their_config_classes_defaults():
    # google/gemma-3-27b-it's config.json states little beyond the sizes: the vocabulary, the
    # five-sliding-to-one-full pattern and the tied output head are Gemma3TextConfig's defaults
    gemma_3 = {
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "text_config": {
            "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
            "model_type": "gemma3_text", "num_attention_heads": 32, "num_hidden_layers": 62,
            "num_key_value_heads": 16, "query_pre_attn_scalar": 168, "sliding_window": 1024,
        },
        "torch_dtype": "bfloat16", "vision_config": {"hidden_size": 1152},
    }  # fmt: skip
    m = model_from_hf_config(gemma_3, "gemma-3-27b")
    assert m.params == pytest.approx(27.0e9, rel=0.01)  # Google's model card: 27B
    assert (m.sliding_layers, m.kv_window(), m.vocab) == (52, (1024, 6), 262_208)
    # google/gemma-2-9b: every other layer slides over 4,096 tokens
    gemma_2 = {
        "model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336,
        "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 256, "vocab_size": 256000, "sliding_window": 4096, "torch_dtype": "float32",
    }  # fmt: skip
    m = model_from_hf_config(gemma_2, "gemma-2-9b")
    assert m.params == pytest.approx(9.24e9, rel=0.01)  # Gemma 2 report: 9.24B
    assert (m.sliding_layers, m.kv_window()) == (21, (4096, 1))


# a dense attention model's sizes, to which each case below adds what its family's config has
SMALL = {
    "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 8,
    "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000,
}  # fmt: skip


@pytest.mark.parametrize(
    "extra, named",
    [
        ({"attn_layer_period": 8, "attn_layer_offset": 4}, "attn_layer_period"),  # Jamba
        ({"hybrid_override_pattern": "M-M-M*-M"}, "hybrid_override_pattern"),  # Nemotron-H
        ({"layer_types": ["mamba", "attention"]}, "mamba"),  # Mamba layers outside Granite 4.0-H
        ({"layer_types": ["conv", "full_attention"]}, "conv"),  # LFM2
        ({"mamba_d_state": 256}, "mamba_d_state"),  # Falcon-H1, Bamba
    ],
    ids=["jamba", "nemotron-h", "mamba-elsewhere", "lfm2", "falcon-h1"],
)
def test_models_with_state_space_or_linear_attention_layers_are_refused_by_name(extra, named):
    """Such layers keep a fixed-size state, not a KV per token: read as attention, the pool
    and the step times would be wrong without a word (gated DeltaNet's, which fairsim reads:
    tests/test_recurrent_layers.py)."""
    with pytest.raises(CostModelError, match=f"m: config.json .*{named}.*Mamba-2, only"):
        model_from_hf_config({**SMALL, **extra}, "m")


def test_llama_4s_chunked_layers_read_as_chunked_windows():
    # meta-llama/Llama-4-Scout's text_config: no layer_types, an empty no_rope_layers, so
    # transformers' default: every fourth layer attends to everything (NoPE), the other three
    # within 8,192-token chunks; vLLM groups them as 12 full and 3 groups of 12 chunked layers
    scout = {
        "model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
        "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 202048,
        "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
        "attention_chunk_size": 8192, "no_rope_layers": [], "torch_dtype": "bfloat16",
    }  # fmt: skip
    m = model_from_hf_config(scout, "scout")
    assert (m.sliding_layers, m.attention_chunked, m.kv_window()) == (36, True, (8192, 3))
    listed = {**scout, "layer_types": (["chunked_attention"] * 3 + ["full_attention"]) * 12}
    assert model_from_hf_config(listed, "scout") == m
    assert model_from_hf_config({**scout, "no_rope_layers": [1, 1, 1, 0] * 12}, "scout") == m
    cost = RooflineCost(model=m, gpu="h100")
    assert cost.kv_chunked() and cost.kv_window() == (8192, 3)
    with pytest.raises(CostModelError, match="no_rope_layers"):
        model_from_hf_config({**scout, "no_rope_layers": [1, 0]}, "scout")
    kinds = ["chunked_attention", "sliding_attention", "full_attention"]
    with pytest.raises(CostModelError, match="both sliding_attention and chunked_attention"):
        model_from_hf_config({**SMALL, "layer_types": kinds + ["full_attention"] * 5,
                              "sliding_window": 64, "attention_chunk_size": 64}, "m")  # fmt: skip


@pytest.mark.parametrize("window", [128, 1024, 4096, 100])
def test_kv_loaded_whole_holds_the_window_a_decoding_request_holds(window):
    # a request admitted with its KV already computed (loaded, or moved from a prefill replica)
    # holds what it would hold decoding: the identity the decode steps build on
    pool = WindowedBlockPool(10, B, False, window, 3, [0])
    for tokens in range(1, 3 * window):
        held = pool._step_blocks(tokens, tokens)
        assert held == pool.decoding_blocks(-(-tokens // B)), tokens
        assert held == 3 * vllm_window_blocks(tokens, tokens, window) or (
            # vLLM's count one lower for one step in B (its free comes a step early)
            held == 3 * (vllm_window_blocks(tokens, tokens, window) + 1)
        )


@settings(max_examples=150, deadline=None)
@given(
    prompt=st.integers(1, 700),
    output=st.integers(1, 300),
    chunk=st.integers(1, 300),
    window=st.sampled_from([16, 32, 64, 100, 128]),
    groups=st.integers(1, 6),
)
def test_one_request_holds_vllms_window_blocks_at_every_step(prompt, output, chunk, window, groups):
    computed = [0]
    pool = WindowedBlockPool(100_000, B, False, window, groups, computed)
    vllm = []  # (vLLM's blocks in one group, the pool's in all groups) after each allocation
    n = min(prompt, chunk)
    pool.admit(0, [], 0, n, 0)
    vllm.append((vllm_window_blocks(0, n, window), pool.window_held[0]))
    computed[0] = n
    while computed[0] < prompt:  # the next chunks
        c = computed[0]
        n = min(prompt - c, chunk)
        assert pool.grow(0, c + n)
        vllm.append((vllm_window_blocks(c, c + n, window), pool.window_held[0]))
        computed[0] = c + n
    pool.prefill_done(0)
    for _ in range(output - 1):  # each decode step computes the last sampled token
        c = computed[0]
        assert pool.add_token_each([0], computed)
        vllm.append((vllm_window_blocks(c, c + 1, window), pool.window_held[0]))
        computed[0] = c + 1
        assert pool.held[0] == -(-computed[0] // B)
    first_vllm, first_ours = vllm[0]
    assert first_ours == groups * first_vllm, "the first chunk holds every block it computes"
    for theirs, ours in vllm:
        assert groups * theirs <= ours <= groups * (theirs + 1)
    pool.check()
    pool.release(0)
    assert pool.free == pool.num_blocks


def decoding_pool(
    tokens: list[int], blocks: int, window: int, groups: int, kind: type = WindowedBlockPool
) -> WindowedBlockPool:
    """A pool in which request i decodes from tokens[i] tokens."""
    pool = kind(blocks, B, False, window, groups, list(tokens))
    for r, t in enumerate(tokens):
        pool.admit(r, [], 0, t, 0, computed=t)
    return pool


def pool_state(pool: WindowedBlockPool) -> tuple:
    return dict(pool.held), dict(pool.window_held), pool.empty, pool.free


@pytest.mark.parametrize(
    "kind, windows",
    [(WindowedBlockPool, [16, 64, 100, 128]), (ChunkedBlockPool, [16, 64, 128])],
    ids=["sliding", "chunked"],
)
@settings(max_examples=150, deadline=None)
@given(
    tokens=st.lists(st.integers(1, 300), min_size=1, max_size=8),
    steps=st.integers(1, 200),
    spare=st.integers(0, 40),
    groups=st.integers(1, 4),
    data=st.data(),
)
def test_a_run_of_decode_steps_takes_the_blocks_stepping_one_by_one_takes(
    kind, windows, tokens, steps, spare, groups, data
):
    window = data.draw(st.sampled_from(windows))
    start = decoding_pool(tokens, 100_000, window, groups, kind)
    blocks = start.used + spare  # a pool that may run out during the run
    run, one_by_one = (decoding_pool(tokens, blocks, window, groups, kind) for _ in range(2))
    rows = list(range(len(tokens)))
    k = run.decode_steps_that_fit(rows, tokens, steps)
    in_use, evicted = run.decode(rows, tokens, k)
    assert evicted == []
    computed, stepped = list(tokens), []
    while len(stepped) < k and one_by_one.add_token_each(rows, computed):
        computed = [c + 1 for c in computed]
        stepped.append(one_by_one.used * B)
    assert len(stepped) == k
    assert in_use == stepped
    assert pool_state(run) == pool_state(one_by_one)
    run.check()
    # the run is as long as the steps that fit one by one, or (chunked) stops before a step
    # starting a chunk, where the window's blocks go back
    if k < steps and one_by_one.add_token_each(rows, computed):
        assert kind is ChunkedBlockPool and any(c % window == 0 for c in computed)
    # a run cut after `kept` steps gives back what the steps after took
    if k > 1:
        kept = k // 2
        short = decoding_pool(tokens, blocks, window, groups, kind)
        short.decode(rows, tokens, kept)
        run.shorten(rows, tokens, k, kept, [])
        assert pool_state(run) == pool_state(short)


@pytest.mark.parametrize(
    "cluster",
    [
        None,
        ClusterConfig(2, "round_robin"),  # coupled by nothing: each replica runs alone
        ClusterConfig(2, "least_requests"),  # coupled: runs are cut where a request arrives
        ClusterConfig(  # disaggregated: the KV moves to a decode replica whole
            prefill_replicas=1, decode_replicas=1, disaggregation={"kv_bytes_per_token": 1024}
        ),
    ],
)
@pytest.mark.parametrize(
    "cost, pool",
    [
        (WindowedConstant(prefill=0.05, decode=0.01, window=64, groups=2), 4000),
        (ChunkedConstant(prefill=0.05, decode=0.01, window=64, groups=3), 4000),
        (SlidingEverywhere(prefill=0.05, decode=0.01, window=100), 1200),
    ],
    ids=["sliding-layers", "chunked-layers", "every-layer-slides"],
)
def test_fast_forward_changes_nothing_for_a_model_with_windows(cluster, cost, pool):
    t = with_shared_prefixes(
        random_trace(3, 80, 3, max_prompt=400, max_output=200, rate=20.0), 3, hash_block=16
    )
    runs = []
    for ff in (True, False):
        cfg = VLLMConfig(
            pool_tokens=pool,
            max_num_batched_tokens=256,
            fast_forward=ff,
            hybrid_kv_cache_manager=True,  # (disaggregated pools would turn it off)
        )
        tl = simulate(t, FCFS(), cost, cfg, cluster)
        check_invariants(tl, cfg)
        runs.append(tl)
    on, off = runs
    assert on.token_times()[2].tolist() == off.token_times()[2].tolist()
    assert on.steps["kv_used"].tolist() == off.steps["kv_used"].tolist()
    assert on.request_columns["preemptions"].sum() > 0, "the pool was tight enough to preempt"


@pytest.mark.parametrize(
    "windows, pool",
    [("sliding", 5000), ("chunked", 5000), ("every-layer-slides", 2000)],
)
@pytest.mark.parametrize("policy", [VTC, LPM, DLPM, Andes])
def test_every_policy_keeps_the_invariants_with_windows_and_shared_prefixes(policy, windows, pool):
    # prefix hits spare the full layers' blocks; preemptions (the policy's or the pool's) give
    # the windows back; stepping one by one gives the same timeline
    cost = {
        "sliding": WindowedConstant(prefill=0.05, decode=0.01, window=64, groups=2),
        "chunked": ChunkedConstant(prefill=0.05, decode=0.01, window=64, groups=2),
        "every-layer-slides": SlidingEverywhere(prefill=0.05, decode=0.01, window=96),
    }[windows]
    t = with_shared_prefixes(random_trace(8, 70, 3, max_prompt=500, max_output=150, rate=25.0), 8)
    runs = []
    for ff in (True, False):
        cfg = VLLMConfig(pool_tokens=pool, max_num_batched_tokens=256, fast_forward=ff)
        tl = simulate(t, policy(), cost, cfg)
        check_invariants(tl, cfg)
        runs.append(tl)
    assert runs[0].token_times()[2].tolist() == runs[1].token_times()[2].tolist()
    assert runs[0].request_columns["cached_tokens"].sum() > 0
    assert runs[0].request_columns["preemptions"].sum() > 0


def test_the_windows_use_memory_a_model_without_them_leaves_free():
    t = random_trace(5, 60, 2, max_prompt=300, max_output=150, rate=4.0)
    cfg = VLLMConfig(pool_tokens=20_000, max_num_batched_tokens=512)
    plain = simulate(t, FCFS(), ConstantStepCost(prefill=0.05, decode=0.01), cfg)
    hybrid = simulate(t, FCFS(), WindowedConstant(prefill=0.05, decode=0.01), cfg)
    # the same schedule (the pool never fills), more KV in use at every step
    assert hybrid.token_times()[2].tolist() == plain.token_times()[2].tolist()
    more = hybrid.steps["kv_used"] - plain.steps["kv_used"]
    assert (more >= 0).all() and more.max() > 0
    # once decoding past its window, a request holds groups x (window / B + 1) blocks more
    lone = trace([0.0], [1000], [10])
    tl = simulate(lone, FCFS(), WindowedConstant(prefill=0.05, decode=0.01, window=64), cfg)
    full = -(-1001 // B) * B  # its full-attention KV tokens at the last decode step
    assert tl.steps["kv_used"][-2] == full + 2 * (-(-63 // B) + 1) * B


def vllm_chunk_blocks(computed: int, tokens: int, chunk: int) -> int:
    """One chunked group's blocks in vLLM once a step computing up to `tokens` tokens from
    `computed` is allocated: those before the chunk `computed` is in were freed."""
    return -(-tokens // B) - computed // chunk * (chunk // B)


@settings(max_examples=150, deadline=None)
@given(
    prompt=st.integers(1, 700),
    output=st.integers(1, 300),
    chunk=st.integers(1, 300),
    window=st.sampled_from([16, 32, 64, 128]),
    groups=st.integers(1, 4),
)
def test_one_request_holds_vllms_chunked_blocks_at_every_step(
    prompt, output, chunk, window, groups
):
    computed = [0]
    pool = ChunkedBlockPool(100_000, B, False, window, groups, computed)
    n = min(prompt, chunk)
    pool.admit(0, [], 0, n, 0)
    assert pool.window_held[0] == groups * vllm_chunk_blocks(0, n, window)
    computed[0] = n
    while computed[0] < prompt:
        c = computed[0]
        n = min(prompt - c, chunk)
        assert pool.grow(0, c + n)
        assert pool.window_held[0] == groups * vllm_chunk_blocks(c, c + n, window)
        computed[0] = c + n
    pool.prefill_done(0)
    for _ in range(output - 1):
        c = computed[0]
        assert pool.add_token_each([0], computed)
        assert pool.window_held[0] == groups * vllm_chunk_blocks(c, c + 1, window), c
        computed[0] = c + 1
    pool.check()
    pool.release(0)
    assert pool.free == pool.num_blocks


def test_a_chunk_not_a_whole_number_of_blocks_is_refused_by_name():
    with pytest.raises(ConfigError, match="engine.block_size=16: a model's attention chunk"):
        simulate(
            trace([0.0], [10], [2]),
            FCFS(),
            ChunkedConstant(prefill=0.05, decode=0.01, window=100, groups=1),
            VLLMConfig(pool_tokens=1600),
        )


def test_chunked_pairs_count_each_token_within_its_chunk():
    for chunk in (1, 7, 64):
        for position in range(0, 300, 13):
            one_by_one = sum(p % chunk + 1 for p in range(position))
            assert chunked_pairs(position, chunk) == one_by_one
    # a chunk of prompt after 100 cached tokens, chunked layers of 64 (r = 3 of them per full
    # layer): the full layers' pairs, then 3 x the chunked ones
    tokens, pairs, read = step_shape([(50, 100)], 0, 0, (64, 3.0), chunked=True)
    full = 50 * 100 + 50 * 51 / 2
    chunked = sum(p % 64 + 1 for p in range(100, 150))
    assert (tokens, pairs) == (50, full + 3 * chunked)
    assert read == 100 + 3 * (100 % 64 + 50)


# mistralai/Mistral-7B-v0.1's config.json (its sizes): every layer slides over 4,096 tokens
MISTRAL_7B_V01 = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768,
    "sliding_window": 4096, "torch_dtype": "bfloat16",
}  # fmt: skip


def test_a_config_whose_every_layer_slides_reads_as_one_window_over_the_model():
    # Mistral 7B v0.1 and Phi-3 4k (window 2,047) slide every layer: no full layer to size the
    # pool by, so the pool's blocks are the whole model's and a request holds a window of them
    mistral = model_from_hf_config(MISTRAL_7B_V01, "mistral")
    assert (mistral.sliding_layers, mistral.kv_window(), mistral.window_all_layers) == (
        0,
        None,
        4096,
    )
    phi_3 = model_from_hf_config({**MISTRAL_7B_V01, "sliding_window": 2047}, "phi-3")
    assert phi_3.window_all_layers == 2047
    assert RooflineCost(model=mistral, gpu="h100").all_layers_window() == 4096
    assert RooflineCost(model="llama-2-7b", gpu="h100").all_layers_window() is None
    # Mistral 7B v0.2 on: sliding_window null, full attention
    v02 = model_from_hf_config({**MISTRAL_7B_V01, "sliding_window": None}, "mistral")
    assert v02.window_all_layers == 0 and v02 == model_from_hf_config(
        {k: v for k, v in MISTRAL_7B_V01.items() if k != "sliding_window"}, "mistral"
    )
    # every layer marked sliding in layer_types reads the same
    listed = {**MISTRAL_7B_V01, "layer_types": ["sliding_attention"] * 32}
    assert model_from_hf_config(listed, "mistral") == mistral


def test_qwen2_slides_only_the_layers_its_use_sliding_window_names():
    # Qwen2.5's configs carry a sliding_window with use_sliding_window false (and its config
    # class defaults to false): full attention everywhere
    qwen = {**SMALL, "model_type": "qwen2", "sliding_window": 4096, "max_window_layers": 8}
    full = model_from_hf_config({k: v for k, v in qwen.items() if k != "sliding_window"}, "q")
    assert model_from_hf_config(qwen, "q") == full
    assert model_from_hf_config({**qwen, "use_sliding_window": False}, "q") == full
    # turned on, the layers from max_window_layers on slide (transformers' Qwen2Config)
    assert model_from_hf_config({**qwen, "use_sliding_window": True}, "q") == full  # 8 of 8
    half = model_from_hf_config({**qwen, "use_sliding_window": True, "max_window_layers": 4}, "q")
    assert (half.sliding_layers, half.kv_window(), half.window_all_layers) == (4, (4096, 1), 0)
    every = model_from_hf_config({**qwen, "use_sliding_window": True, "max_window_layers": 0}, "q")
    assert (every.sliding_layers, every.window_all_layers) == (0, 4096)


@settings(max_examples=150, deadline=None)
@given(
    prompt=st.integers(1, 700),
    output=st.integers(1, 300),
    chunk=st.integers(1, 300),
    window=st.sampled_from([16, 32, 64, 100, 128]),
)
def test_a_request_of_a_model_whose_every_layer_slides_holds_vllms_blocks(
    prompt, output, chunk, window
):
    computed = [0]
    pool = SlidingBlockPool(100_000, B, False, window, computed)

    def holds() -> int:
        return pool.held[0] - pool.skipped[0]

    n = min(prompt, chunk)
    pool.admit(0, [], 0, n, 0)
    counts = [(vllm_window_blocks(0, n, window), holds())]
    computed[0] = n
    while computed[0] < prompt:
        c = computed[0]
        n = min(prompt - c, chunk)
        assert pool.grow(0, c + n)
        counts.append((vllm_window_blocks(c, c + n, window), holds()))
        computed[0] = c + n
    pool.prefill_done(0)
    for _ in range(output - 1):
        c = computed[0]
        assert pool.add_token_each([0], computed)
        counts.append((vllm_window_blocks(c, c + 1, window), holds()))
        computed[0] = c + 1
        assert pool.held[0] == -(-computed[0] // B)  # the blocks covering its tokens
        assert holds() == min(pool.held[0], window_cap(window, B))
    assert counts[0][0] == counts[0][1], "the first chunk holds every block it computes"
    for theirs, ours in counts:  # vLLM frees the oldest a step before the new one is needed
        assert theirs <= ours <= theirs + 1
    assert pool.used == holds()
    pool.check()
    pool.release(0)
    assert pool.free == pool.num_blocks


def sliding_pool(tokens: list[int], blocks: int, window: int, cached: int) -> SlidingBlockPool:
    """A pool in which request i decodes from tokens[i] tokens, its first `cached` prompt
    blocks cached (request i's keys are its own)."""
    pool = SlidingBlockPool(blocks, B, True, window, list(tokens))
    for r, t in enumerate(tokens):
        pool.admit(r, [], 0, t, 0, computed=t)
        pool.register(r, [1000 * r + j for j in range(cached)], t)
    return pool


@settings(max_examples=150, deadline=None)
@given(
    tokens=st.lists(st.integers(1, 300), min_size=1, max_size=8),
    steps=st.integers(1, 200),
    spare=st.integers(0, 40),
    window=st.sampled_from([16, 64, 100, 128]),
    cached=st.integers(0, 6),
)
def test_a_run_of_decode_steps_of_a_sliding_model_takes_what_stepping_takes(
    tokens, steps, spare, window, cached
):
    blocks = sliding_pool(tokens, 100_000, window, cached).used + spare
    run, one_by_one = (sliding_pool(tokens, blocks, window, cached) for _ in range(2))
    rows = list(range(len(tokens)))
    k = run.decode_steps_that_fit(rows, tokens, steps)
    in_use, _ = run.decode(rows, tokens, k)
    computed, stepped = list(tokens), []
    while len(stepped) < k and one_by_one.add_token_each(rows, computed):
        computed = [c + 1 for c in computed]
        stepped.append(one_by_one.used * B)
    assert in_use == stepped, "each step of the run holds what stepping holds"
    state = (dict(run.held), dict(run.skipped), run.empty, dict(run.refs), list(run.lru))
    assert state == (
        dict(one_by_one.held),
        dict(one_by_one.skipped),
        one_by_one.empty,
        dict(one_by_one.refs),
        list(one_by_one.lru),
    )
    run.check()
    # a run ends before a step releasing a cached block; stepping on releases it as cached
    if k < steps and one_by_one.add_token_each(rows, computed):
        one_by_one.check()
    if k > 1:
        kept = k // 2
        short = sliding_pool(tokens, blocks, window, cached)
        short.decode(rows, tokens, kept)
        run.shorten(rows, tokens, k, kept, [])
        assert (dict(run.held), dict(run.skipped), run.empty) == (
            dict(short.held),
            dict(short.skipped),
            short.empty,
        )


def test_a_sliding_model_within_its_window_runs_as_full_attention_and_past_it_holds_less():
    t = random_trace(4, 80, 2, max_prompt=300, max_output=200, rate=6.0)
    cfg = VLLMConfig(pool_tokens=8000, max_num_batched_tokens=256)
    plain = simulate(t, FCFS(), ConstantStepCost(prefill=0.05, decode=0.01), cfg)
    wide = simulate(t, FCFS(), SlidingEverywhere(prefill=0.05, decode=0.01, window=600), cfg)
    # every context within the window: the same run bit for bit
    assert wide.token_times()[2].tolist() == plain.token_times()[2].tolist()
    assert wide.steps["kv_used"].tolist() == plain.steps["kv_used"].tolist()
    narrow = simulate(t, FCFS(), SlidingEverywhere(prefill=0.05, decode=0.01, window=64), cfg)
    check_invariants(narrow, cfg)
    assert (narrow.status == COMPLETED).all(), "long contexts are served, not refused"
    assert narrow.steps["kv_used"].max() < plain.steps["kv_used"].max()
    # a lone request decoding past its window holds the window's blocks and no more
    lone = simulate(
        trace([0.0], [1000], [10]), FCFS(), SlidingEverywhere(0.05, 0.01, window=64), cfg
    )
    assert lone.steps["kv_used"][-1] == window_cap(64, B) * B


@pytest.mark.parametrize(
    "cost, moved",
    [
        (ConstantStepCost(prefill=0.05, decode=0.01), 1000),
        # 63 blocks, a 64-token window holds 5 (ceil(63 / 16) + 1): the last 1000 - 58 x 16
        # tokens, in each of 2 groups beside the full layers' 1000
        (WindowedConstant(prefill=0.05, decode=0.01, window=64, groups=2), 1000 + 2 * 72),
        (SlidingEverywhere(prefill=0.05, decode=0.01, window=64), 72),  # the window alone
    ],
    ids=["dense", "hybrid", "every-layer-slides"],
)
def test_a_handoff_moves_the_kv_the_prefill_replica_holds(cost, moved):
    cluster = ClusterConfig(
        prefill_replicas=1, decode_replicas=1, disaggregation={"kv_bytes_per_token": 1024}
    )
    lone = trace([0.0], [1000], [5])
    cfg = VLLMConfig(pool_tokens=4000, hybrid_kv_cache_manager=True)
    tl = simulate(lone, FCFS(), cost, cfg, cluster)
    assert tl.status[0] == COMPLETED
    assert tl.request_columns["kv_transfer_bytes"][0] == moved * 1024
    # by default the pools' KV connector turns the hybrid manager off: every token moves
    tl = simulate(lone, FCFS(), cost, VLLMConfig(pool_tokens=4000), cluster)
    assert tl.request_columns["kv_transfer_bytes"][0] == 1000 * 1024


def test_a_sliding_models_decode_step_reads_at_most_its_window():
    mistral = model_from_hf_config(MISTRAL_7B_V01, "mistral")
    full = model_from_hf_config({**MISTRAL_7B_V01, "sliding_window": None}, "mistral")
    for kind in (RooflineCost, FittedCost):
        slid, plain = kind(model=mistral, gpu="h100"), kind(model=full, gpu="h100")
        # within the window: the full model's step times bit for bit
        assert slid.decode_time(8, 8 * 4000) == plain.decode_time(8, 8 * 4000)
        assert slid.step_time([(512, 3000)], 4, 8000) == plain.step_time([(512, 3000)], 4, 8000)
        # past it: a decode reads the windows alone, a chunk attends to the window
        assert slid.decode_time(8, 8 * 30_000) == plain.decode_time(8, 8 * 4096)
        assert slid.decode_time(8, 8 * 30_000) < plain.decode_time(8, 8 * 30_000)
        assert slid.decode_times(8, np.array([8 * 30_000]))[0] == slid.decode_time(8, 8 * 30_000)
        assert slid.step_time([(512, 20_000)]) < plain.step_time([(512, 20_000)])


def test_the_s_lora_engine_refuses_contexts_past_a_whole_model_window():
    # S-LoRA's pool keeps every token's KV: a sliding model's long context would be mis-costed
    t = trace([0.0, 0.1, 0.2], [40, 40, 30], [25, 26, 11])  # contexts 64, 65 and 40
    window = SlidingEverywhere(prefill=0.05, decode=0.01, window=64)
    tl = simulate(t, FCFS(), window, SLoRAConfig(pool_tokens=1600))
    assert tl.reason[1] == "exceeds_sliding_window"
    assert (tl.status[[0, 2]] == COMPLETED).all()


def test_a_request_whose_first_chunk_and_windows_never_fit_is_refused():
    cost = WindowedConstant(prefill=0.05, decode=0.01, window=64, groups=2)
    cfg = VLLMConfig(pool_tokens=40 * B, max_num_batched_tokens=256)
    # 256 prompt tokens in one chunk: 16 blocks in each of three groups (48 > 40), though
    # its final KV (17 blocks, 2 x 5 of windows) would fit
    t = trace([0.0, 0.0], [256, 100], [2, 2])
    tl = simulate(t, FCFS(), cost, cfg)
    assert tl.reason[0] == "kv_pool_too_small" and tl.status[1] == COMPLETED


def test_a_cpu_tier_turns_the_hybrid_kv_cache_manager_off_unless_told_otherwise():
    # vLLM turns its hybrid manager off with a KV connector: every layer keeps every token, so
    # the run is the full-attention model's; kept on, a CPU tier is not modelled (refused)
    cost = WindowedConstant(prefill=0.05, decode=0.01)
    t = random_trace(2, 40, 2, max_prompt=300, max_output=100, rate=6.0)
    tier = dict(pool_tokens=1600, cpu_kv_tokens=1600, kv_bytes_per_token=1024)
    off = simulate(t, FCFS(), cost, VLLMConfig(**tier))
    full = simulate(t, FCFS(), ConstantStepCost(prefill=0.05, decode=0.01), VLLMConfig(**tier))
    assert off.token_times()[2].tolist() == full.token_times()[2].tolist()
    assert off.steps["kv_used"].tolist() == full.steps["kv_used"].tolist()
    with pytest.raises(ConfigError, match="engine.hybrid_kv_cache_manager=true"):
        simulate(t, FCFS(), cost, VLLMConfig(**tier, hybrid_kv_cache_manager=True))


def test_without_the_hybrid_manager_every_layer_keeps_every_token():
    gemma = RooflineCost(model=model_from_hf_config(GEMMA_3_27B, "g"), gpu="h100")
    on = VLLMConfig(gpu_memory_utilization=0.9)
    off = VLLMConfig(gpu_memory_utilization=0.9, hybrid_kv_cache_manager=False)
    # the same memory, in blocks of the 10 full layers with the manager, of all 62 without
    assert off.num_blocks(gemma) == pytest.approx(on.num_blocks(gemma) * 10 / 62, rel=1e-3)
    assert (on.window(gemma), off.window(gemma)) == ((1024, 6), None)
    assert off.bytes_per_token(gemma) == 62 / 10 * gemma.model_spec.kv_bytes_per_token
    # the step times still attend over the windows: the layout alone changes
    assert gemma.with_full_attention().kv_window() is None
    assert gemma.with_full_attention().decode_time(8, 8 * 30_000) > gemma.decode_time(8, 8 * 30_000)
    llama = RooflineCost(model="llama-2-7b", gpu="h100")
    assert llama.with_full_attention() is llama
    with pytest.raises(ConfigError, match="engine.hybrid_kv_cache_manager must be true, false"):
        VLLMConfig(hybrid_kv_cache_manager="yes")


def test_gemma_3_holds_several_times_a_dense_models_blocks_per_request():
    cost = RooflineCost(model=model_from_hf_config(GEMMA_3_27B, "gemma-3-27b"), gpu="h100")
    window, groups = cost.kv_window()
    pool = WindowedBlockPool(10_000, B, True, window, groups, [0])
    # decoding with 2,049 tokens: 129 full-attention blocks and 6 groups of 65 (a 1,024-token
    # window spans 64 blocks, 65 as it slides): 4x a dense model's 129
    assert 129 + pool.decoding_blocks(129) == 129 + 6 * 65
    # while its 2,048-token prompt is computed in one chunk, every group holds all of it
    cfg = VLLMConfig(gpu_memory_utilization=0.9)
    assert cfg.peak_blocks(np.array([2048]), 2, cost).tolist() == [7 * 128]


# ---- the sliding layers' attention in the GPU cost models ------------------------------------


def test_a_windowed_prefill_forms_the_pairs_counted_one_by_one():
    for position in (1, 500, 1024, 1025, 3000):
        by_hand = sum(min(p, 1024) for p in range(1, position + 1))
        assert windowed_pairs(position, 1024) == by_hand


@pytest.mark.parametrize("kind", [RooflineCost, FittedCost])
def test_a_gemma_3_decode_step_reads_each_sliding_layers_window(kind):
    cost = kind(model=model_from_hf_config(GEMMA_3_27B, "gemma-3-27b"), gpu="h100")
    m = cost.model_spec
    layer_bytes = m.kv_bytes_per_token / m.attention_layers  # one layer's keys and values
    assert (m.attention_layers, m.sliding_layers) == (10, 52)
    n, ctx = 16, 16 * 8192  # 16 requests of 8k tokens: every window full
    full = cost.decode_time(n, ctx)
    # the same step had the sliding layers no KV: 52 layers x 16 x 1,024 tokens (and the new
    # ones) more to read, which bandwidth bounds at this context
    read = 52 * (n * 1024 + n) * layer_bytes
    if kind is RooflineCost:
        rate = m.kv_bytes_per_token / (cost.gpu_spec.hbm_bandwidth * cost.memory_efficiency)
        plain = cost._count_terms(n, n) + rate * (ctx + n) + cost.step_overhead
        bandwidth = cost.gpu_spec.hbm_bandwidth * cost.memory_efficiency
    else:
        rate = cost.beta["attention"] * m.kv_bytes_per_token / cost.gpu_spec.hbm_bandwidth
        plain = cost._count_part(n, n) + rate * (ctx + n)
        bandwidth = cost.gpu_spec.hbm_bandwidth / cost.beta["attention"]
    assert full - plain == pytest.approx(read / bandwidth, rel=1e-9)
    # decode steps timed one by one, as a run, and as a mixed step agree bit for bit
    contexts = np.array([500, 16 * 1024, 16 * 8192])
    one_by_one = [cost.decode_time(n, int(c)) for c in contexts]
    assert cost.decode_times(n, contexts).tolist() == one_by_one
    assert [cost.step_time(decode_batch=n, decode_context=int(c)) for c in contexts] == one_by_one
