"""A model's shape from its Hugging Face `config.json`: dense (Llama 2/3/3.1, Mistral, Qwen2/2.5/3,
Yi, CodeLlama) and mixture-of-experts (Mixtral, Qwen2/3-MoE, Llama 4's `text_config`,
DeepSeek-V2/V3, gpt-oss).

Read: layers, hidden size, attention and KV heads (GQA) and `head_dim` for the KV bytes; the MLP
width; experts (`num_local_experts` / `num_experts` / `n_routed_experts`), experts per token,
the expert MLP width (`moe_intermediate_size`), shared experts, Llama 4's interleaving and
DeepSeek's leading dense layers (`first_k_dense_replace`) for the weights a step reads;
DeepSeek's latent attention (`kv_lora_rank`, `q_lora_rank`, the heads' `qk_nope_head_dim`,
`qk_rope_head_dim` and `v_head_dim`) and sparse attention (DeepSeek-V3.2, GLM-5: `index_topk`,
`index_n_heads`, `index_head_dim`); the layers `layer_types` (or Gemma's
`sliding_window_pattern`, or Qwen2's `use_sliding_window`) marks `sliding_attention` and their
`sliding_window`, which with neither field every layer attends to (Mistral 7B v0.1, Phi-3 4k);
Llama 4's chunked layers (`attention_chunk_size`, `no_rope_layers`); gated-DeltaNet layers
(Qwen3-Next, Qwen3.5: `linear_attention` in `layer_types`, or all but every
`full_attention_interval`-th layer; `linear_num_key_heads`, `linear_num_value_heads`, their
widths, `linear_conv_kernel_dim`, `mamba_ssm_dtype`) and Granite 4.0-H's Mamba-2 layers
(`mamba` in `layer_types`, `mamba_n_heads`, `mamba_d_head`, `mamba_d_state`, `mamba_n_groups`,
`mamba_d_conv`), and Nemotron-H's one-block layers (`hybrid_override_pattern`: Mamba-2,
attention, MLP, experts);
`tie_word_embeddings`; a two-matrix MLP for the families that have one (`PLAIN_MLP`); the
weights' format from `quantization_config` (fp8, int8 W8A8, NVFP4, 8- and
4-bit weight-only: `WEIGHT_FORMATS`; gpt-oss's mxfp4 experts), else `torch_dtype` (or
`dtype`), which `dtype=` overrides. An unknown architecture still loads when its fields are the
usual ones; a missing field, a quantization not modelled, or layers that are neither attention
nor gated DeltaNet (other state-space or linear attention: `attention_layers`) is an error
naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cost_models.base import CostModelError
from cost_models.hardware import ModelSpec

MXFP4_BYTES = 0.53125  # a 4-bit value and a shared 8-bit scale per 32 values
GROUP_SIZE = 128  # weights per 16-bit scale of AWQ's and GPTQ's usual 4-bit checkpoints


@dataclass(frozen=True)
class WeightFormat:
    """How the decoder layers' linear weights are stored and multiplied: bytes per weight
    (scales included) and the products' number format (`ModelSpec.compute`). The embeddings
    and the output head stay 16-bit in every quantized checkpoint vLLM serves."""

    linear_bytes: float
    compute: str

    @property
    def quantized(self) -> bool:
        """Narrower than the 16-bit weights vLLM's `--dtype` names."""
        return self.linear_bytes < 2


def weight_only(bits: int, group_size: int = GROUP_SIZE) -> WeightFormat:
    """Weights of `bits` bits with a 16-bit scale per `group_size` of them (-1 or 0: one per
    output channel, negligible), dequantized to 16-bit products (AWQ, GPTQ, Marlin)."""
    scales = 2 / group_size if group_size > 0 else 0.0
    return WeightFormat(bits / 8 + scales, "16-bit")


