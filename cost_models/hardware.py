"""Model and GPU descriptions for the GPU cost models, with presets.

Model shapes are the published architectures. GPU figures are the vendors' dense bf16 tensor peak
and HBM/GDDR bandwidth (A10G, A100 and H100 among them). For the A10G the A10's 125
TFLOP/s is used: the VTC profile's 4,680 prefill tokens/s for a 7B model already needs 63 TFLOP/s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from cost_models.base import CostModelError

GIB = 1024**3
COMPUTE_FORMATS = ("16-bit", "fp8", "int8", "fp4")
# vLLM's caches of a sparse-attention model store fp8 values with one fp32 scale per this many
INDEX_QUANT_BLOCK = 128


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape: what a step reads and computes.

    Dense models have `experts` 0. A mixture-of-experts model has `experts` expert MLPs of
    `expert_intermediate` width in every `moe_layer_step`-th layer (the others keep a dense MLP
    of `intermediate` width), `experts_per_token` of them active per token, plus
    `shared_experts` always active (DeepSeek: the first `dense_layers_first` layers are dense,
    the rest MoE). `dtype_bytes` is the unquantized weights' storage (2: fp16/bf16):
    the embeddings, the output head, and the decoder layers' linear weights unless
    `linear_bytes` says they are quantized (bytes per weight, scales included: 1 for fp8 or
    int8, about 0.52 for 4-bit AWQ/GPTQ); `compute` is the number format the matrix products
    run in (`16-bit`, `fp8` or `int8`: the GPU's rate for it). `expert_bytes` is the routed
    experts' storage where narrower still (gpt-oss's mxfp4: 4 bits and a shared 8-bit scale
    per 32, 0.53125 bytes; computed at the 16-bit rate); `kv_dtype_bytes` the KV cache's
    (vLLM's `kv_cache_dtype=auto` keeps it 16-bit, `fp8` one byte).

    Multi-head latent attention (DeepSeek-V2/V3: `kv_lora_rank` > 0) caches per token and layer
    one latent of `kv_lora_rank` plus a rotary key of `qk_rope_head_dim`, shared by the heads:
    vLLM keeps a whole copy on every tensor-parallel GPU (`kv_copies`). Its heads attend with
    keys of `qk_nope_head_dim + qk_rope_head_dim` and values of `v_head_dim`. Layers of
    `sliding_layers` attend to the last `sliding_window` tokens only (gpt-oss, Gemma 3): their
    KV, bounded by the window, is not counted per token but held per request in window groups
    (`kv_window`); their attention is counted per window (`cost_models.base.step_shape`). A
    model whose every layer slides (Mistral 7B v0.1, Phi-3 4k) has `window_all_layers` instead:
    each request keeps at most a window of KV (the engine's `SlidingBlockPool`), and a step
    reads and attends to at most it (`cost_models.base.slid_step_shape`). With
    `attention_chunked` (Llama 4) the sliding layers attend within consecutive chunks of
    `sliding_window` tokens instead: a request keeps its current chunk's KV there.
    DeepSeek's sparse attention (DeepSeek-V3.2, GLM-5: `index_topk` > 0, on latent attention)
    adds to every layer an indexer of `index_heads` heads of `index_head_dim` that scores every
    cached token for each query; attention then reads only the `index_topk` best. Every token's
    KV is kept (the latent and the indexer's fp8 key), so the pool holds what full attention's
    would, a little more; a step forms the indexer's pairs over the whole context and
    attention's over at most `index_topk` keys a query (`sparse_attention`).
    `recurrent_layers` (Qwen3-Next, Qwen3.5: gated DeltaNet, linear attention; or, with
    `mamba_heads`, Granite 4.0-H's Mamba-2) keep no KV per token but a fixed-size state per
    request: `linear_value_heads` matrices of `linear_key_head_dim` x `linear_value_head_dim`
    values (Mamba-2: `mamba_heads` of `mamba_head_dim` x `mamba_state_size`) of
    `recurrent_state_bytes` each, and a convolution's last kernel - 1 inputs; vLLM pages that
    state in blocks of the attention layers' page size (`state_groups`, `state_block_size`),
    and a step reads and writes every request's state once. `attention_output_gate`: the
    attention layers' query projection also gives a gate per head (Qwen3-Next, Qwen3.5).
    Nemotron-H's layers are one block each, a mixer (attention or Mamba-2) or an MLP (dense or
    MoE): `mixer_only_layers` and `mlp_only_layers` count them, `moe_layer_count` its MoE ones;
    a tensor-parallel step then all-reduces once per such layer, not twice."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    dtype_bytes: int = 2  # bf16 / fp16
    gated_mlp: bool = True  # SwiGLU: up, gate and down projections
    head_dim_override: int | None = None  # when heads x head_dim != hidden (Qwen3, Gemma)
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int | None = None  # None: intermediate
    shared_experts: int = 0
    moe_layer_step: int = 1  # every n-th layer is a MoE layer (Llama 4: 2 for Maverick)
    tied_embeddings: bool = False  # the output head is the input embedding
    kv_dtype_bytes: int = 2
    dense_layers_first: int = 0  # DeepSeek's first_k_dense_replace
    kv_lora_rank: int = 0  # > 0: multi-head latent attention
    q_lora_rank: int = 0  # latent attention's query compression (0: none)
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    sliding_layers: int = 0
    sliding_window: int = 0  # tokens a sliding layer attends to (with sliding_layers > 0)
    attention_chunked: bool = False  # the sliding layers attend within chunks of that many
    window_all_layers: int = 0  # > 0: every layer attends to only this many last tokens
    index_topk: int = 0  # > 0: sparse attention, each query reading this many keys at most
    index_heads: int = 0  # the sparse-attention indexer's heads
    index_head_dim: int = 0  # and their width (its cached key's too)
    recurrent_layers: int = 0  # gated-DeltaNet layers: a state per request, no KV per token
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    mamba_heads: int = 0  # > 0: the recurrent layers are Mamba-2's (Granite 4.0-H), not DeltaNet
    mamba_head_dim: int = 0
    mamba_state_size: int = 0
    mamba_groups: int = 1
    mamba_conv_kernel: int = 0
    recurrent_state_bytes: int = 2  # bytes per state value (vLLM's mamba_ssm_cache_dtype)
    # layers of one block each (Nemotron-H): a token mixer alone, or an MLP alone (else every
    # layer is a mixer and an MLP), and how many of the MLPs are MoE (0: from the fields above)
    mixer_only_layers: int = 0
    mlp_only_layers: int = 0
    moe_layer_count: int = 0
    attention_output_gate: bool = False  # the query projection also gives a gate per head
    expert_bytes: float = 0.0  # bytes per routed-expert weight where narrower (0: linear_bytes)
    linear_bytes: float = 0.0  # bytes per decoder-layer linear weight (0: dtype_bytes)
    compute: str = "16-bit"  # the matrix products' format: one of COMPUTE_FORMATS

    def __post_init__(self) -> None:
        for key in (
            "layers",
            "hidden",
            "heads",
            "kv_heads",
            "intermediate",
            "vocab",
            "dtype_bytes",
            "kv_dtype_bytes",
            "moe_layer_step",
        ):
            v = getattr(self, key)
            if int(v) != v or v < 1:
                raise CostModelError(
                    f"model {self.name!r}: {key} must be an integer >= 1, got {v!r}"
                )
        if self.head_dim_override is None and self.hidden % self.heads:
            raise CostModelError(
                f"model {self.name!r}: heads must divide hidden (or give head_dim)"
            )
        if self.heads % self.kv_heads:
            raise CostModelError(f"model {self.name!r}: kv_heads must divide heads")
        if self.experts and not 1 <= self.experts_per_token <= self.experts:
            raise CostModelError(
                f"model {self.name!r}: experts_per_token must be in 1..experts ({self.experts})"
            )
        keys = (
            "dense_layers_first",
            "q_lora_rank",
            "sliding_layers",
            "kv_lora_rank",
            "sliding_window",
            "window_all_layers",
            "index_topk",
            "index_heads",
            "index_head_dim",
            "recurrent_layers",
            "linear_key_heads",
            "linear_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_conv_kernel",
            "mamba_heads",
            "mamba_head_dim",
            "mamba_state_size",
            "mamba_groups",
            "mamba_conv_kernel",
            "mixer_only_layers",
            "mlp_only_layers",
            "moe_layer_count",
        )
        for key in keys:
            v = getattr(self, key)
            if int(v) != v or v < 0:
                raise CostModelError(f"model {self.name!r}: {key} must be an integer >= 0")
        mixers = self.layers - self.mlp_only_layers - self.recurrent_layers - self.sliding_layers
        if (self.mixer_only_layers or self.mlp_only_layers) and not (
            mixers >= 1
            and self.mixer_only_layers + self.mlp_only_layers <= self.layers
            and self.moe_layer_count <= self.layers - self.mixer_only_layers
        ):
            raise CostModelError(
                f"model {self.name!r}: mixer_only_layers + mlp_only_layers must be at most "
                f"layers ({self.layers}) and leave an attention layer, moe_layer_count at most "
                "the layers with an MLP"
            )
        if self.recurrent_layers and not (
            self.recurrent_layers < self.layers
            and min(self._recurrent_shape()) >= 1
            and self.recurrent_state_bytes in (2, 4)
        ):
            raise CostModelError(
                f"model {self.name!r}: recurrent_layers must be below layers ({self.layers}), "
                "with the gated-DeltaNet (linear_*) or Mamba-2 (mamba_*) heads, widths and "
                "conv kernel of at least 1 and a state of 2 or 4 bytes a value"
            )
        if self.recurrent_layers and (
            self.sliding_layers or self.window_all_layers or self.latent or self.index_topk
        ):
            raise CostModelError(
                f"model {self.name!r}: recurrent layers with sliding windows or latent "
                "attention are not modelled"
            )
        if self.dense_layers_first >= self.layers or self.sliding_layers >= self.layers:
            raise CostModelError(
                f"model {self.name!r}: dense_layers_first and sliding_layers must be below "
                f"layers ({self.layers})"
            )
        if self.sliding_layers and self.window_all_layers:
            raise CostModelError(
                f"model {self.name!r}: sliding_layers (some layers slide) and "
                "window_all_layers (every layer does) exclude each other"
            )
        if self.attention_chunked and not self.sliding_layers:
            raise CostModelError(
                f"model {self.name!r}: attention_chunked needs sliding_layers > 0 (the layers "
                "that attend within chunks)"
            )
        if self.sliding_layers and self.sliding_window < 1:
            raise CostModelError(
                f"model {self.name!r}: sliding_layers > 0 needs sliding_window >= 1 (tokens)"
            )
        if not (self.expert_bytes >= 0 and self.linear_bytes >= 0):
            raise CostModelError(f"model {self.name!r}: expert_bytes and linear_bytes must be >= 0")
        if self.compute not in COMPUTE_FORMATS:
            raise CostModelError(
                f"model {self.name!r}: compute={self.compute!r}; accepted: "
                f"{', '.join(COMPUTE_FORMATS)}"
            )
        if self.index_topk and not (self.latent and self.index_heads and self.index_head_dim):
            raise CostModelError(
                f"model {self.name!r}: sparse attention (index_topk) is modelled on latent "
                "attention (kv_lora_rank >= 1), with index_heads and index_head_dim >= 1"
            )
        if self.index_topk and (self.sliding_layers or self.window_all_layers):
            raise CostModelError(
                f"model {self.name!r}: sparse attention (index_topk) and sliding windows "
                "exclude each other"
            )
        if self.kv_lora_rank and not (self.qk_rope_head_dim > 0 and self.v_head_dim > 0):
            raise CostModelError(
                f"model {self.name!r}: latent attention (kv_lora_rank) needs qk_rope_head_dim "
                "and v_head_dim >= 1"
            )

    @property
    def attention_compute(self) -> str:
        """The number format attention's products run in: the linear layers' (`compute`), but
        16-bit where those are fp4 (no attention kernel runs in fp4)."""
        return "16-bit" if self.compute == "fp4" else self.compute

    @property
    def linear_width(self) -> float:
        """Bytes per decoder-layer linear weight."""
        return self.linear_bytes or float(self.dtype_bytes)

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.hidden // self.heads

    @property
    def latent(self) -> bool:
        """Multi-head latent attention (DeepSeek)."""
        return self.kv_lora_rank > 0

    @property
    def attention_params(self) -> int:
        """One layer's attention projections: Q and O (heads x head_dim) and K, V (kv_heads);
        with latent attention, the down- and up-projections of the query (through
        `q_lora_rank`, when given) and of the keys and values (through `kv_lora_rank`)."""
        if self.latent:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q_rank, heads = self.q_lora_rank, self.heads
            q = q_rank * (self.hidden + heads * qk) if q_rank else self.hidden * heads * qk
            kv_down = self.hidden * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_up = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
            indexer = 0
            if self.index_topk:  # its query (from the query latent), key and head weights
                h, d = self.index_heads, self.index_head_dim
                indexer = (q_rank or self.hidden) * h * d + self.hidden * (d + h)
            return q + kv_down + kv_up + heads * self.v_head_dim * self.hidden + indexer
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        gate = q if self.attention_output_gate else 0
        return self.hidden * (q + gate + 2 * kv) + q * self.hidden

    def _recurrent_shape(self) -> tuple[int, int, int, int, int, int]:
        """A recurrent layer's (convolved channels, conv kernel, state heads, each head's state
        rows and columns, input projection's outputs). Gated DeltaNet: queries and keys
        (`linear_key_heads` x width) and values convolved; a key-by-value matrix per value head;
        projections to q, k, v, the output gate z and two gates per value head. Mamba-2: the
        inner width (heads x head width) and the groups' B and C convolved; a head-width by
        state-size matrix per head; projections to x, z, B, C and a step size per head."""
        if self.mamba_heads:
            inner = self.mamba_heads * self.mamba_head_dim
            bc = 2 * self.mamba_groups * self.mamba_state_size
            return (inner + bc, self.mamba_conv_kernel, self.mamba_heads, self.mamba_head_dim,
                    self.mamba_state_size, 2 * inner + bc + self.mamba_heads)  # fmt: skip
        keys = self.linear_key_heads * self.linear_key_head_dim
        values = self.linear_value_heads * self.linear_value_head_dim
        return (2 * keys + values, self.linear_conv_kernel, self.linear_value_heads,
                self.linear_key_head_dim, self.linear_value_head_dim,
                2 * keys + 2 * values + 2 * self.linear_value_heads)  # fmt: skip

    @property
    def recurrent_params(self) -> int:
        """One recurrent layer's weights: its input projection, the convolution, and the
        output projection from the heads' width (`_recurrent_shape`)."""
        channels, kernel, heads, rows, cols, projected = self._recurrent_shape()
        width = heads * (self.mamba_head_dim if self.mamba_heads else self.linear_value_head_dim)
        return self.hidden * projected + channels * kernel + width * self.hidden

    @property
    def mixer_params(self) -> int:
        """The token mixers' weights over every layer: attention's, or the recurrent ones'."""
        mixers = self.layers - self.recurrent_layers - self.mlp_only_layers
        attention = self.attention_params * mixers
        return attention + self.recurrent_params * self.recurrent_layers

    @property
    def attention_layers(self) -> int:
        """Layers attending to the whole context (not a sliding window, not recurrent, not an
        MLP alone)."""
        return self.layers - self.sliding_layers - self.recurrent_layers - self.mlp_only_layers

    @property
    def _composed(self) -> bool:
        """Whether layers differ in their mixer or lack a mixer or an MLP (the weights are then
        summed kind by kind: `mixer_params`, `_mlps`)."""
        return bool(self.recurrent_layers or self.mixer_only_layers or self.mlp_only_layers)

    @property
    def allreduces(self) -> int:
        """Tensor-parallel all-reduces per step: one after each mixer and each MLP."""
        return 2 * self.layers - self.mixer_only_layers - self.mlp_only_layers

    @property
    def pair_flops(self) -> int:
        """FLOPs of one (query, key) pair in one layer: the scores over the keys' width and the
        weighted sum over the values', for every head (4 x heads x head_dim for plain
        attention; latent attention as vLLM computes a prefill, keys and values expanded)."""
        if self.latent:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            return 2 * self.heads * (qk + self.v_head_dim)
        return 4 * self.heads * self.head_dim

    @property
    def attention_pair_flops(self) -> int:
        """FLOPs of one (query, key) pair over every layer attending to the whole context."""
        return self.pair_flops * self.attention_layers

    def _mlp_params(self, width: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * width

    @property
    def expert_params(self) -> int:
        """One expert MLP's weights."""
        return self._mlp_params(self.expert_intermediate or self.intermediate)

    @property
    def moe_layers(self) -> int:
        if self.moe_layer_count:
            return self.moe_layer_count
        return (self.layers - self.dense_layers_first) // self.moe_layer_step if self.experts else 0

    @property
    def layer_params(self) -> int:
        """The matrix-product weights one token goes through in a layer, on average over the
        layers (attention and MLP; for MoE the active experts, the shared ones and the
        router). For a dense model: every weight of a layer."""
        if self._composed:  # the layers differ in their mixers or lack one part
            experts = self.experts_per_token + self.shared_experts
            return (self.mixer_params + self._mlps(experts)) // self.layers
        if not self.experts:
            return self.attention_params + self._mlp_params(self.intermediate)
        active = (self.experts_per_token + self.shared_experts) * self.expert_params
        moe = self.attention_params + active + self.hidden * self.experts
        dense = self.attention_params + self._mlp_params(self.intermediate)
        return (self.moe_layers * moe + (self.layers - self.moe_layers) * dense) // self.layers

    @property
    def stored_layer_params(self) -> int:
        """Every weight of the decoder layers, summed over the layers."""
        if self._composed:
            return self.mixer_params + self._mlps(self.experts + self.shared_experts)
        if not self.experts:
            return self.layers * self.layer_params
        experts = (self.experts + self.shared_experts) * self.expert_params
        moe = self.attention_params + experts + self.hidden * self.experts
        dense = self.attention_params + self._mlp_params(self.intermediate)
        return self.moe_layers * moe + (self.layers - self.moe_layers) * dense

    def layer_bytes_read(self, tokens: float | np.ndarray) -> np.ndarray:
        """Weight bytes a step of `tokens` tokens reads over all layers: every dense weight,
        and of each MoE layer's experts those some token routes to, in expectation under
        uniform routing (E (1 - (1 - k/E)^T) of E experts)."""
        t = np.asarray(tokens, dtype=np.float64)
        if not self.experts:
            if self._composed:
                return np.full_like(t, self.stored_layer_params * self.linear_width)
            return np.full_like(t, self.layers * self.layer_params * self.linear_width)
        e, k = self.experts, self.experts_per_token
        touched = e * (1.0 - (1.0 - k / e) ** np.maximum(t, 1.0))
        if self._composed:
            params = self.mixer_params + self._mlps(touched + self.shared_experts)
            return self._weight_bytes_read(params, touched)
        moe = (
            self.attention_params
            + (touched + self.shared_experts) * self.expert_params
            + self.hidden * e
        )
        dense = self.attention_params + self._mlp_params(self.intermediate)
        params = self.moe_layers * moe + (self.layers - self.moe_layers) * dense
        return self._weight_bytes_read(params, touched)

    def _weight_bytes_read(self, params: Any, touched: Any) -> np.ndarray:
        """The bytes of `params` weights read, of which `touched` experts per MoE layer."""
        if self.expert_bytes:  # the routed experts stored narrower than the rest (mxfp4)
            routed = self.moe_layers * touched * self.expert_params
            return (params - routed) * self.linear_width + routed * self.expert_bytes
        return params * self.linear_width

    def _mlps(self, experts: Any) -> Any:
        """The MLP weights over every layer with an MLP, with `experts` experts per MoE layer
        (and its router): the dense layers' MLP elsewhere."""
        dense = self._mlp_params(self.intermediate)
        with_mlp = self.layers - self.mixer_only_layers
        if not self.experts:
            return with_mlp * dense
        moe = experts * self.expert_params + self.hidden * self.experts
        return self.moe_layers * moe + (with_mlp - self.moe_layers) * dense

    @property
    def params(self) -> int:
        """All weights: the layers plus input embedding and output head."""
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.stored_layer_params + self.vocab * self.hidden + head

    @property
    def weight_bytes(self) -> int:
        """The checkpoint's bytes: the layers' linear weights (the routed experts at
        `expert_bytes` where set), the embeddings and the head."""
        routed = 0
        if self.expert_bytes and self.experts:
            routed = self.moe_layers * self.experts * self.expert_params
        unquantized = (self.params - self.stored_layer_params) * self.dtype_bytes
        linear = (self.stored_layer_params - routed) * self.linear_width
        return int(linear + unquantized + routed * self.expert_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of one token over every layer attending to the whole context (with
        latent attention: its latent and rotary key; with sparse attention, also the
        indexer's key)."""
        if self.index_topk:
            return self.attention_layers * (self._latent_bytes + self._index_key_bytes)
        if self.latent:
            width = self.kv_lora_rank + self.qk_rope_head_dim
            return self.attention_layers * width * self.kv_dtype_bytes
        return 2 * self.attention_layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes

    @property
    def _latent_bytes(self) -> int:
        """A sparse-attention model's latent and rotary key of one token in one layer: in 8
        bits, vLLM's layout for these models (the latent in fp8 with an fp32 scale per 128
        values, the rotary key kept 16-bit: 656 bytes for DeepSeek-V3.2), else 16 bits."""
        rank, rope = self.kv_lora_rank, self.qk_rope_head_dim
        if self.kv_dtype_bytes == 1:
            return rank + 4 * -(-rank // INDEX_QUANT_BLOCK) + 2 * rope
        return (rank + rope) * self.kv_dtype_bytes

    @property
    def _index_key_bytes(self) -> int:
        """The indexer's cached key of one token in one layer: fp8 with fp32 scales."""
        return self.index_head_dim + 4 * -(-self.index_head_dim // INDEX_QUANT_BLOCK)

    def sparse_attention(self) -> tuple[int, float, float, float] | None:
        """How a sparse-attention step is counted in the units of its full attention's (a
        (query, key) pair of `pair_flops`, one token's whole KV): (index_topk, the indexer's
        FLOPs per pair over attention's, the latent's share of a token's KV bytes, the
        indexer key's share); None without sparse attention (`cost_models.base`,
        `sparse_step_shape`)."""
        if not self.index_topk:
            return None
        indexer = 2 * self.index_heads * self.index_head_dim  # each index head's dot product
        latent, key = self._latent_bytes, self._index_key_bytes
        return (
            self.index_topk,
            indexer / self.pair_flops,
            latent / (latent + key),
            key / (latent + key),
        )

    def recurrent_state_per_layer(self, tp: int = 1) -> int:
        """One request's state in one recurrent layer on one of `tp` GPUs (split by heads, as
        vLLM splits it; Mamba-2's groups kept whole on every GPU where fewer than the GPUs): the
        convolution's last kernel - 1 inputs, 16-bit, and each head's state matrix."""
        channels, kernel, heads, rows, cols, _ = self._recurrent_shape()
        if self.mamba_heads:
            inner = self.mamba_heads * self.mamba_head_dim
            groups = max(1, self.mamba_groups // tp)
            per_gpu = inner // tp + 2 * groups * self.mamba_state_size
        else:
            per_gpu = channels // tp
        conv = per_gpu * (kernel - 1) * self.dtype_bytes
        return conv + heads // tp * rows * cols * self.recurrent_state_bytes

    @property
    def recurrent_state(self) -> int:
        """One request's state over every recurrent layer (all GPUs together)."""
        return self.recurrent_layers * self.recurrent_state_per_layer()

    @property
    def recurrent_token_flops(self) -> int:
        """FLOPs one token costs the recurrent layers beyond their projections: per head, about
        6 x its state's size (DeltaNet: reading the state, the delta rule's correction and
        update, the output; Mamba-2: the decay and update, the output, the chunked scan's
        share), and the convolution."""
        channels, kernel, heads, rows, cols, _ = self._recurrent_shape()
        return self.recurrent_layers * (6 * heads * rows * cols + 2 * channels * kernel)

    def state_groups(self) -> int | None:
        """The block groups vLLM's hybrid allocator gives the recurrent layers' states, each
        holding a page per running request (two with prefix caching on), or None without
        recurrent layers. Layers go in groups as large as the smaller kind (`kv_window`): with
        at least as many recurrent layers as attention ones, as in every such model (Qwen3-Next:
        36 and 12), a group is the attention layers, and the states take
        ceil(recurrent / attention) groups."""
        if not self.recurrent_layers:
            return None
        return -(-self.recurrent_layers // self.attention_layers)

    def state_block_size(self, tp: int, block_size: int) -> int:
        """vLLM's block size for a model with recurrent layers: the attention layers' block,
        grown in steps of 16 tokens until one layer's page of it (on one of `tp` GPUs, which
        each hold at least one KV head) holds one layer's state; `block_size` where larger
        (Qwen3-Next on one GPU: 544 tokens)."""
        heads = max(1, self.kv_heads // tp)
        per_token = 2 * heads * self.head_dim * self.kv_dtype_bytes
        grown = 16 * -(-self.recurrent_state_per_layer(tp) // (16 * per_token))
        return max(block_size, grown)

    def kv_window(self) -> tuple[int, int] | None:
        """How vLLM's hybrid allocator keeps the sliding layers' KV, in blocks of the full
        layers' size: (window tokens, window groups), or None without sliding layers. vLLM
        groups layers in groups as large as the smaller kind (as the larger one when it has under
        1.5x as many); with at least as many sliding layers as full ones, as every such model
        has (gpt-oss: 18 and 18, Gemma 3 27B: 52 and 10), a group is the full layers, so a block
        here is one of vLLM's and the sliding layers take ceil(sliding / full) groups of their
        own, each holding a request's last window. With fewer sliding layers the groups are
        counted the same way, so their KV is over-counted."""
        if not self.sliding_layers:
            return None
        full = self.attention_layers
        return self.sliding_window, -(-self.sliding_layers // full)

    def kv_copies(self, tp: int) -> int:
        """Copies of each token's KV over `tp` tensor-parallel GPUs: one, split by heads, while
        there are at least as many KV heads as GPUs; with fewer, vLLM gives every GPU one KV
        head, so each is kept tp / kv_heads times (Qwen3-30B-A3B's 4 over 8 GPUs: twice);
        with latent attention, one on every GPU (the latent is shared by the heads)."""
        return tp if self.latent else max(1, tp // self.kv_heads)

    def kv_bytes_over(self, tp: int) -> int:
        """KV bytes of one token over `tp` tensor-parallel GPUs together (`kv_copies` of it)."""
        return self.kv_bytes_per_token * self.kv_copies(tp)


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_bytes: float
    hbm_bandwidth: float  # bytes/s
    peak_flops: float  # dense bf16 FLOP/s
    link_bandwidth: float = 0.0  # bytes/s per GPU for tensor-parallel all-reduce (0: none)
    fp8_flops: float = 0.0  # dense fp8 FLOP/s (0: no fp8 tensor cores; fp8 weights run at bf16)
    int8_flops: float = 0.0  # dense int8 OP/s (0: the fp8 rate, else the 16-bit one)
    fp4_flops: float = 0.0  # dense fp4 FLOP/s (0: no fp4 units; NVFP4 weights at the 16-bit rate)
    # GPUs wired to each other directly, without a switch (AMD's Infinity Fabric mesh):
    # `link_bandwidth` is then per peer, and an all-reduce over tp GPUs runs on tp - 1 links
    mesh: bool = False

    def __post_init__(self) -> None:
        for key in ("memory_bytes", "hbm_bandwidth", "peak_flops"):
            if not getattr(self, key) > 0:
                raise CostModelError(f"gpu {self.name!r}: {key} must be > 0")
        for key in ("link_bandwidth", "fp8_flops", "int8_flops", "fp4_flops"):
            if not getattr(self, key) >= 0:
                raise CostModelError(f"gpu {self.name!r}: {key} must be >= 0 (0: none)")

    def allreduce_bandwidth(self, tp: int) -> float:
        """Bytes/s one GPU of a tensor-parallel group of `tp` sends per direction at once: its
        switch link's rate, or on a mesh its `tp - 1` links' to the others."""
        return self.link_bandwidth * (tp - 1) if self.mesh else self.link_bandwidth

    def flops_for(self, compute: str) -> float:
        """Dense tensor FLOP/s of matrix products in `compute` (`ModelSpec.compute`): fp8, int8
        and fp4 at their own rates where the GPU has such units, else at the 16-bit rate (vLLM
        then dequantizes the weights to 16 bits)."""
        if compute == "int8":
            return self.int8_flops or self.fp8_flops or self.peak_flops
        if compute == "fp8":
            return self.fp8_flops or self.peak_flops
        if compute == "fp4":  # (without FP4 units vLLM runs NVFP4 weight-only, Marlin)
            return self.fp4_flops or self.peak_flops
        return self.peak_flops


def _moe(name: str, layers: int, hidden: int, heads: int, kv: int, width: int, vocab: int,
         experts: int, k: int, **kw: object) -> ModelSpec:  # fmt: skip
    return ModelSpec(name, layers, hidden, heads, kv, width, vocab, experts=experts,
                     experts_per_token=k, **kw)  # type: ignore[arg-type]  # fmt: skip


# Published architectures (each model's Hugging Face config.json); any other model: a
# config.json path (cost_models/hf_config.py)
MODELS = {
    m.name: m
    for m in (
        ModelSpec("llama-2-7b", 32, 4096, 32, 32, 11008, 32000),
        ModelSpec("llama-2-13b", 40, 5120, 40, 40, 13824, 32000),
        ModelSpec("llama-2-70b", 80, 8192, 64, 8, 28672, 32000),
        ModelSpec("llama-3-8b", 32, 4096, 32, 8, 14336, 128256),
        ModelSpec("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256),
        ModelSpec("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256),
        ModelSpec("codellama-34b", 48, 8192, 64, 8, 22016, 32000),
        ModelSpec("mistral-7b", 32, 4096, 32, 8, 14336, 32768),
        ModelSpec("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064),
        ModelSpec("qwen3-14b", 40, 5120, 40, 8, 17408, 151936, head_dim_override=128),
        _moe("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 8, 2),
        _moe("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32768, 8, 2),
        _moe(
            "qwen3-30b-a3b",
            48,
            2048,
            32,
            4,
            6144,
            151936,
            128,
            8,
            head_dim_override=128,
            expert_intermediate=768,
        ),  # fmt: skip
    )
}

# Dense tensor throughput and memory bandwidth from the vendors' datasheets (NVIDIA H100 SXM,
# H200 SXM: the H100's compute with 141 GB of HBM3e at 4.8 TB/s; A100 80GB SXM, L40S, the Ada
# architecture whitepaper for the RTX 4090, RTX PRO 6000 Blackwell); memory as CUDA reports it
# where that differs from the label (the 4090's 24 GB: 25.25e9 bytes; L40S 46,068 MiB; H100
# 81,559 MiB; H200 143,771 MiB; RTX PRO 6000 97,887 MiB). Links: NVLink per direction, or
# PCIe (Gen4 x16 32 GB/s, Gen5 64 GB/s) for cards without NVLink. The RTX 4090's bf16 rate is
# with fp32 accumulation (165 TFLOP/s; 330 with fp16 accumulation, which vLLM does not use).
# Dense INT8 tensor rates from the same datasheets (the A10's for the A10G); the RTX PRO 6000's
# datasheet gives none, so int8 runs at its fp8 rate there. B200: the HGX B200 at 1,000 W (2.25
# PFLOP/s dense bf16, 4.5 fp8 and int8, 9 fp4; NVLink 5 at 1.8 TB/s both ways), 183,359 MiB as CUDA
# reports it, and 7.7 TB/s: its drivers report a 7,680-bit bus, which at its 3,996 MHz memory
# clock moves 7.67 TB/s (NVIDIA rounds to 8). A100 40GB: the 80GB card's rates at 1,555 GB/s.
# L4: the datasheet's rates halved (it quotes them with sparsity), 23,034 MiB, PCIe Gen4.
# MI300X (AMD's datasheet): 1,307 TFLOP/s dense bf16, 2,615 fp8 and int8, 5.3 TB/s, the
# 205,822,885,888 bytes ROCm reports, and seven Infinity Fabric links of 64 GB/s each way, one
# to each other GPU of the eight (a mesh: tp 2 all-reduces over one of them, tp 8 over seven).
GPUS = {
    g.name: g
    for g in (
        GPUSpec("a10g", 24 * GIB, 600e9, 125e12, int8_flops=250e12),
        GPUSpec("a100-40gb", 40 * GIB, 1.555e12, 312e12, link_bandwidth=300e9, int8_flops=624e12),
        GPUSpec("a100-80gb", 80 * GIB, 2.0e12, 312e12, link_bandwidth=300e9, int8_flops=624e12),
        GPUSpec("b200", 183359 * 2**20, 7.7e12, 2250e12, link_bandwidth=900e9, fp8_flops=4500e12,
                int8_flops=4500e12, fp4_flops=9000e12),
        GPUSpec("h100", 81559 * 2**20, 3.35e12, 989e12, link_bandwidth=450e9, fp8_flops=1979e12,
                int8_flops=1979e12),
        GPUSpec("h200", 143771 * 2**20, 4.8e12, 989e12, link_bandwidth=450e9, fp8_flops=1979e12,
                int8_flops=1979e12),
        GPUSpec("l4", 23034 * 2**20, 300e9, 121e12, link_bandwidth=32e9, fp8_flops=242.5e12,
                int8_flops=242.5e12),
        GPUSpec("l40s", 46068 * 2**20, 864e9, 362e12, link_bandwidth=32e9, fp8_flops=733e12,
                int8_flops=733e12),
        GPUSpec("mi300x", 205822885888, 5.3e12, 1307.4e12, link_bandwidth=64e9,
                fp8_flops=2614.9e12, int8_flops=2614.9e12, mesh=True),
        GPUSpec("rtx-4090", 25.25e9, 1008e9, 165e12, link_bandwidth=32e9, fp8_flops=330e12,
                int8_flops=660.6e12),
        GPUSpec("rtx-pro-6000", 97887 * 2**20, 1792e9, 504e12, link_bandwidth=64e9,
                fp8_flops=1008e12),
    )
}  # fmt: skip


def model_spec(model: str | ModelSpec) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    if not isinstance(model, str) or model not in MODELS:
        raise CostModelError(
            f"cost_model.model={model!r}: accepted: a preset ({', '.join(sorted(MODELS))}) or a "
            "Hugging Face config.json path"
        )
    return MODELS[model]


REQUIRED_GPU_KEYS = ("name", "memory_bytes", "hbm_bandwidth", "peak_flops")


def gpu_spec(gpu: str | GPUSpec | Mapping[str, Any]) -> GPUSpec:
    """A preset's name, or a GPU of the user's own: its datasheet figures (`GPUSpec`'s fields,
    bytes and per-second units), e.g. cost_model.gpu={name:b200,memory_bytes:...}."""
    if isinstance(gpu, GPUSpec):
        return gpu
    if isinstance(gpu, Mapping):
        accepted = [f.name for f in fields(GPUSpec)]
        unknown = sorted(set(gpu) - set(accepted))
        missing = [k for k in REQUIRED_GPU_KEYS if k not in gpu]
        if unknown or missing:
            raise CostModelError(
                f"cost_model.gpu: {'unknown ' + ', '.join(unknown) if unknown else ''}"
                f"{'; ' if unknown and missing else ''}"
                f"{'missing ' + ', '.join(missing) if missing else ''}; a GPU of your own takes "
                f"{', '.join(REQUIRED_GPU_KEYS)} and optionally "
                f"{', '.join(k for k in accepted if k not in REQUIRED_GPU_KEYS)}"
            )
        values: dict[str, Any] = {"name": str(gpu["name"])}
        if "mesh" in gpu:
            if not isinstance(gpu["mesh"], bool):
                raise CostModelError(
                    f"cost_model.gpu.mesh={gpu['mesh']!r}: true or false (true: GPUs wired to "
                    "each other without a switch, link_bandwidth per peer)"
                )
            values["mesh"] = gpu["mesh"]
        for key in sorted(set(gpu) - {"name", "mesh"}):
            try:
                values[key] = float(gpu[key])
            except (TypeError, ValueError):
                raise CostModelError(
                    f"cost_model.gpu.{key}={gpu[key]!r}: a number (bytes, bytes/s or FLOP/s)"
                ) from None
        return GPUSpec(**values)
    if not isinstance(gpu, str) or gpu not in GPUS:
        raise CostModelError(f"cost_model.gpu={gpu!r}: accepted: {', '.join(sorted(GPUS))}")
    return GPUS[gpu]
