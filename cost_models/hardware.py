"""Model and GPU descriptions for the GPU cost models, with presets.

Model shapes are the published architectures. GPU figures are the vendors' dense bf16 tensor peak
and HBM/GDDR bandwidth (A10G, A100 and H100 among them). For the A10G the A10's 125
TFLOP/s is used: the VTC profile's 4,680 prefill tokens/s for a 7B model already needs 63 TFLOP/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.base import CostModelError

GIB = 1024**3


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    dtype_bytes: int = 2  # bf16 / fp16
    gated_mlp: bool = True  # SwiGLU: up, gate and down projections

    def __post_init__(self) -> None:
        for key in (
            "layers",
            "hidden",
            "heads",
            "kv_heads",
            "intermediate",
            "vocab",
            "dtype_bytes",
        ):
            v = getattr(self, key)
            if int(v) != v or v < 1:
                raise CostModelError(
                    f"model {self.name!r}: {key} must be an integer >= 1, got {v!r}"
                )
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise CostModelError(
                f"model {self.name!r}: heads must divide hidden, kv_heads divide heads"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer's matrix products (attention and MLP)."""
        kv = self.kv_heads * self.head_dim
        attention = self.hidden * (self.hidden + 2 * kv) + self.hidden * self.hidden
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.intermediate
        return attention + mlp

    @property
    def params(self) -> int:
        """All weights: the layers plus input embedding and output head."""
        return self.layers * self.layer_params + 2 * self.vocab * self.hidden

    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of one token over every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_bytes: float
    hbm_bandwidth: float  # bytes/s
    peak_flops: float  # dense bf16 FLOP/s
    link_bandwidth: float = 0.0  # bytes/s per GPU for tensor-parallel all-reduce (0: none)

    def __post_init__(self) -> None:
        for key in ("memory_bytes", "hbm_bandwidth", "peak_flops"):
            if not getattr(self, key) > 0:
                raise CostModelError(f"gpu {self.name!r}: {key} must be > 0")


MODELS = {
    m.name: m
    for m in (
        ModelSpec("llama-2-7b", 32, 4096, 32, 32, 11008, 32000),
        ModelSpec("llama-2-13b", 40, 5120, 40, 40, 13824, 32000),
        ModelSpec("llama-2-70b", 80, 8192, 64, 8, 28672, 32000),
        ModelSpec("llama-3-8b", 32, 4096, 32, 8, 14336, 128256),
    )
}

GPUS = {
    g.name: g
    for g in (
        GPUSpec("a10g", 24 * GIB, 600e9, 125e12),
        GPUSpec("a100-80gb", 80 * GIB, 2.0e12, 312e12, link_bandwidth=300e9),
        GPUSpec("h100", 80 * GIB, 3.35e12, 989e12, link_bandwidth=450e9),
    )
}


def model_spec(model: str | ModelSpec) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    if model not in MODELS:
        raise CostModelError(f"unknown model {model!r}; presets: {sorted(MODELS)} (or a ModelSpec)")
    return MODELS[model]


def gpu_spec(gpu: str | GPUSpec) -> GPUSpec:
    if isinstance(gpu, GPUSpec):
        return gpu
    if gpu not in GPUS:
        raise CostModelError(f"unknown gpu {gpu!r}; presets: {sorted(GPUS)} (or a GPUSpec)")
    return GPUS[gpu]