# cost_model.dtype's accepted names: the checkpoint's format, whatever its config.json says
WEIGHT_FORMATS = {
    "fp16": WeightFormat(2.0, "16-bit"),
    "bf16": WeightFormat(2.0, "16-bit"),
    "fp8": WeightFormat(1.0, "fp8"),  # W8A8 fp8 (16-bit products on GPUs without fp8 units)
    "int8": WeightFormat(1.0, "int8"),  # W8A8 int8 (SmoothQuant-style)
    "w8a16": weight_only(8),  # 8-bit weights, 16-bit products (GPTQ 8-bit, fp8 weight-only)
    "w4a16": weight_only(4),  # 4-bit weights, 16-bit products (AWQ, GPTQ)
    # NVFP4: 4-bit floats with an fp8 scale per 16, products in fp4 where the GPU has fp4 units
    # (Blackwell), else dequantized to 16 bits
    "nvfp4": WeightFormat(0.5 + 1 / 16, "fp4"),
}
QUANTIZED = [name for name, f in WEIGHT_FORMATS.items() if f.quantized]
ALIASES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "bf16"}


def weight_format(dtype: str, key: str = "cost_model.dtype") -> WeightFormat:
    """The format a dtype name stands for (see WEIGHT_FORMATS; torch's names too: a float32
    checkpoint is served 16-bit, as vLLM's dtype=auto does)."""
    name = str(dtype).lower().removeprefix("torch.")
    if name.startswith("float8"):
        name = "fp8"
    name = ALIASES.get(name, name)
    if name not in WEIGHT_FORMATS:
        raise CostModelError(f"{key}={dtype!r}: accepted: {', '.join(WEIGHT_FORMATS)}")
    return WEIGHT_FORMATS[name]


def quantized_format(quant: dict[str, Any], name: str) -> WeightFormat | None:
    """The format a config.json's `quantization_config` gives the linear weights (None: no
    quantization, or gpt-oss's mxfp4 experts, which `model_from_hf_config` reads itself)."""
    method = str(quant.get("quant_method", "")).lower().replace("_", "-")
    where = f"{name}: config.json quantization_config"
    if not method or method == "mxfp4":
        return None
    if "fp8" in method or "fp8" in str(quant.get("fmt", "")).lower():  # fp8, fbgemm_fp8
        return WEIGHT_FORMATS["fp8"]
    if method == "modelopt" and str(quant.get("quant_algo", "")).upper() == "FP8":
        return WEIGHT_FORMATS["fp8"]
    if method == "modelopt" and str(quant.get("quant_algo", "")).upper() == "NVFP4":
        return WEIGHT_FORMATS["nvfp4"]
    if method in ("awq", "gptq", "auto-round", "awq-marlin", "gptq-marlin"):
        bits = int(quant.get("bits") or quant.get("w_bit") or 4)
        if bits not in (2, 3, 4, 8):
            raise CostModelError(f"{where}.bits={bits}: accepted: 2, 3, 4, 8")
        group = int(quant.get("group_size") or quant.get("q_group_size") or GROUP_SIZE)
        return weight_only(bits, group)
    if method == "compressed-tensors":
        return compressed_tensors_format(quant, where)
    raise CostModelError(
        f"{where}.quant_method={quant.get('quant_method')!r} is not modelled; accepted: fp8, "
        "fbgemm_fp8, modelopt (FP8, NVFP4), compressed-tensors (fp8, int8, nvfp4, 8- or 4-bit "
        "weight-only), "
        f"awq, gptq, auto-round, mxfp4; or choose the weights' format with cost_model.dtype "
        f"({', '.join(QUANTIZED)})"
    )


def compressed_tensors_format(quant: dict[str, Any], where: str) -> WeightFormat:
    """llm-compressor's scheme: every `config_groups` entry's weights (num_bits, type,
    group_size) and input activations (8 bits: W8A8; none: weight-only)."""
    schemes = set()
    for group in (quant.get("config_groups") or {}).values():
        weights = (group or {}).get("weights") or {}
        acts = (group or {}).get("input_activations") or {}
        schemes.add(
            (
                int(weights.get("num_bits") or 16),
                str(weights.get("type", "int")),
                int(weights.get("group_size") or 0),
                int(acts.get("num_bits") or 16),
            )
        )
    if len(schemes) != 1:
        raise CostModelError(
            f"{where}: {len(schemes)} schemes in config_groups; one is modelled (or choose "
            f"one with cost_model.dtype: {', '.join(QUANTIZED)})"
        )
    bits, kind, group, act_bits = schemes.pop()
    if bits == 8 and act_bits == 8:
        return WEIGHT_FORMATS["fp8" if kind == "float" else "int8"]
    if bits == 4 and kind == "float" and group == 16:  # NVFP4 (W4A4), or its weight-only form
        return WEIGHT_FORMATS["nvfp4"] if act_bits == 4 else WeightFormat(0.5 + 1 / 16, "16-bit")
    if bits in (4, 8) and act_bits == 16:
        return weight_only(bits, group)
    raise CostModelError(
        f"{where}: {bits}-bit {kind} weights with {act_bits}-bit activations are not modelled "
        f"(W8A8, W8A16, W4A16, NVFP4 are); or choose one with cost_model.dtype: "
        f"{', '.join(QUANTIZED)}"
    )


