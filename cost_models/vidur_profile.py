"""A profile-backed step-time model reading Vidur's operator profiles (`mlp.csv`).

Vidur measures each token-level operator of one decoder layer (layer norms, the attention
projections, rotary embedding, the MLP projections and activation, residual adds) against the
number of tokens, per tensor-parallel degree. This model sums the medians of one layer's
operators, interpolates linearly in the step's tokens (beyond the profiled range in proportion
to the tokens, as compute-bound products scale), multiplies by the layer count and adds the
embedding. What the profile lacks comes from the roofline (cost_models/roofline.py): attention,
the output head and the all-reduce term of tensor parallelism. Profiles:
`data:vidur_profiles/compute/<gpu>/<model>/mlp.csv`, shipped with fairsim (Llama-2-7B on A100
and H100, Llama-3-8B on A100).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cost_models.base import CostModelError
from cost_models.roofline import RooflineCost
from traces.files import read_table, resolve_path

LAYER_OPS = {  # operator -> times per layer
    "input_layernorm": 1,
    "attn_pre_proj": 1,
    "attn_rope": 1,
    "attn_post_proj": 1,
    "post_attention_layernorm": 1,
    "mlp_up_proj": 1,
    "mlp_act": 1,
    "mlp_down_proj": 1,
    "add": 2,
}
PROFILE_DIRS = {
    "a100-80gb": "a100",
    "h100": "h100",
    "llama-2-7b": "Llama-2-7b-hf",
    "llama-3-8b": "Meta-Llama-3-8B",
}
DEFAULT_ROOT = "data:vidur_profiles/compute"  # shipped with fairsim


@dataclass(frozen=True)
class VidurProfileCost(RooflineCost):
    path: str | None = None  # mlp.csv; None: DEFAULT_ROOT/<gpu>/<model>/mlp.csv

    def __post_init__(self) -> None:
        super().__post_init__()
        path = self.path or self._default_path()
        p = resolve_path(path, "Vidur operator profile")
        frame = read_table(p, "csv")
        m = self.model_spec
        dims = {
            "n_head": m.heads,
            "n_kv_head": m.kv_heads,
            "n_embd": m.hidden,
            "n_expanded_embd": m.intermediate,
            "num_tensor_parallel_workers": self.tp,
        }
        missing = [c for c in (*dims, "num_tokens") if c not in frame.columns]
        missing += [
            f"time_stats.{op}.median"
            for op in (*LAYER_OPS, "emb")
            if f"time_stats.{op}.median" not in frame.columns
        ]
        if missing:
            raise CostModelError(
                f"{p}: not a Vidur mlp.csv profile (missing column {missing[0]!r})"
            )
        rows = frame
        for col, value in dims.items():
            rows = rows[rows[col] == value]
        if rows.empty:
            raise CostModelError(
                f"{p}: no rows for {m.name} at tp={self.tp} "
                f"(the file has tp {sorted(frame['num_tensor_parallel_workers'].unique())})"
            )
        rows = rows.groupby("num_tokens").median(numeric_only=True).sort_index()
        layer = sum(k * rows[f"time_stats.{op}.median"] for op, k in LAYER_OPS.items())
        ms = m.layers * layer + rows["time_stats.emb.median"]
        object.__setattr__(self, "_tokens", rows.index.to_numpy(dtype=np.float64))
        object.__setattr__(self, "_seconds", ms.to_numpy(dtype=np.float64) / 1e3)

    def _default_path(self) -> str:
        gpu, model = self.gpu_spec.name, self.model_spec.name
        if gpu not in PROFILE_DIRS or model not in PROFILE_DIRS:
            raise CostModelError(
                f"no bundled Vidur profile location for {model} on {gpu}; give cost_model.path"
            )
        return str(Path(DEFAULT_ROOT) / PROFILE_DIRS[gpu] / PROFILE_DIRS[model] / "mlp.csv")

    def token_level_time(self, tokens: float | np.ndarray) -> np.ndarray:
        x, y = self._tokens, self._seconds  # type: ignore[attr-defined]
        t = np.asarray(tokens, dtype=np.float64)
        # beyond the profile, matrix products scale with the tokens (compute-bound)
        return np.where(t > x[-1], y[-1] * t / x[-1], np.interp(t, x, y))
