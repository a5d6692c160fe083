"""An analytic roofline step-time model from a model and a GPU description.

A step runs the decoder's matrix products over its T tokens, attention over the tokens each new
token attends to, and the output head for each request that samples a token. Each part takes
the longer of its compute time (FLOPs / (peak * compute_efficiency)) and its memory time
(bytes / (bandwidth * memory_efficiency)); the parts add up (they run one after another):
- matrix products: 2 * layer_params * layers * T FLOPs; every weight read once;
- attention: 4 * heads * head_dim FLOPs per (query, key) pair and layer attending to the whole
  context (`ModelSpec.pair_flops`); the keys' and values' bytes read and the new tokens' written
  (latent attention: its latent, a copy on every GPU);
- output head: 2 * hidden * vocab FLOPs per sampling request, its weights read once;
- tensor parallelism (tp GPUs): compute and bytes split tp ways, plus an all-reduce of
  T * hidden values after each mixer and each MLP, two per layer (one per Nemotron-H block;
  ring: 2 (tp - 1) / tp of the data over the link, plus latency);
- `step_overhead`: the serving loop's own time per step.
`model` is a preset name (cost_models/hardware.py) or a Hugging Face config.json (a file or its
folder); `dtype` is fp16 or bf16 (as vLLM's --dtype: a quantized config.json stays quantized)
or a weight format replacing the config.json's (fp8 and int8: W8A8, a byte per weight, at the
GPU's fp8 or int8 rate where it has one; w8a16 and w4a16: 8- or 4-bit weights multiplied in 16
bits); `kv_cache_dtype` is vLLM's (auto: 16-bit; fp8: a byte).
A mixture-of-experts step reads the experts its tokens route to (in expectation under uniform
routing) and computes with the active ones.
A prefill chunk of c new tokens after k cached ones forms c * k + c (c + 1) / 2 pairs; a decode
token with context L forms L pairs. Sparse attention (DeepSeek-V3.2, GLM-5) forms at most top-k
pairs a query and adds its indexer's over the whole context (`cost_models.base.sparse_step_shape`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from cost_models.base import (
    CostModelError,
    slid_step_shape,
    sparse_decode_step,
    sparse_step_shape,
    state_decode_step,
    step_shape,
    windowed_decode_step,
)
from cost_models.hardware import GIB, GPUSpec, ModelSpec, gpu_spec, model_spec
from cost_models.hf_config import model_from_path, weight_format


@dataclass(frozen=True)
class RooflineCost:
    model: str | ModelSpec = "llama-2-7b"
    gpu: str | GPUSpec | Mapping[str, Any] = "a100-80gb"  # a preset, or a GPU's own figures
    tp: int = 1
    compute_efficiency: float = 0.6
    memory_efficiency: float = 0.8
    step_overhead: float = 0.002
    allreduce_latency: float = 10e-6  # seconds per all-reduce
    dtype: str | None = None  # the weights' format (hf_config.WEIGHT_FORMATS); None: the model's
    kv_cache_dtype: str = "auto"  # vLLM's: auto (the model's 16 bits), fp8, fp8_e4m3, fp8_e5m2

    def __post_init__(self) -> None:
        model = resolve_model(self.model, self.dtype)
        object.__setattr__(self, "model", with_kv_cache_dtype(model, self.kv_cache_dtype))
        object.__setattr__(self, "gpu", gpu_spec(self.gpu))
        if int(self.tp) != self.tp or self.tp < 1:
            raise CostModelError(f"cost_model.tp must be an integer >= 1, got {self.tp!r}")
        for key in ("compute_efficiency", "memory_efficiency"):
            v = getattr(self, key)
            if not (0 < v <= 1):
                raise CostModelError(f"cost_model.{key} must be in (0, 1], got {v!r}")
        if self.step_overhead < 0 or self.allreduce_latency < 0:
            raise CostModelError("cost_model.step_overhead and allreduce_latency must be >= 0")
        if self.tp > 1 and not self.gpu_spec.link_bandwidth > 0:
            raise CostModelError(f"gpu {self.gpu_spec.name!r} has no link bandwidth for tp > 1")
        m, g = self.model_spec, self.gpu_spec
        rates = (
            float(m.attention_pair_flops)
            / (self.tp * g.flops_for(m.attention_compute) * self.compute_efficiency),
            m.kv_bytes_over(self.tp) / (self.tp * g.hbm_bandwidth * self.memory_efficiency),
        )
        object.__setattr__(self, "_rates", rates)
        object.__setattr__(self, "_terms", {})
        # the sliding layers' attention, in units of the full layers' (`step_shape`)
        window = m.kv_window()
        ratio = m.sliding_layers / m.attention_layers
        object.__setattr__(self, "_window", None if window is None else (window[0], ratio))
        object.__setattr__(self, "_whole", m.window_all_layers or None)  # every layer slides
        object.__setattr__(self, "_chunked", m.attention_chunked)  # Llama 4's chunked layers
        sparse = m.sparse_attention()  # DeepSeek's sparse attention
        object.__setattr__(self, "_sparse", sparse)
        # recurrent layers read and write each request's state at every step: in KV tokens
        state = 2.0 * m.recurrent_state / m.kv_bytes_over(self.tp) if m.recurrent_layers else None
        object.__setattr__(self, "_state", state)
        # a decode-only step's (pairs, KV read and written) where they are not the context's
        shape = None
        if self._window is not None:  # type: ignore[attr-defined]
            shape = partial(windowed_decode_step, window=self._window)  # type: ignore[attr-defined]
        elif sparse is not None:
            shape = partial(sparse_decode_step, sparse=sparse)
        elif state is not None:
            shape = partial(state_decode_step, state=state)
        object.__setattr__(self, "_decode_shape", shape)

    @property
    def model_spec(self) -> ModelSpec:
        return self.model  # type: ignore[return-value]

    @property
    def gpu_spec(self) -> GPUSpec:
        return self.gpu  # type: ignore[return-value]

    # ---- building blocks ----------------------------------------------------------------
    def _roof(
        self, flops: float | np.ndarray, nbytes: float | np.ndarray, compute: str | None = None
    ) -> np.ndarray:
        """The longer of `flops` at the GPU's rate for `compute` (the model's by default) and
        `nbytes` at its bandwidth."""
        g, m = self.gpu_spec, self.model_spec
        peak = g.flops_for(compute or m.compute)
        computing = np.asarray(flops) / (self.tp * peak * self.compute_efficiency)
        memory = np.asarray(nbytes) / (self.tp * g.hbm_bandwidth * self.memory_efficiency)
        return np.maximum(computing, memory)

    def linear_time(self, tokens: float | np.ndarray) -> np.ndarray:
        """The decoder layers' matrix products over `tokens` tokens."""
        m = self.model_spec
        flops = 2.0 * m.layer_params * m.layers * np.asarray(tokens, dtype=np.float64)
        if m.recurrent_layers:  # the recurrent layers' state updates beyond their projections
            flops = flops + m.recurrent_token_flops * np.asarray(tokens, dtype=np.float64)
        return self._roof(flops, m.layer_bytes_read(tokens))

    def attention_time(
        self, pairs: float | np.ndarray, kv_read: float | np.ndarray, kv_written: float | np.ndarray
    ) -> np.ndarray:
        """Attention over `pairs` (query, key) pairs, reading `kv_read` tokens' keys and values
        and writing `kv_written` tokens'."""
        m = self.model_spec
        flops = float(m.attention_pair_flops) * np.asarray(pairs, dtype=np.float64)
        tokens = np.asarray(kv_read, dtype=np.float64) + np.asarray(kv_written, dtype=np.float64)
        return self._roof(flops, tokens * m.kv_bytes_over(self.tp), m.attention_compute)

    def head_time(self, requests: float | np.ndarray) -> np.ndarray:
        m = self.model_spec
        flops = 2.0 * m.hidden * m.vocab * np.asarray(requests, dtype=np.float64)
        return self._roof(flops, float(m.vocab * m.hidden * m.dtype_bytes))

    def allreduce_time(self, tokens: float | np.ndarray) -> np.ndarray:
        if self.tp == 1:
            return np.zeros_like(np.asarray(tokens, dtype=np.float64))
        m, g = self.model_spec, self.gpu_spec
        data = np.asarray(tokens, dtype=np.float64) * m.hidden * 2  # activations stay 16-bit
        ring = 2.0 * (self.tp - 1) / self.tp * data / g.allreduce_bandwidth(self.tp)
        return m.allreduces * (self.allreduce_latency + ring)

    def token_level_time(self, tokens: float | np.ndarray) -> np.ndarray:
        """Everything that scales with the step's tokens alone (the matrix products)."""
        return self.linear_time(tokens)

    # ---- steps --------------------------------------------------------------------------
    # The engines ask for step times tens of thousands of times per run: the terms that depend
    # on a step's token or request count alone are cached per count, and attention is written
    # out in scalars, so `decode_time` and `decode_times` do the same float operations.
    def _count_terms(self, tokens: int, requests: int) -> float:
        """Matrix products, all-reduce and output head of a step (cached per count pair)."""
        cache: dict[tuple[int, int], float] = self._terms  # type: ignore[attr-defined]
        t = cache.get((tokens, requests))
        if t is None:
            per_tokens = cache.get((tokens, -1))  # the token-level part alone
            if per_tokens is None:
                per_tokens = float(self.token_level_time(tokens) + self.allreduce_time(tokens))
                cache[(tokens, -1)] = per_tokens
            t = per_tokens + float(self.head_time(requests))
            cache[(tokens, requests)] = t
        return t

    def _attention_rates(self) -> tuple[float, float]:
        """Seconds per (query, key) pair at the compute roof and per KV token at the memory
        roof."""
        return self._rates  # type: ignore[attr-defined]

    def step_time(
        self,
        chunks: Sequence[tuple[int, int]] = (),
        decode_batch: int = 0,
        decode_context: int = 0,
    ) -> float:
        """One mixed step: prefill `chunks` of (new tokens, tokens already cached) and
        `decode_batch` decoding requests attending to `decode_context` tokens in total. Every
        chunk samples a token (a chunk that ends mid-prompt costs one head row too: an upper
        bound)."""
        tokens, pairs, kv_read = self._shape(chunks, decode_batch, decode_context)
        per_pair, per_token = self._attention_rates()
        attention = max(per_pair * pairs, per_token * (kv_read + tokens))
        return (
            self._count_terms(tokens, len(chunks) + decode_batch) + attention + (self.step_overhead)
        )

    def _shape(
        self, chunks: Sequence[tuple[int, int]], decode_batch: int, decode_context: int
    ) -> tuple[int, float, float]:
        """A step's (tokens, pairs, KV read), with the model's windows (`step_shape`)."""
        whole, sparse = self._whole, self._sparse  # type: ignore[attr-defined]
        if whole is not None:
            return slid_step_shape(chunks, decode_batch, decode_context, whole)
        if sparse is not None:
            return sparse_step_shape(chunks, decode_batch, decode_context, sparse)
        window, chunked = self._window, self._chunked  # type: ignore[attr-defined]
        tokens, pairs, kv_read = step_shape(chunks, decode_batch, decode_context, window, chunked)
        state = self._state  # type: ignore[attr-defined]
        if state is not None:  # every request's recurrent state, read and written
            kv_read += (len(chunks) + decode_batch) * state
        return tokens, pairs, kv_read

    def prefill_time(self, prompt_lens: np.ndarray) -> float:
        return self.step_time([(int(p), 0) for p in np.asarray(prompt_lens).tolist()])

    def decode_times(self, batch_size: int, context_tokens: np.ndarray) -> np.ndarray:
        ctx = np.asarray(context_tokens, dtype=np.float64)
        if self._whole is not None:  # type: ignore[attr-defined]
            ctx = np.minimum(ctx, batch_size * self._whole)  # type: ignore[attr-defined]
        per_pair, per_token = self._attention_rates()
        shape = self._decode_shape  # type: ignore[attr-defined]
        if shape is None:
            attention = np.maximum(per_pair * ctx, per_token * (ctx + batch_size))
        else:
            pairs, kv = shape(ctx, batch_size)
            attention = np.maximum(per_pair * pairs, per_token * kv)
        return self._count_terms(batch_size, batch_size) + attention + self.step_overhead

    def decode_time(self, batch_size: int, context_tokens: int) -> float:
        ctx = float(context_tokens)
        if self._whole is not None:  # type: ignore[attr-defined]
            ctx = float(min(context_tokens, batch_size * self._whole))  # type: ignore[attr-defined]
        per_pair, per_token = self._rates  # type: ignore[attr-defined]
        shape = self._decode_shape  # type: ignore[attr-defined]
        if shape is None:
            attention = max(per_pair * ctx, per_token * (ctx + batch_size))
        else:
            pairs, kv = shape(ctx, batch_size)
            attention = max(per_pair * pairs, per_token * kv)
        fixed = self._terms.get((batch_size, batch_size))  # type: ignore[attr-defined]
        if fixed is None:
            fixed = self._count_terms(batch_size, batch_size)
        return fixed + attention + self.step_overhead

    def with_full_attention(self) -> RooflineCost:
        """This cost model with every windowed layer read as full attention: the KV layout of
        an engine that keeps every token in every layer (vLLM without its hybrid KV cache
        manager). A model with recurrent layers has no such layout: vLLM keeps their state with
        the hybrid manager only."""
        m = self.model_spec
        if m.recurrent_layers:
            raise CostModelError(
                f"model {m.name!r} has recurrent (gated-DeltaNet) layers, whose state vLLM "
                "keeps with its hybrid KV cache manager only: a KV connector (a CPU tier, "
                "disaggregated pools) or engine.hybrid_kv_cache_manager=false is not modelled "
                "for it"
            )
        full = replace(m, sliding_layers=0, sliding_window=0, attention_chunked=False,
                       window_all_layers=0)  # fmt: skip
        return self if full == m else replace(self, model=full)

    def kv_block_size(self, block_size: int) -> int:
        """The block size vLLM uses for this model given `block_size`: larger for a model with
        recurrent layers, whose state a block's page must hold (`ModelSpec.state_block_size`)."""
        m = self.model_spec
        return m.state_block_size(self.tp, block_size) if m.recurrent_layers else block_size

    def kv_state_groups(self) -> int | None:
        """The block groups holding the recurrent layers' states, a page (two with prefix
        caching on) per running request in each (`ModelSpec.state_groups`), or None."""
        return self.model_spec.state_groups()

    def all_layers_window(self) -> int | None:
        """The window every layer attends to (Mistral 7B v0.1, Phi-3 4k), or None: the engine
        keeps that much KV per request, and a step reads and attends to at most it."""
        return self.model_spec.window_all_layers or None

    def kv_chunked(self) -> bool:
        """Whether the windowed layers attend within chunks (`ModelSpec.attention_chunked`)."""
        return self.model_spec.attention_chunked

    def kv_window(self) -> tuple[int, int] | None:
        """The sliding layers' KV as the engine's block pool keeps it (`ModelSpec.kv_window`):
        (window tokens, window groups), or None."""
        return self.model_spec.kv_window()

    def kv_capacity_tokens(
        self,
        memory_utilization: float = 0.9,
        activation_reserve: float = 2.0 * 1024**3,
        batched_tokens: int | None = None,
        max_num_seqs: int = 256,
    ) -> int:
        """KV tokens that fit: the memory share an engine may use, less the weights and an
        activation reserve (per GPU), divided by one token's KV bytes (per GPU). Given the
        engine's `batched_tokens` (max_num_batched_tokens), the reserve is vLLM's
        (`vllm_reserve`) instead of the fixed `activation_reserve`."""
        if not (0 < memory_utilization <= 1):
            raise CostModelError(
                f"memory_utilization must be in (0, 1], got {memory_utilization!r}"
            )
        m, g = self.model_spec, self.gpu_spec
        if batched_tokens is not None:
            activation_reserve = vllm_reserve(m, self.tp, batched_tokens, max_num_seqs)
        free = g.memory_bytes * memory_utilization - m.weight_bytes / self.tp - activation_reserve
        if free <= 0:
            raise CostModelError(
                f"{m.name} ({m.weight_bytes / 1024**3:.1f} GiB of weights) does not fit on "
                f"{self.tp} x {g.name} with memory_utilization={memory_utilization}"
            )
        return int(free // (m.kv_bytes_over(self.tp) / self.tp))


# vLLM's memory beside weights and KV, per GPU (`vllm_reserve`): the CUDA context, cuBLAS and NCCL
# workspaces and the CUDA-graph pool (a fixed part), the activations of its profiling forward
# pass over max_num_batched_tokens tokens (the MLP's widest tensors and a few hidden-state
# buffers), and the sampler's fp32 logits and probabilities for max_num_seqs requests.
# The fixed part is a round a-priori figure (about half a GiB for the CUDA context and
# workspaces, half a GiB for the CUDA-graph pool), set from no measured run.
RESERVE_FIXED = 1.0 * GIB


def vllm_reserve(m: ModelSpec, tp: int, batched_tokens: int, max_num_seqs: int) -> float:
    """Bytes per GPU vLLM keeps for everything but weights and KV (docs/sim2real.md)."""
    width = (m.expert_intermediate or m.intermediate) if m.experts else m.intermediate
    activations = batched_tokens * (4 * m.hidden + 2 * width) * 2 / tp
    sampler = max_num_seqs * m.vocab * 8
    return RESERVE_FIXED + activations + sampler


def resolve_model(model: str | ModelSpec, dtype: str | None) -> ModelSpec:
    """A preset name, a ModelSpec, or a config.json path (a file or its folder), with `dtype`
    applied."""
    if isinstance(model, str) and (model.endswith(".json") or "/" in model):
        return model_from_path(model, dtype)
    spec = model_spec(model)
    if dtype is not None:
        fmt = weight_format(dtype)
        spec = replace(spec, linear_bytes=fmt.linear_bytes, compute=fmt.compute, expert_bytes=0.0)
    return spec


# vLLM's kv_cache_dtype values, as bytes per cached value (auto: the model's own, but 8 bits for
# a sparse-attention model, as vLLM chooses; bfloat16 keeps its latent 16-bit)
KV_CACHE_DTYPES = {"auto": None, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def with_kv_cache_dtype(spec: ModelSpec, kv_cache_dtype: str) -> ModelSpec:
    """The model with vLLM's `kv_cache_dtype` applied to its KV bytes per token."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise CostModelError(
            f"cost_model.kv_cache_dtype={kv_cache_dtype!r}: accepted: {', '.join(KV_CACHE_DTYPES)}"
        )
    width = KV_CACHE_DTYPES[kv_cache_dtype]
    if width is None and spec.index_topk:
        width = 1  # vLLM's default for sparse-attention models: its 8-bit layout
    return spec if width is None else replace(spec, kv_dtype_bytes=width)