def load_hf_config(path: str | Path) -> dict[str, Any]:
    """The JSON object of a `config.json` (a file, or a folder holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        config = json.loads(p.read_text())
    except FileNotFoundError:
        raise CostModelError(
            f"cost_model.model={path}: no such config.json (a local file or its folder: "
            "fairsim reads no model from the network; save the model's config.json, or name a "
            "preset)"
        ) from None
    except json.JSONDecodeError as err:
        raise CostModelError(f"{p}: not JSON ({err.msg}, line {err.lineno})") from None
    if not isinstance(config, dict):
        raise CostModelError(f"{p}: a config.json holds one JSON object")
    return config


def model_from_hf_config(
    config: dict[str, Any], name: str = "model", dtype: str | None = None
) -> ModelSpec:
    """The `ModelSpec` of a parsed config.json. `dtype`, a quantized format (fp8, int8, w8a16,
    w4a16), replaces the checkpoint's; fp16 or bf16 leave a quantized checkpoint as it is."""
    text = config.get("text_config")
    c = {**config, **text} if isinstance(text, dict) else config  # Llama 4, multimodal wrappers
    c = {**MODEL_TYPE_DEFAULTS.get(str(c.get("model_type")), {}), **c}
    c = {**{usual: c[own] for own, usual in FIELD_NAMES.items() if own in c}, **c}
    c = checked_fields(c, name)

    def need(*keys: str) -> Any:
        for key in keys:
            if c.get(key) is not None:
                return c[key]
        raise CostModelError(f"{name}: config.json has no {' / '.join(keys)}")

    heads = int(need("num_attention_heads"))
    hidden = int(need("hidden_size"))
    experts = int(
        c.get("num_local_experts") or c.get("num_experts") or c.get("n_routed_experts") or 0
    )
    if not experts:  # experts under names fairsim does not read would be read as dense
        counts = {k: v for k, v in c.items() if "num" in k and "expert" in k}
        unread = [k for k, v in counts.items() if type(v) is int and v > 1]
        if unread:
            raise CostModelError(
                f"{name}: config.json has {unread[0]}={c[unread[0]]} but none of "
                "num_local_experts, num_experts, n_routed_experts, moe_num_experts: its experts "
                "are named as fairsim does not read them"
            )
    moe_width = c.get("moe_intermediate_size") if experts else None
    mamba = str(c.get("model_type")) in MAMBA_TYPES
    if mamba and not experts:  # Granite 4.0-H's dense MLP is its "shared" one
        dense_width = need("shared_intermediate_size")
    else:
        dense_width = c.get("intermediate_size_mlp") or need("intermediate_size")
    if experts and c.get("intermediate_size_mlp"):  # Llama 4: experts use intermediate_size
        moe_width = moe_width or need("intermediate_size")
    step = int(c.get("interleave_moe_layer_step") or 1) if experts else 1
    if experts and c.get("decoder_sparse_step"):  # Qwen MoE: every n-th layer is sparse
        step = int(c["decoder_sparse_step"])
    if experts and c.get("moe_layer_freq"):  # DeepSeek: every n-th layer after the dense ones
        step = int(c["moe_layer_freq"])
    dense_first = int(c.get("first_k_dense_replace") or 0) if experts else 0
    last = c.get("moe_layer_end_index")  # ERNIE 4.5: MoE layers up to this one (-1: the last)
    moe_count = len(range(dense_first, last + 1, step)) if experts and last not in (None, -1) else 0
    latent = int(c.get("kv_lora_rank") or 0)  # DeepSeek's multi-head latent attention
    topk = int(c.get("index_topk") or 0)  # DeepSeek's sparse attention
    layers = int(need("num_hidden_layers"))
    kinds = attention_layers(c, name)
    sliding = sum(kind == "sliding_attention" for kind in kinds)
    chunked = sum(kind == "chunked_attention" for kind in kinds)
    recurrent = sum(kind in ("linear_attention", "mamba") for kind in kinds)
    mlp_only = sum(kind in ("mlp", "moe") for kind in kinds)  # Nemotron-H's blocks
    moe_blocks = sum(kind == "moe" for kind in kinds)
    if kinds and len(kinds) != layers:
        raise CostModelError(
            f"{name}: config.json names {len(kinds)} layers' kinds for num_hidden_layers={layers}"
        )
    mamba_layers = "mamba" in kinds
    deltanet = "linear_attention" in kinds
    if mamba_layers and deltanet:
        raise CostModelError(f"{name}: config.json has both mamba and linear_attention layers")
    if sliding and chunked:
        raise CostModelError(
            f"{name}: config.json has both sliding_attention and chunked_attention layers: "
            "one kind of windowed layer is modelled at a time"
        )
    every_layer = sliding == layers  # every layer slides: a window over the whole model
    shared = int(c.get("num_shared_experts") or c.get("n_shared_experts") or 0)
    # Qwen2-MoE's and Granite 4.0-H's shared expert, and every Llama 4 MoE layer's
    width = (
        c.get("shared_expert_intermediate_size")
        or c.get("shared_intermediate_size")  # Granite 4.0-H
        or c.get("moe_shared_expert_intermediate_size")  # Nemotron-H
        or 0
    )
    if experts and (width or "interleave_moe_layer_step" in c):
        shared = max(shared, 1)
        expert_width = moe_width or dense_width
        if 0 < expert_width < width and width % expert_width == 0:  # Qwen2-57B-A14B: 8 wide
            shared = width // expert_width
    # like vLLM's --dtype, a 16-bit dtype leaves a quantized checkpoint quantized; a quantized
    # one chooses the weights' format (as --quantization fp8 quantizes a 16-bit checkpoint)
    forced = weight_format(dtype) if dtype is not None else None
    expert_bytes = 0.0
    if forced is not None and forced.quantized:
        fmt = forced
    else:
        quant = c.get("quantization_config") or {}
        if experts and str(quant.get("quant_method", "")).lower() == "mxfp4":
            expert_bytes = MXFP4_BYTES  # gpt-oss: the routed experts only
        checkpoint = str(c.get("torch_dtype") or c.get("dtype") or "bf16")
        fmt = quantized_format(quant, name) or weight_format(checkpoint, f"{name}: torch_dtype")
    head_dim = c.get("head_dim")
    return ModelSpec(
        name=name,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=int(c.get("num_key_value_heads") or heads),
        intermediate=int(dense_width),
        vocab=int(need("vocab_size")),
        dtype_bytes=2,  # embeddings and head: vLLM serves them 16-bit
        linear_bytes=fmt.linear_bytes,
        compute=fmt.compute,
        head_dim_override=int(head_dim) if head_dim and int(head_dim) * heads != hidden else None,
        experts=experts,
        experts_per_token=int(need("num_experts_per_tok", "experts_per_token")) if experts else 0,
        expert_intermediate=int(moe_width) if moe_width else None,
        shared_experts=shared,
        moe_layer_step=step,
        gated_mlp=str(c.get("model_type")) not in PLAIN_MLP,
        tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        dense_layers_first=dense_first,
        kv_lora_rank=latent,
        q_lora_rank=int(c.get("q_lora_rank") or 0) if latent else 0,
        qk_nope_head_dim=int(need("qk_nope_head_dim")) if latent else 0,
        qk_rope_head_dim=int(need("qk_rope_head_dim")) if latent else 0,
        v_head_dim=int(need("v_head_dim")) if latent else 0,
        index_topk=topk,
        index_heads=int(need("index_n_heads")) if topk else 0,
        index_head_dim=int(need("index_head_dim")) if topk else 0,
        recurrent_layers=recurrent,
        linear_key_heads=int(need("linear_num_key_heads")) if deltanet else 0,
        linear_value_heads=int(need("linear_num_value_heads")) if deltanet else 0,
        linear_key_head_dim=int(need("linear_key_head_dim")) if deltanet else 0,
        linear_value_head_dim=int(need("linear_value_head_dim")) if deltanet else 0,
        linear_conv_kernel=int(need("linear_conv_kernel_dim")) if deltanet else 0,
        **(mamba_fields(c, need, hidden) if mamba_layers else {}),
        recurrent_state_bytes=state_bytes(c, name) if recurrent else 2,
        attention_output_gate=bool(c.get("attn_output_gate", False)),
        mixer_only_layers=layers - mlp_only if mlp_only else 0,
        mlp_only_layers=mlp_only,
        moe_layer_count=moe_blocks or moe_count,
        sliding_layers=chunked or (0 if every_layer else sliding),
        sliding_window=(
            int(need("attention_chunk_size"))
            if chunked
            else int(need("sliding_window"))
            if sliding and not every_layer
            else 0
        ),
        attention_chunked=bool(chunked),
        window_all_layers=int(need("sliding_window")) if every_layer else 0,
        expert_bytes=expert_bytes,
    )


