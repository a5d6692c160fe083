"""A fitted analytic step-time model: affine in tokens, requests and context.

prefill(p) = step_overhead + prefill_base + prefill_per_request * n + prefill_per_token * sum(p)
             + prefill_per_token_sq * sum(p^2)          (attention's quadratic term)
decode(b, ctx) = step_overhead + decode_base + decode_per_seq * b + decode_per_context_token * ctx

`step_overhead` is the serving loop's own cost per iteration (scheduling, batching, sampling,
inter-process messaging), which a kernel profile does not see. `frontend_latency` is the time a
request spends outside the engine loop (the HTTP server, tokenisation, the messages to and from
the loop): the runner delivers each request that much after its send.

The default coefficients in `conf/cost_model/a10g_llama7b.yaml` come from `fit_vtc_profile`
(`cost_models/profiles.py`) applied to the VTC artifact's A10G / Llama-7B profile.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_models.base import CostModelError


@dataclass(frozen=True)
class LinearStepCost:
    decode_base: float
    decode_per_seq: float
    decode_per_context_token: float
    prefill_per_token: float
    prefill_per_request: float = 0.0
    prefill_base: float = 0.0
    prefill_per_token_sq: float = 0.0
    step_overhead: float = 0.0
    frontend_latency: float = 0.0

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not (np.isfinite(value) and value >= 0):
                raise CostModelError(
                    f"LinearStepCost.{name} must be a finite number >= 0, got {value}"
                )
        if self.decode_base + self.decode_per_seq + self.decode_per_context_token <= 0:
            raise CostModelError("LinearStepCost: a decode step must take time > 0")
        if self.prefill_base + self.prefill_per_request + self.prefill_per_token <= 0:
            raise CostModelError("LinearStepCost: a prefill step must take time > 0")

    def prefill_time(self, prompt_lens: np.ndarray) -> float:
        p = np.asarray(prompt_lens, dtype=np.float64)
        # integer-valued sums: exact in float64 whatever the summation order
        return float(
            self.step_overhead
            + self.prefill_base
            + self.prefill_per_request * p.shape[0]
            + self.prefill_per_token * float(p.sum())
            + self.prefill_per_token_sq * float(p @ p)
        )

    def decode_times(self, batch_size: int, context_tokens: np.ndarray) -> np.ndarray:
        ctx = np.asarray(context_tokens, dtype=np.float64)
        fixed = self.step_overhead + self.decode_base + self.decode_per_seq * batch_size
        return fixed + self.decode_per_context_token * ctx

    def decode_time(self, batch_size: int, context_tokens: int) -> float:
        fixed = self.step_overhead + self.decode_base + self.decode_per_seq * batch_size
        return fixed + self.decode_per_context_token * float(context_tokens)  # same operations


@dataclass(frozen=True)
class ConstantStepCost:
    """Every step takes a fixed time: for closed-form checks and teaching examples."""

    prefill: float
    decode: float

    def __post_init__(self) -> None:
        if not (self.prefill > 0 and self.decode > 0):
            raise CostModelError(f"ConstantStepCost needs prefill > 0 and decode > 0, got {self}")

    def prefill_time(self, prompt_lens: np.ndarray) -> float:
        return float(self.prefill)

    def decode_times(self, batch_size: int, context_tokens: np.ndarray) -> np.ndarray:
        return np.full(np.asarray(context_tokens).shape[0], float(self.decode))

    def decode_time(self, batch_size: int, context_tokens: int) -> float:
        return float(self.decode)
