"""DeepSeek's sparse attention (DeepSeek-V3.2, GLM-5: `index_topk` on latent attention): an
indexer scores every cached token for each query and attention reads only the top-k. Checked:
the published configs read with their sizes and vLLM's KV layout, the step's pairs and KV
counted by hand, the three ways of timing a decode giving one float, and whole runs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_real_engine_settings import DEEPSEEK_V3, LLAMA_3_1_70B
from test_vllm_engine import check_invariants

from conftest import random_trace
from cost_models import CostModelError, FittedCost, RooflineCost
from cost_models.base import sparse_step_shape, windowed_pairs
from cost_models.hardware import ModelSpec
from cost_models.hf_config import model_from_hf_config
from policies import FCFS
from simulator.engines import ClusterConfig, VLLMConfig, simulate

# GLM-5's config.json as inference-sim/inference-sim ships it (model_configs/glm-5.2-fp8):
# latent attention, a 32-head indexer of width 128 picking 2,048 keys, 256 experts, fp8
GLM_5 = {
    "model_type": "glm_moe_dsa", "hidden_size": 6144, "intermediate_size": 12288,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
    "num_hidden_layers": 78, "num_attention_heads": 64, "num_key_value_heads": 64,
    "head_dim": 192, "q_lora_rank": 2048, "kv_lora_rank": 512, "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64, "v_head_dim": 256, "index_topk": 2048, "index_n_heads": 32,
    "index_head_dim": 128, "vocab_size": 154880, "tie_word_embeddings": False,
    "dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"},
}  # fmt: skip
# DeepSeek-V3.2's config.json: V3's shape and a 64-head indexer (deepseek-ai/DeepSeek-V3.2-Exp)
DEEPSEEK_V3_2 = {**DEEPSEEK_V3, "index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128}


def glm5(**changes: object) -> ModelSpec:
    return dataclasses.replace(model_from_hf_config(GLM_5, "glm-5"), **changes)


def test_the_published_sparse_configs_read_with_their_sizes_and_vllms_kv_layout():
    m = model_from_hf_config(GLM_5, "glm-5")
    assert (m.index_topk, m.index_heads, m.index_head_dim) == (2048, 32, 128)
    # GLM-5's model card: 744B parameters, 40B active (the indexer's projections included)
    assert m.params == pytest.approx(744e9, rel=0.002)
    assert m.layer_params * m.layers + m.vocab * m.hidden == pytest.approx(40e9, rel=0.03)
    # vLLM's default cache for these models: the latent in fp8 with an fp32 scale per 128
    # values and the rotary key in 16 bits (656 bytes), and the indexer's fp8 key with its
    # scale (132 bytes), in each of the 78 layers
    auto = FittedCost(model=m, gpu="h200", tp=8).model_spec
    assert auto.kv_bytes_per_token == 78 * ((512 + 4 * 4 + 2 * 64) + (128 + 4))
    wide = FittedCost(model=m, gpu="h200", tp=8, kv_cache_dtype="bfloat16").model_spec
    assert wide.kv_bytes_per_token == 78 * ((512 + 64) * 2 + 132)
    v32 = model_from_hf_config(DEEPSEEK_V3_2, "deepseek-v3.2")
    v3 = model_from_hf_config(DEEPSEEK_V3, "deepseek-v3")
    # the indexer adds its query (from the 1,536-wide query latent), key and head weights
    indexer = 1536 * 64 * 128 + 7168 * (128 + 64)
    assert v32.params - v3.params == 61 * indexer
    served = RooflineCost(model=v32, gpu="h200", tp=8).model_spec  # (the 8-bit cache)
    assert served.sparse_attention() == (2048, 2 * 64 * 128 / v3.pair_flops, 656 / 788, 132 / 788)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"kv_lora_rank": None}, "sparse attention \\(index_topk\\) is modelled on latent"),
        ({"index_n_heads": None}, "config.json has no index_n_heads"),
        ({"index_head_dim": "wide"}, "index_head_dim"),
        ({"index_topk": -5}, "index_topk must be an integer >= 0"),
    ],
)
def test_a_sparse_config_missing_what_it_needs_is_an_error_naming_it(change, named):
    with pytest.raises(CostModelError, match=named):
        model_from_hf_config({**GLM_5, **change}, "glm-5")
    with pytest.raises(CostModelError, match="sparse attention .index_topk. and sliding"):
        glm5(window_all_layers=4096)


def test_a_step_counts_the_indexer_over_every_token_and_attention_over_the_top_k():
    topk, ratio, latent, key = sparse = (100, 0.25, 0.75, 0.25)
    # two decodes of 40 and 260 tokens (300 in all; 2 x 100 = 200 at most picked) and a chunk
    # of 30 after 90 cached: its queries at positions 91..120 pick min(p, 100) keys each
    tokens, pairs, kv = sparse_step_shape([(30, 90)], 2, 300, sparse)
    picked_by_chunk = sum(min(p, topk) for p in range(91, 121))
    assert picked_by_chunk == windowed_pairs(120, topk) - windowed_pairs(90, topk)
    every = 300 + sum(range(91, 121))  # the indexer: each query against all before it
    assert tokens == 32
    assert pairs == pytest.approx(200 + picked_by_chunk + ratio * every)
    # latents: the decodes' picked 200 and the chunk's 90 cached (any may be picked); index
    # keys: all 390 cached
    assert kv == pytest.approx(latent * (200 + 90) + key * 390)
    # within the top-k, the same pairs and KV as full attention, plus the indexer's pairs
    tokens, pairs, kv = sparse_step_shape([(30, 0)], 3, 150, sparse)
    assert (pairs, kv) == (150 + 465 + ratio * (150 + 465), 150.0)


@pytest.mark.parametrize("kind", [RooflineCost, FittedCost])
def test_a_sparse_decode_is_the_same_float_step_by_step_as_a_run_or_a_step(kind):
    cost = kind(model=glm5(), gpu="h200", tp=8)
    for batch in (1, 7, 64):
        ctx = np.array([batch * 100, batch * 2048 - 1, batch * 2049, batch * 50_000])
        run = cost.decode_times(batch, ctx)
        one = [cost.decode_time(batch, int(c)) for c in ctx]
        step = [cost.step_time((), batch, int(c)) for c in ctx]
        np.testing.assert_array_equal(run, one)
        np.testing.assert_array_equal(run, step)


def test_long_contexts_cost_less_than_dense_latent_attention_and_short_ones_a_little_more():
    sparse = FittedCost(model=glm5(), gpu="h200", tp=8)
    dense_spec = glm5(index_topk=0, index_heads=0, index_head_dim=0, kv_dtype_bytes=1)
    dense = FittedCost(model=dense_spec, gpu="h200", tp=8, kv_cache_dtype="fp8")
    # 64 requests decoding at 32k tokens each: attention reads 2,048 latents a request
    assert sparse.decode_time(64, 64 * 32_000) < 0.75 * dense.decode_time(64, 64 * 32_000)
    # a 2,048-token chunk after 120k cached: quadratic attention becomes linear in the top-k
    assert sparse.step_time([(2048, 120_000)]) < 0.6 * dense.step_time([(2048, 120_000)])
    # short contexts: every token is picked anyway; the indexer's work and key come on top
    for args in (([], 64, 64 * 500), ([(2048, 0)], 0, 0)):
        assert dense.step_time(*args) <= sparse.step_time(*args) < 1.05 * dense.step_time(*args)
    # the indexer's key takes pool room: fewer tokens fit than with the latent alone
    assert sparse.kv_capacity_tokens(0.9) < dense.kv_capacity_tokens(0.9)


@pytest.mark.parametrize(
    "cluster",
    [
        None,
        ClusterConfig(2, "least_requests"),
        ClusterConfig(prefill_replicas=1, decode_replicas=1),
    ],
    ids=["one", "coupled", "disaggregated"],
)
def test_fast_forward_changes_nothing_for_a_sparse_model(cluster):
    cost = FittedCost(model=glm5(), gpu="h200", tp=8)
    t = random_trace(4, 60, 3, max_prompt=6000, max_output=300, rate=30.0)
    runs = []
    for ff in (True, False):
        cfg = VLLMConfig(pool_tokens=20_000, max_num_batched_tokens=2048, fast_forward=ff)
        tl = simulate(t, FCFS(), cost, cfg, cluster)
        check_invariants(tl, cfg)
        runs.append(tl)
    on, off = runs
    assert on.token_times()[2].tolist() == off.token_times()[2].tolist()
    assert on.request_columns["preemptions"].sum() > 0, "the pool was tight enough to preempt"


def test_a_long_context_workload_finishes_sooner_with_sparse_attention():
    t = random_trace(5, 40, 2, max_prompt=60_000, max_output=400, rate=0.5)
    cfg = VLLMConfig(max_num_batched_tokens=8192)
    sparse = simulate(t, FCFS(), FittedCost(model=glm5(), gpu="h200", tp=8), cfg)
    dense_spec = glm5(index_topk=0, index_heads=0, index_head_dim=0)
    dense = simulate(t, FCFS(), FittedCost(model=dense_spec, gpu="h200", tp=8), cfg)
    e2e = [
        float(np.mean(tl.finished_at - t.arrival)) for tl in (sparse, dense)
    ]  # every request completes in both
    assert (sparse.status == 0).all() and (dense.status == 0).all()
    assert e2e[0] < 0.8 * e2e[1]


@pytest.mark.parametrize(
    "extra, named",
    [
        # DeepSeek-V4: compressed attention over a sliding window, with an indexer
        (
            {"compress_ratios": [4] * 40 + [128] * 40, "sliding_window": 128, "index_topk": 512},
            "compress_ratios: compressed attention",
        ),
        # MiniMax-M3: an indexer on grouped-query heads in some layers
        (
            {"sparse_attention_config": {"use_sparse_attention": True, "sparse_index_dim": 64}},
            "sparse_attention_config: sparse attention on grouped-query heads",
        ),
        # Gemma 4: its full layers' KV heads and width differ from the sliding layers'
        ({"num_global_key_value_heads": 2}, "num_global_key_value_heads: full layers shaped"),
        ({"global_head_dim": 512}, "global_head_dim: full layers shaped"),
        # Gemma 3n: the last layers reuse earlier layers' KV
        ({"num_kv_shared_layers": 10}, "num_kv_shared_layers: layers reusing"),
        # Kimi Linear: linear-attention layers
        ({"linear_attn_config": {"kda_layers": [1, 2, 3]}}, "linear_attn_config"),
    ],
    ids=["deepseek-v4", "minimax-m3", "gemma-4-heads", "gemma-4-width", "gemma-3n", "kimi-linear"],
)
def test_attention_fairsim_does_not_model_is_an_error_naming_the_field(extra, named):
    """Each field changes what a layer caches or reads: read as plain attention, the pool and
    the step times would be wrong without a word."""
    with pytest.raises(CostModelError, match=f"^m: config.json has {named}"):
        model_from_hf_config({**LLAMA_3_1_70B, **extra}, "m")
    # switched off, the same fields change nothing
    plain = model_from_hf_config(LLAMA_3_1_70B, "m")
    off = {"sparse_attention_config": {"use_sparse_attention": False}, "num_kv_shared_layers": 0}
    assert model_from_hf_config({**LLAMA_3_1_70B, **off}, "m") == plain