# a family's own names for the usual fields, read as them where the usual name is absent:
# ERNIE 4.5's mixture of experts
FIELD_NAMES = {
    "moe_num_experts": "num_experts",
    "moe_k": "num_experts_per_tok",
    "moe_num_shared_experts": "num_shared_experts",
    "moe_layer_start_index": "first_k_dense_replace",
    "moe_layer_interval": "moe_layer_freq",
}


# What a family's transformers config class fills in when its config.json leaves a field out
# (the published Gemma configs state little more than their sizes): Gemma ties its output head
# to the embedding; Gemma 2 alternates sliding and full layers, Gemma 3 has five sliding layers
# to a full one, with Gemma 3's vocabulary; the Qwen families slide no layer unless a config
# sets use_sliding_window; Qwen3-Next's and Qwen3.5's attention layers gate their output.
MODEL_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma": {"tie_word_embeddings": True},
    "qwen2": {"use_sliding_window": False},
    "qwen2_moe": {"use_sliding_window": False},
    "qwen3": {"use_sliding_window": False},
    "qwen3_moe": {"use_sliding_window": False},
    "gemma2": {"tie_word_embeddings": True, "sliding_window_pattern": 2},
    "qwen3_next": {"attn_output_gate": True},
    "qwen3_5": {"attn_output_gate": True},
    "qwen3_5_text": {"attn_output_gate": True},
    "qwen3_5_moe": {"attn_output_gate": True},
    "qwen3_5_moe_text": {"attn_output_gate": True},
    "gemma3_text": {
        "tie_word_embeddings": True,
        "sliding_window_pattern": 6,
        "vocab_size": 262_208,
    },
}


