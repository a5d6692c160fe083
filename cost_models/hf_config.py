"""A model's shape from its Hugging Face `config.json`: dense (Llama 2/3/3.1, Mistral, Qwen2/2.5/3,
Yi, CodeLlama) and mixture-of-experts (Mixtral, Qwen2/3-MoE, Llama 4's `text_config`,
DeepSeek-V2/V3, gpt-oss).

Read: layers, hidden size, attention and KV heads (GQA) and `head_dim` for the KV bytes; the MLP
width; experts (`num_local_experts` / `num_experts` / `n_routed_experts`), experts per token,
the expert MLP width (`moe_intermediate_size`), shared experts, Llama 4's interleaving and
DeepSeek's leading dense layers (`first_k_dense_replace`) for the weights a step reads;
DeepSeek's latent attention (`kv_lora_rank`, `q_lora_rank`, the heads' `qk_nope_head_dim`,
`qk_rope_head_dim` and `v_head_dim`); the layers `layer_types` marks `sliding_attention`;
`tie_word_embeddings`; the weights' dtype from `torch_dtype` (or `dtype`) and
`quantization_config` (fp8; gpt-oss's mxfp4 experts), which `dtype=` overrides. An unknown
architecture still loads when its fields are the usual ones; a missing field is an error
naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cost_models.base import CostModelError
from cost_models.hardware import ModelSpec

MXFP4_BYTES = 0.53125  # a 4-bit value and a shared 8-bit scale per 32 values
DTYPE_BYTES = {"fp16": 2, "float16": 2, "bf16": 2, "bfloat16": 2, "fp8": 1, "float8": 1}


def dtype_bytes(dtype: str, key: str = "cost_model.dtype") -> int:
    """Bytes per weight for a dtype name (fp16, bf16, fp8)."""
    name = str(dtype).lower().removeprefix("torch.")
    if name.startswith("float8") or name.startswith("fp8"):
        return 1
    if name not in DTYPE_BYTES:
        raise CostModelError(f"{key}={dtype!r}: accepted: fp16, bf16, fp8")
    return DTYPE_BYTES[name]


def load_hf_config(path: str | Path) -> dict[str, Any]:
    """The JSON object of a `config.json` (a file, or a folder holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        config = json.loads(p.read_text())
    except FileNotFoundError:
        raise CostModelError(f"cost_model.model={path}: no such config.json") from None
    except json.JSONDecodeError as err:
        raise CostModelError(f"{p}: not JSON ({err.msg}, line {err.lineno})") from None
    if not isinstance(config, dict):
        raise CostModelError(f"{p}: a config.json holds one JSON object")
    return config


def model_from_hf_config(
    config: dict[str, Any], name: str = "model", dtype: str | None = None
) -> ModelSpec:
    """The `ModelSpec` of a parsed config.json; `dtype` overrides the weights' dtype."""
    text = config.get("text_config")
    c = {**config, **text} if isinstance(text, dict) else config  # Llama 4, multimodal wrappers

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
    moe_width = c.get("moe_intermediate_size") if experts else None
    dense_width = c.get("intermediate_size_mlp") or need("intermediate_size")
    if experts and c.get("intermediate_size_mlp"):  # Llama 4: experts use intermediate_size
        moe_width = moe_width or need("intermediate_size")
    step = int(c.get("interleave_moe_layer_step") or 1) if experts else 1
    if experts and c.get("decoder_sparse_step"):  # Qwen MoE: every n-th layer is sparse
        step = int(c["decoder_sparse_step"])
    if experts and c.get("moe_layer_freq"):  # DeepSeek: every n-th layer after the dense ones
        step = int(c["moe_layer_freq"])
    dense_first = int(c.get("first_k_dense_replace") or 0) if experts else 0
    latent = int(c.get("kv_lora_rank") or 0)  # DeepSeek's multi-head latent attention
    sliding = sum(kind == "sliding_attention" for kind in c.get("layer_types") or [])
    shared = int(c.get("num_shared_experts") or c.get("n_shared_experts") or 0)
    if experts and (c.get("shared_expert_intermediate_size") or "interleave_moe_layer_step" in c):
        shared = max(shared, 1)  # Qwen2-MoE's and every Llama 4 MoE layer's shared expert
    expert_bytes = 0.0
    if dtype is None:
        quant = c.get("quantization_config") or {}
        method = str(quant.get("quant_method", "")) + str(quant.get("fmt", ""))
        if experts and "mxfp4" in method.lower():  # gpt-oss: the routed experts only
            expert_bytes = MXFP4_BYTES
        dtype = (
            "fp8"
            if "fp8" in method.lower()
            else str(c.get("torch_dtype") or c.get("dtype") or "bf16")
        )
    head_dim = c.get("head_dim")
    return ModelSpec(
        name=name,
        layers=int(need("num_hidden_layers")),
        hidden=hidden,
        heads=heads,
        kv_heads=int(c.get("num_key_value_heads") or heads),
        intermediate=int(dense_width),
        vocab=int(need("vocab_size")),
        dtype_bytes=dtype_bytes(dtype),
        head_dim_override=int(head_dim) if head_dim and int(head_dim) * heads != hidden else None,
        experts=experts,
        experts_per_token=int(need("num_experts_per_tok", "experts_per_token")) if experts else 0,
        expert_intermediate=int(moe_width) if moe_width else None,
        shared_experts=shared,
        moe_layer_step=step,
        tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        dense_layers_first=dense_first,
        kv_lora_rank=latent,
        q_lora_rank=int(c.get("q_lora_rank") or 0) if latent else 0,
        qk_nope_head_dim=int(need("qk_nope_head_dim")) if latent else 0,
        qk_rope_head_dim=int(need("qk_rope_head_dim")) if latent else 0,
        v_head_dim=int(need("v_head_dim")) if latent else 0,
        sliding_layers=sliding,
        expert_bytes=expert_bytes,
    )


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
