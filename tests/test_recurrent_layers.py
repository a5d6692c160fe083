"""Gated-DeltaNet layers (Qwen3-Next, Qwen3.5: `linear_attention`): no KV per token but a
fixed-size state per request, paged by vLLM's hybrid allocator in blocks grown until a page
holds a layer's state. Checked: the published configs read with their sizes, vLLM's block
size and per-request reservation, the pool step by step, one float however a decode is timed,
fast-forward, and what is refused."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_real_engine_settings import FIELD_VALUES
from test_vllm_engine import check_invariants, trace

from conftest import random_trace, with_shared_prefixes
from cost_models import CostModelError, FittedCost, RooflineCost
from cost_models.hf_config import model_from_hf_config
from policies import FCFS, VTC
from simulator.api import compose_config, run_config
from simulator.core.errors import ConfigError
from simulator.engines import ClusterConfig, VLLMConfig, simulate
from simulator.report.console import format_summary

# Qwen/Qwen3-Next-80B-A3B-Instruct's config.json (the fields read): 48 layers, every fourth
# attention (16 heads, 2 KV heads of 256, an output gate), the others gated DeltaNet (16 key
# and 32 value heads of 128, a 4-wide convolution); 512 experts, 10 and a shared one active
QWEN3_NEXT = {
    "model_type": "qwen3_next", "hidden_size": 2048, "intermediate_size": 5120,
    "num_hidden_layers": 48, "full_attention_interval": 4, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "num_experts": 512, "num_experts_per_tok": 10,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
    "decoder_sparse_step": 1, "vocab_size": 151936, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}  # fmt: skip
# a Qwen3.5-generation dense model wrapped as its published config wraps it (Qwen3.8-27B's
# shape: 64 layers, 16 of them attention with 4 KV heads of 256; 48 value heads; the state kept
# in float32 as its mamba_ssm_dtype says)
QWEN3_8_27B = {
    "model_type": "qwen3_5",
    "text_config": {
        "model_type": "qwen3_5_text", "hidden_size": 5120, "intermediate_size": 17408,
        "num_hidden_layers": 64, "full_attention_interval": 4, "num_attention_heads": 24,
        "num_key_value_heads": 4, "head_dim": 256, "linear_num_key_heads": 16,
        "linear_num_value_heads": 48, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32", "vocab_size": 248320,
    },
}  # fmt: skip

# ibm-granite/granite-4.0-h-small's config.json (the fields read, as a public write-up quotes
# it): 40 layers, 4 of them attention ("attention"), 36 Mamba-2 ("mamba": a 128-wide state, a
# 4-wide convolution, mamba_expand 2), every layer a MoE of 72 experts of 768 (10 active) and a
# shared one of 1,536; the heads (128 of 64, one group) are not in that quote: 128 x 64 is
# mamba_expand x hidden
GRANITE_4_H_SMALL = {
    "model_type": "granitemoehybrid", "hidden_size": 4096, "num_hidden_layers": 40,
    "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 72,
    "num_experts_per_tok": 10, "intermediate_size": 768, "shared_intermediate_size": 1536,
    "mamba_n_heads": 128, "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1,
    "mamba_d_conv": 4, "mamba_expand": 2, "vocab_size": 100352, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "layer_types": (["mamba"] * 5 + ["attention"] + ["mamba"] * 4) * 4,
}  # fmt: skip

# Nemotron 3 Nano 30B-A3B: 52 one-block layers (M Mamba-2, * attention, E mixture of experts),
# the pattern, attention and Mamba-2 fields as its config.json gives them (copied, with vLLM's
# paging of it, in the apron project's tests); its MoE fields (128 experts of 1,856, 6 active,
# a shared one of 3,712, squared-ReLU MLPs) as we read its published description, not copied
# from the file: only the totals they give are checked, against NVIDIA's figures
NEMOTRON_3_NANO = {
    "model_type": "nemotron_h",
    "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
    "num_hidden_layers": 52, "hidden_size": 2688, "num_attention_heads": 32,
    "num_key_value_heads": 2, "head_dim": 128, "mamba_num_heads": 64, "mamba_head_dim": 64,
    "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "mamba_ssm_cache_dtype": "float32",
    "n_routed_experts": 128, "num_experts_per_tok": 6, "moe_intermediate_size": 1856,
    "moe_shared_expert_intermediate_size": 3712, "intermediate_size": 1856,
    "vocab_size": 131072, "torch_dtype": "bfloat16",
}  # fmt: skip


def qwen3_next(**changes: object):
    return dataclasses.replace(model_from_hf_config(QWEN3_NEXT, "qwen3-next"), **changes)


def test_qwen3_next_reads_with_its_size_and_its_layers_state():
    m = qwen3_next()
    assert (m.recurrent_layers, m.attention_layers) == (36, 12)
    # a DeltaNet layer: projections to q, k (16 x 128 each), v and the gate z (32 x 128
    # each) and the two per-head gates, the convolution over q, k, v, and the output
    deltanet = 2048 * (2 * 2048 + 2 * 4096 + 2 * 32) + (2 * 2048 + 4096) * 4 + 4096 * 2048
    assert m.recurrent_params == deltanet
    # attention: the query projection also gives an output gate per head
    assert m.attention_params == 2048 * (2 * 16 * 256 + 2 * 2 * 256) + 16 * 256 * 2048
    assert m.params == pytest.approx(80e9, rel=0.01)  # "80B in total" (its model card)
    # KV per token: the 12 attention layers only; the state: the convolution's last 3 inputs
    # over 2 x 2048 + 4096 channels and 32 matrices of 128 x 128, 16-bit
    assert m.kv_bytes_per_token == 12 * 2 * 2 * 256 * 2
    assert m.recurrent_state_per_layer() == 8192 * 3 * 2 + 32 * 128 * 128 * 2
    assert m.state_groups() == 3  # groups of 12 layers: one of attention, three of DeltaNet
    # vLLM on one GPU: "Setting attention block size to 544 tokens to ensure that attention
    # page size is >= mamba page size" (16 x ceil(1,097,728 / (16 x 2,048)))
    assert m.state_block_size(1, 16) == 544
    assert m.state_block_size(4, 16) == 272 and m.state_block_size(4, 1024) == 1024


def test_a_qwen3_5_models_reservation_is_what_vllms_allocator_pages():
    cost = RooflineCost(model=model_from_hf_config(QWEN3_8_27B, "qwen3.8-27b"), gpu="h200")
    m = cost.model_spec
    assert m.recurrent_state_bytes == 4 and cost.kv_block_size(16) == 784
    # vLLM 0.29 holds a 262,144-token request of this config in 17,520,656,384 bytes, or in
    # 17,366,515,712 with prefix caching off (a trace of its allocator's paging, in the apron
    # project's tests: 335 attention blocks of 784 tokens and, in each of 3 state groups, two
    # pages, or one; every block 784 x 65,536 bytes)
    for caching, held in ((True, 17_520_656_384), (False, 17_366_515_712)):
        cfg = VLLMConfig(pool_tokens=2_000_000, enable_prefix_caching=caching).for_cost(cost)
        blocks = int(cfg.peak_blocks(np.array([262_144]), 1, cost)[0])
        assert blocks * cfg.block_size * m.kv_bytes_per_token == held


@pytest.mark.parametrize("caching, pages", [(True, 2), (False, 1)])
def test_a_request_holds_its_attention_blocks_and_its_state_pages_at_every_step(caching, pages):
    cost = FittedCost(model=qwen3_next(), gpu="h100", tp=4)  # blocks of 272 tokens
    lone = trace([0.0], [1000], [700])
    cfg = VLLMConfig(max_num_batched_tokens=512, enable_prefix_caching=caching)
    tl = simulate(lone, FCFS(), cost, cfg)
    b = tl.info["block_size"]
    assert b == 272
    # its KV after each step: the tokens it has computed, in blocks, and in each of 3 state
    # groups one page, two with prefix caching on (the state at the last block boundary)
    computed = np.cumsum(tl.steps["num_tokens"])
    held = (-(-computed // b) + 3 * pages) * b
    assert tl.steps["kv_used"].tolist() == held.tolist()


@pytest.mark.parametrize("kind", [RooflineCost, FittedCost])
def test_a_decode_is_the_same_float_step_by_step_as_a_run_or_a_step(kind):
    cost = kind(model=qwen3_next(), gpu="h100", tp=4)
    for batch in (1, 9, 128):
        ctx = np.array([batch * 10, batch * 3000, batch * 70_000])
        run = cost.decode_times(batch, ctx)
        np.testing.assert_array_equal(run, [cost.decode_time(batch, int(c)) for c in ctx])
        np.testing.assert_array_equal(run, [cost.step_time((), batch, int(c)) for c in ctx])


def test_every_step_reads_and_writes_each_requests_state_and_long_contexts_stay_cheap():
    hybrid = RooflineCost(model=qwen3_next(), gpu="h100", tp=4)
    m = hybrid.model_spec
    # the state, read and written, in tokens of the attention layers' KV
    assert hybrid._state == 2 * 36 * m.recurrent_state_per_layer() / m.kv_bytes_over(4)
    # all 48 layers attention instead: every token's KV in every layer
    dense = RooflineCost(model=qwen3_next(recurrent_layers=0), gpu="h100", tp=4)
    assert hybrid.decode_time(64, 64 * 32_000) < 0.5 * dense.decode_time(64, 64 * 32_000)
    # short contexts: the states cost more than attention over 16 tokens in those layers
    assert hybrid.decode_time(64, 64 * 16) > dense.decode_time(64, 64 * 16)
    assert hybrid.kv_capacity_tokens(0.9) > 3 * dense.kv_capacity_tokens(0.9)


@pytest.mark.parametrize(
    "cluster",
    [None, ClusterConfig(2, "round_robin"), ClusterConfig(2, "least_requests")],
    ids=["one", "independent", "coupled"],
)
def test_fast_forward_changes_nothing_and_the_pool_preempts_within_its_blocks(cluster):
    cost = FittedCost(model=qwen3_next(), gpu="h100", tp=4)
    t = with_shared_prefixes(random_trace(6, 120, 3, max_prompt=4000, max_output=300, rate=30.0), 6)
    runs = []
    for ff in (True, False):
        cfg = VLLMConfig(pool_tokens=40_000, fast_forward=ff)
        tl = simulate(t, VTC(), cost, cfg, cluster)
        check_invariants(tl, cfg.for_cost(cost))
        runs.append(tl)
    on, off = runs
    assert on.token_times()[2].tolist() == off.token_times()[2].tolist()
    assert on.request_columns["preemptions"].sum() > 0, "the pool was tight enough to preempt"
    # prefix caching is off for such a model (a hit would need the state where it ends)
    assert on.request_columns["cached_tokens"].sum() == 0


def test_what_vllm_cannot_do_with_recurrent_layers_is_refused_by_name():
    cost = FittedCost(model=qwen3_next(), gpu="h100", tp=4)
    t = random_trace(1, 5, 1, max_prompt=100, max_output=10, rate=1.0)
    with pytest.raises(CostModelError, match="recurrent .gated-DeltaNet. layers.*a CPU tier"):
        simulate(t, FCFS(), cost, VLLMConfig(pool_tokens=40_000, cpu_kv_tokens=10_000))
    with pytest.raises(ConfigError, match="a CPU tier.*recurrent layers"):
        cfg = VLLMConfig(pool_tokens=40_000, cpu_kv_tokens=10_000, hybrid_kv_cache_manager=True)
        simulate(t, FCFS(), cost, cfg)
    with pytest.raises(CostModelError, match="recurrent .gated-DeltaNet. layers.*disaggregated"):
        pd = ClusterConfig(prefill_replicas=1, decode_replicas=1)
        simulate(t, FCFS(), cost, VLLMConfig(pool_tokens=40_000), pd)
    with pytest.raises(CostModelError, match="hybrid_kv_cache_manager=false"):
        cfg = VLLMConfig(pool_tokens=40_000, hybrid_kv_cache_manager=False)
        simulate(t, FCFS(), cost, cfg)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"full_attention_interval": None}, "linear_num_value_heads .gated DeltaNet. but neither"),
        ({"linear_conv_kernel_dim": None}, "has no linear_conv_kernel_dim"),
        ({"mamba_ssm_dtype": "int4"}, "mamba_ssm_dtype='int4'; accepted: float32"),
        ({"layer_types": ["mamba"] * 48}, "layer_types has \\['mamba'\\]"),
        ({"layer_types": ["linear_attention"] * 47}, "names 47 layers' kinds for num_hidden_lay"),
        ({"full_attention_interval": -2}, "full_attention_interval=-2: an integer >= 1"),
        ({"num_hidden_layers": 10**9}, "num_hidden_layers=1000000000: from 1 to 10000"),
    ],
)
def test_a_hybrid_config_missing_what_it_needs_is_an_error_naming_it(change, named):
    with pytest.raises(CostModelError, match=f"^m: config.json .*{named}"):
        model_from_hf_config({**QWEN3_NEXT, **change}, "m")
    heads = {"mamba_d_head": None, "mamba_n_heads": 0}  # (the width would divide by them)
    with pytest.raises(CostModelError, match="^m: config.json mamba_n_heads=0: an integer >= 1"):
        model_from_hf_config({**GRANITE_4_H_SMALL, **heads}, "m")


def test_granite_4_h_reads_its_mamba_2_layers_with_its_published_size():
    m = model_from_hf_config(GRANITE_4_H_SMALL, "granite-4.0-h-small")
    assert (m.recurrent_layers, m.attention_layers, m.shared_experts) == (36, 4, 2)
    # IBM's model card: 32B parameters, 9B active
    assert m.params == pytest.approx(32e9, rel=0.01)
    assert m.layer_params * m.layers + m.vocab * m.hidden == pytest.approx(9e9, rel=0.03)
    # a Mamba-2 layer: x and z (128 x 64 each), B and C (128 each), a step size per head in;
    # the convolution over x, B and C; the output from 8,192
    inner = 128 * 64
    assert (
        m.recurrent_params == 4096 * (2 * inner + 2 * 128 + 128) + (inner + 256) * 4 + inner * 4096
    )
    # its state: the convolution's last 3 inputs, 128 heads' 64 x 128 matrices, 16-bit
    assert m.recurrent_state_per_layer() == (inner + 256) * 3 * 2 + 128 * 64 * 128 * 2
    # groups of 4 layers (the attention ones): 9 of Mamba-2 layers; blocks of 528 tokens
    assert m.state_groups() == 9 and m.state_block_size(1, 16) == 528
    cost = FittedCost(model=m, gpu="h100")
    t = random_trace(7, 60, 2, max_prompt=3000, max_output=200, rate=20.0)
    runs = [
        simulate(t, FCFS(), cost, VLLMConfig(pool_tokens=30_000, fast_forward=ff))
        for ff in (True, False)
    ]
    assert runs[0].token_times()[2].tolist() == runs[1].token_times()[2].tolist()
    assert runs[0].info["block_size"] == 528 and (runs[0].status == 0).all()


def test_nemotron_h_reads_its_one_block_layers_and_pages_its_state_as_vllm_does():
    m = model_from_hf_config(NEMOTRON_3_NANO, "nemotron-3-nano")
    # 23 Mamba-2 and 6 attention blocks with no MLP, 23 MoE blocks with no mixer
    assert (m.recurrent_layers, m.attention_layers) == (23, 6)
    assert (m.mixer_only_layers, m.mlp_only_layers, m.moe_layers) == (29, 23, 23)
    assert not m.gated_mlp and m.shared_experts == 2
    # NVIDIA's figures: 31.6B parameters, 3.2B active (without the embeddings)
    assert m.params == pytest.approx(31.6e9, rel=0.005)
    assert m.layer_params * m.layers + m.vocab * m.hidden == pytest.approx(3.2e9, rel=0.03)
    assert m.allreduces == 52  # one all-reduce after each block, not two per layer
    # its state: the convolution over x (64 x 64) and 8 groups' B and C (128 each), 16-bit;
    # 64 heads' 64 x 128 matrices in float32
    assert m.recurrent_state_per_layer() == (4096 + 2 * 8 * 128) * 3 * 2 + 64 * 64 * 128 * 4
    # vLLM's paging: blocks of 2,096 tokens, groups of 6 layers (4 of Mamba-2); a 262,144-token
    # request holds 126 attention blocks and two pages in each state group, 1,725,628,416
    # bytes, as vLLM 0.29 holds it (traced in the apron project's tests)
    cost = RooflineCost(model=m, gpu="h100")
    cfg = VLLMConfig(pool_tokens=2_000_000).for_cost(cost)
    blocks = int(cfg.peak_blocks(np.array([262_144]), 1, cost)[0])
    assert (cfg.block_size, m.state_groups(), blocks) == (2096, 4, 126 + 2 * 4)
    assert blocks * 2096 * m.kv_bytes_per_token == 1_725_628_416
    t = random_trace(8, 60, 2, max_prompt=3000, max_output=200, rate=20.0)
    runs = [
        simulate(t, FCFS(), FittedCost(model=m, gpu="h100"), VLLMConfig(fast_forward=ff))
        for ff in (True, False)
    ]
    assert runs[0].token_times()[2].tolist() == runs[1].token_times()[2].tolist()
    assert (runs[0].status == 0).all()


HYBRID_FIELDS = sorted({*QWEN3_NEXT, *GRANITE_4_H_SMALL, *NEMOTRON_3_NANO, "layer_types"})


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([QWEN3_NEXT, GRANITE_4_H_SMALL, NEMOTRON_3_NANO]),
    st.dictionaries(st.sampled_from(HYBRID_FIELDS), FIELD_VALUES, max_size=3),
    st.sampled_from([1, 2, 4]),
)
def test_any_hybrid_config_gives_a_model_or_an_error_naming_a_field_never_a_crash(base, change, tp):
    try:
        m = model_from_hf_config({**base, **change}, "m")
        cost = RooflineCost(model=m, gpu="h100", tp=tp)
        cost.step_time([(100, 0), (1, 50)])
        cost.decode_time(4, 400)
        cost.kv_block_size(16)
    except CostModelError as err:
        assert str(err).startswith(("m:", "model 'm':", "cost_model.")), str(err)


def test_the_run_says_its_blocks_were_grown_for_the_state(tmp_path):
    config = tmp_path / "qwen3-next" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(QWEN3_NEXT))
    overrides = [
        "engine=vllm", "cost_model=fitted", f"cost_model.model={config}", "cost_model.gpu=h100",
        "cost_model.tp=4", "workload=poisson_chat", "workload.duration=20", "compare_with=null",
        "pictures=false", "veeksha_metrics=false", "~qoe",
    ]  # fmt: skip
    _, outputs = run_config(compose_config(overrides), tmp_path / "run")
    assert outputs.summary["vllm"]["block_size"] == 272
    assert "KV blocks of 272 tokens, not engine.block_size's" in format_summary(outputs.summary)
    # a model without recurrent layers keeps the configured block size and says nothing of it
    plain = [o for o in overrides if not o.startswith(("cost_model.model", "cost_model.tp"))]
    _, outputs = run_config(compose_config(plain), tmp_path / "plain")
    assert "block_size" not in outputs.summary["vllm"]