# the families whose Mamba-2 layers fairsim reads: Granite 4.0-H (each layer a mixer and an
# MLP) and Nemotron-H (each layer one block of its `hybrid_override_pattern`)
MAMBA_TYPES = frozenset({"granitemoehybrid", "nemotron_h"})
# Nemotron-H's blocks: Mamba-2, attention, a dense MLP, a mixture of experts
NEMOTRON_H_BLOCKS = {"M": "mamba", "*": "full_attention", "-": "mlp", "E": "moe"}


def mamba_fields(c: dict[str, Any], need: Any, hidden: int) -> dict[str, int]:
    """The `ModelSpec` fields of Mamba-2 layers: heads of `mamba_d_head` (else `mamba_expand`
    x hidden over the heads), a state of `mamba_d_state` per head row, `mamba_n_groups` groups
    of B and C, a `mamba_d_conv`-wide convolution (Granite 4.0-H's names; Nemotron-H's:
    `mamba_num_heads`, `mamba_head_dim`, `ssm_state_size`, `n_groups`, `conv_kernel`)."""
    heads = int(need("mamba_n_heads", "mamba_num_heads"))
    width = c.get("mamba_d_head") or c.get("mamba_head_dim")
    if not width:
        width = int(need("mamba_expand", "expand")) * hidden // heads
    return {
        "mamba_heads": heads,
        "mamba_head_dim": int(width),
        "mamba_state_size": int(need("mamba_d_state", "ssm_state_size")),
        "mamba_groups": int(c.get("mamba_n_groups") or c.get("n_groups") or 1),
        "mamba_conv_kernel": int(need("mamba_d_conv", "conv_kernel")),
    }


def state_bytes(c: dict[str, Any], name: str) -> int:
    """Bytes per value of a recurrent layer's state: the config's `mamba_ssm_dtype` (Qwen3.5
    keeps it float32), else the model's 16 bits, as vLLM's mamba_ssm_cache_dtype=auto does."""
    dtype = c.get("mamba_ssm_dtype") or c.get("mamba_ssm_cache_dtype") or "bfloat16"
    sizes = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}
    if not isinstance(dtype, str) or dtype not in sizes:
        raise CostModelError(
            f"{name}: config.json mamba_ssm_dtype={dtype!r}; accepted: {', '.join(sizes)}"
        )
    return sizes[dtype]


# the families whose MLP is two matrices (up, an activation, down) rather than gated (SwiGLU,
# GeGLU: up, gate and down), as their transformers and vLLM modules build it: StarCoder2,
# GPT-NeoX (Pythia), Nemotron, Minitron and Nemotron-H (squared ReLU), Phi-1/2, Persimmon
PLAIN_MLP = frozenset({"starcoder2", "gpt_neox", "nemotron", "nemotron_h", "phi", "persimmon"})


def layer_types(c: dict[str, Any]) -> list[str]:
    """Each layer's attention, as `layer_types` lists it or, in the configs written before
    that field (Gemma 3's), as `sliding_window_pattern` p implies: every p-th layer full, the
    others sliding. Neither, with an `attention_chunk_size`: Llama 4's, the layers
    `no_rope_layers` marks 1 (by default three in four) attending within chunks. With a
    `sliding_window`: every layer slides (Mistral 7B v0.1, Phi-3 4k), or with Qwen2's
    `use_sliding_window` those from `max_window_layers` on (none when it is false, its config
    class's default). Else every layer attends to the whole context."""
    pattern = c.get("hybrid_override_pattern")
    if str(c.get("model_type")) == "nemotron_h" and isinstance(pattern, str):
        return [NEMOTRON_H_BLOCKS.get(block, block) for block in pattern]
    kinds = c.get("layer_types")
    if kinds is not None:  # (Granite 4.0-H names full attention "attention")
        return ["full_attention" if kind == "attention" else kind for kind in kinds]
    every = int(c.get("num_hidden_layers") or 0)
    interval = c.get("full_attention_interval")
    if interval:  # Qwen3-Next, Qwen3.5: every interval-th layer attention, the others DeltaNet
        return [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(every)
        ]
    pattern = c.get("sliding_window_pattern")
    if pattern and pattern >= 2:
        return [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(every)
        ]
    chunk = c.get("attention_chunk_size")
    if chunk is not None:  # Llama 4: the layers using RoPE attend within chunks, the others all
        interval = int(c.get("no_rope_layer_interval") or 4)
        rope = c.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(every)]
        return ["chunked_attention" if r else "full_attention" for r in rope]
    if c.get("sliding_window") is None or not c.get("use_sliding_window", True):
        return []
    # Qwen2's form: with use_sliding_window, the layers from max_window_layers on slide;
    # Mistral 7B v0.1's and Phi-3's (no such field): every layer slides
    first = int(c.get("max_window_layers") or 0) if "use_sliding_window" in c else 0
    return ["full_attention" if i < first else "sliding_attention" for i in range(every)]


# the kinds of layer `layer_types` may name that fairsim models (linear_attention: gated DeltaNet,
# Qwen3-Next's and Qwen3.5's)
ATTENTION_KINDS = ("full_attention", "sliding_attention", "chunked_attention", "linear_attention")
# fields of models with state-space (Mamba) or linear-attention layers other than gated DeltaNet:
# they keep a fixed-size state per request too, of shapes fairsim does not read (Jamba, Bamba,
# Zamba 2, Nemotron-H, Falcon-H1, MiniMax's lightning attention, Kimi Linear)
RECURRENT_FIELDS = (
    "mamba_d_state", "ssm_state_size", "hybrid_override_pattern", "layers_block_type",
    "attn_layer_period", "attn_layer_indices", "attn_type_list", "linear_attn_config",
)  # fmt: skip


# fields of attention that fairsim does not model, each of which changes what a layer caches
# or reads: read as plain attention, the pool and the step times would be wrong without a word
UNMODELLED_ATTENTION = {
    "compress_ratios": "compressed attention (DeepSeek-V4)",
    "sparse_attention_config": "sparse attention on grouped-query heads (MiniMax-M3)",
    "num_global_key_value_heads": "full layers shaped unlike the sliding ones (Gemma 4)",
    "global_head_dim": "full layers shaped unlike the sliding ones (Gemma 4)",
    "num_kv_shared_layers": "layers reusing an earlier layer's KV (Gemma 3n)",
}


def attention_layers(c: dict[str, Any], name: str) -> list[str]:
    """`layer_types` of a model whose every layer is attention that fairsim models: a model
    with state-space or linear-attention layers, or an attention variant fairsim does not model
    (`UNMODELLED_ATTENTION`), is a one-line error rather than a KV pool and step times computed
    as if every layer kept a plain KV per token."""
    not_modelled = (
        "fairsim models attention and gated-DeltaNet layers, and Granite 4.0-H's and "
        "Nemotron-H's Mamba-2, only "
        f"(accepted layer_types: {', '.join(ATTENTION_KINDS)}); other state-space and "
        "linear-attention layers are not modelled"
    )
    mamba = str(c.get("model_type")) in MAMBA_TYPES  # Mamba-2 layers fairsim reads
    read = {"mamba_d_state", "ssm_state_size", "hybrid_override_pattern"} if mamba else set()
    kinds = c.get("attn_type_list")  # MiniMax's: 1 full attention, 0 lightning (linear)
    if isinstance(kinds, list) and kinds and all(k == 1 for k in kinds):
        read.add("attn_type_list")  # MiniMax-M2's: every layer full attention
    for key in RECURRENT_FIELDS:
        if c.get(key) is not None and key not in read:
            raise CostModelError(f"{name}: config.json has {key}: {not_modelled}")
    for key, what in UNMODELLED_ATTENTION.items():
        value = c.get(key)
        if isinstance(value, dict):  # (MiniMax-M3 may switch its sparse attention off)
            value = value and value.get("use_sparse_attention", True)
        if value not in (None, 0, False, {}, []):
            raise CostModelError(
                f"{name}: config.json has {key}: {what} is not modelled; fairsim models full, "
                "sliding-window, chunked, latent and DeepSeek-V3.2's sparse attention"
            )
    kinds = layer_types(c)
    blocks = {"mamba", "mlp", "moe"} if mamba else set()  # (mlp, moe: Nemotron-H's)
    other = sorted(set(kinds) - set(ATTENTION_KINDS) - blocks)
    if other:
        raise CostModelError(f"{name}: config.json layer_types has {other}: {not_modelled}")
    if c.get("linear_num_value_heads") is not None and "linear_attention" not in kinds:
        raise CostModelError(
            f"{name}: config.json has linear_num_value_heads (gated DeltaNet) but neither "
            "layer_types nor full_attention_interval says which layers have it"
        )
    return kinds


# the config.json fields read as integers, and the quantization_config ones
INTEGER_FIELDS = (
    "num_attention_heads", "hidden_size", "num_local_experts", "num_experts",
    "n_routed_experts", "moe_intermediate_size", "intermediate_size_mlp", "intermediate_size",
    "interleave_moe_layer_step", "decoder_sparse_step", "moe_layer_freq",
    "first_k_dense_replace", "kv_lora_rank", "num_shared_experts", "n_shared_experts",
    "head_dim", "num_hidden_layers", "num_key_value_heads", "vocab_size",
    "num_experts_per_tok", "experts_per_token", "q_lora_rank", "qk_nope_head_dim",
    "qk_rope_head_dim", "v_head_dim", "sliding_window", "sliding_window_pattern",
    "max_window_layers", "attention_chunk_size", "no_rope_layer_interval", "index_topk",
    "index_n_heads", "index_head_dim", "full_attention_interval", "linear_num_key_heads",
    "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
    "linear_conv_kernel_dim", "mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups",
    "mamba_d_conv", "mamba_expand", "shared_intermediate_size", "mamba_num_heads",
    "mamba_head_dim", "ssm_state_size", "n_groups", "conv_kernel", "expand",
    "moe_shared_expert_intermediate_size", "shared_expert_intermediate_size",
    "moe_layer_end_index",
)  # fmt: skip
MOST_LAYERS = 10_000  # far beyond any published model's (DeepSeek-V3: 61, Llama 3.1 405B: 126)
QUANT_INTEGER_FIELDS = ("bits", "w_bit", "group_size", "q_group_size")
SCHEME_INTEGER_FIELDS = ("num_bits", "group_size")


def integer(value: Any, where: str) -> int:
    """`value` as an int when it is a JSON integer (or a float without a fraction)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CostModelError(f"{where}={value!r}: an integer (of a model's size)")
    if isinstance(value, float) and not value.is_integer() or abs(value) >= 2**40:
        raise CostModelError(f"{where}={value!r}: an integer (of a model's size)")
    return int(value)


def checked_fields(c: dict[str, Any], name: str) -> dict[str, Any]:
    """`c` with the fields read checked for their JSON types (a malformed config.json is an
    error naming the field, not a crash inside the arithmetic)."""
    where = f"{name}: config.json"
    c = dict(c)
    for key in INTEGER_FIELDS:
        if c.get(key) is not None:
            c[key] = integer(c[key], f"{where} {key}")
    layers = c.get("num_hidden_layers")
    if layers is not None and not 1 <= layers <= MOST_LAYERS:  # (each layer is listed once)
        raise CostModelError(f"{where} num_hidden_layers={layers}: from 1 to {MOST_LAYERS}")
    for key in ("full_attention_interval", "mamba_n_heads", "mamba_num_heads"):
        if c.get(key) is not None and c[key] < 1:  # (divisors)
            raise CostModelError(f"{where} {key}={c[key]}: an integer >= 1")
    kinds = c.get("layer_types")
    if kinds is not None and not (
        isinstance(kinds, list) and all(isinstance(k, str) for k in kinds)
    ):
        raise CostModelError(f"{where} layer_types: a list of strings")
    rope = c.get("no_rope_layers")
    if rope and not (
        isinstance(rope, list)
        and all(r in (0, 1) and not isinstance(r, float) for r in rope)
        and len(rope) == c.get("num_hidden_layers")
    ):
        raise CostModelError(f"{where} no_rope_layers: a 0 or 1 for each of num_hidden_layers")
    quant = c.get("quantization_config")
    if quant is None:
        return c
    if not isinstance(quant, dict):
        raise CostModelError(f"{where} quantization_config: an object")
    quant = dict(quant)
    for key in QUANT_INTEGER_FIELDS:
        if quant.get(key) is not None:
            quant[key] = integer(quant[key], f"{where} quantization_config.{key}")
    groups = quant.get("config_groups")
    if groups is not None:
        if not isinstance(groups, dict):
            raise CostModelError(f"{where} quantization_config.config_groups: an object")
        for group_name, group in groups.items():
            at_group = f"{where} quantization_config.config_groups.{group_name}"
            if group is not None and not isinstance(group, dict):
                raise CostModelError(f"{at_group}: an object or null")
            for part in ("weights", "input_activations"):
                scheme = (group or {}).get(part)
                at = f"{at_group}.{part}"
                if scheme is not None and not isinstance(scheme, dict):
                    raise CostModelError(f"{at}: an object or null")
                for key in SCHEME_INTEGER_FIELDS:
                    if scheme and scheme.get(key) is not None:
                        integer(scheme[key], f"{at}.{key}")
    c["quantization_config"] = quant
    return c


def model_from_path(path: str | Path, dtype: str | None = None) -> ModelSpec:
    """A `ModelSpec` from a config.json file or a folder holding one, named after its folder
    (a file of another name: after the file)."""
    p = Path(path)
    if p.is_dir():
        name = p.name
    elif p.name == "config.json":
        name = p.parent.name or p.stem
    else:
        name = p.stem
    return model_from_hf_config(load_hf_config(p), name, dtype)
