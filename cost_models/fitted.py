"""A step-time model with a few global coefficients over physics terms, fitted once to measured
vLLM runs and valid for every model, GPU, tensor-parallel degree and dtype the roofline covers.

For a step of T tokens (prefill chunks and decodes) from R requests, reading `ctx` tokens of
KV and forming `pairs` (query, key) pairs, each term is a time in seconds at the GPU's datasheet
rates (tp GPUs share every term):
- `weights`: the weight bytes the step reads (a mixture of experts: the experts its tokens route
  to) plus the output head's, over memory bandwidth;
- `matmul`: the matrix products' FLOPs (2 x active parameters per token, the head per request)
  over tensor throughput (fp8 where the weights are fp8 and the GPU has fp8 units), only the
  part beyond the `weights` time: the products run while the weights stream in, so a step of
  few tokens is bound by memory and one of many by compute, as in the roofline (a plain sum
  would let a fit price compute below the datasheet's peak to undo the double count, and
  then predict prefill-heavy steps faster than the GPU can run them);
- `attention`: the larger of its FLOPs over throughput and its KV bytes over bandwidth (a
  model's sliding-window layers add their windows' pairs and KV: `step_shape`; sparse
  attention counts its indexer's and its top-k's: `sparse_step_shape`; recurrent layers add
  every request's state, read and written);
- `allreduce`: the tensor-parallel all-reduces' bytes over the link (0 at tp 1);
- `allreduce_calls`: how many all-reduces (at tp > 1, one after each mixer and each MLP: 2
  per layer, 1 per Nemotron-H block): their fixed latency;
- `requests`: R, the per-request work of the serving loop (sampling, detokenizing, streaming);
- `step`: 1, the loop's own time per step.
Step time = sum of coefficient x term. `frontend_latency` is the time a client's request and
its tokens spend outside the engine's steps (HTTP, tokenizing, the output pipeline that
detokenizes and streams): TTFT and E2E as the client measures them include it. It is a fixed
part plus `frontend_steps` times the model's reference step (a decode step of
`REFERENCE_BATCH` requests, this model on this GPU at this tp: enough tokens that a mixture of
experts reads nearly every expert, as its serving steps do): the measured runs' TTFT is about six
of their decode steps on every model (Llama-2-7B 24 ms at 3.6 ms per token, Llama-2-70B 51-55 ms
at 8.6-9.3 ms), so what a request waits outside the GPU work grows with the step time; it is
not a constant of the server.

`fairsim-fit` fits the coefficients to the training runs and writes the shipped file
(`cost_models/data/fitted/coefficients.json`, with its provenance); `coefficients=PATH` reads
another one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from cost_models.base import CostModelError
from cost_models.roofline import RooflineCost

TERMS = ("weights", "matmul", "attention", "allreduce", "allreduce_calls", "requests", "step")
SHIPPED = Path(__file__).parent / "data" / "fitted" / "coefficients.json"
REFERENCE_BATCH = 32  # requests in the reference step the front end's latency is counted in


def read_coefficients(path: str | Path) -> tuple[dict[str, float], float, float]:
    """The step-term coefficients, the front end's fixed latency and its latency in reference
    steps (`frontend_steps`, 0 where the file has none) of a coefficient file."""
    try:
        data = json.loads(Path(path).read_text())
        coefficients = {t: float(data["coefficients"][t]) for t in TERMS}
        frontend = float(data["frontend_latency"])
        steps = float(data.get("frontend_steps", 0.0))
    except FileNotFoundError:
        raise CostModelError(f"cost_model.coefficients={path}: no such file") from None
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as err:
        raise CostModelError(
            f"{path}: not a fitted-coefficient file (needs coefficients.{'/'.join(TERMS)} and "
            f"frontend_latency): {err}"
        ) from None
    if any(not (np.isfinite(v) and v >= 0) for v in [*coefficients.values(), frontend, steps]):
        raise CostModelError(f"{path}: every coefficient must be a number >= 0")
    return coefficients, frontend, steps


@dataclass(frozen=True)
class FittedCost(RooflineCost):
    """`cost_model=fitted`: the roofline's model, GPU, tp and dtype keys, fitted coefficients."""

    coefficients: str | None = None  # a coefficient file; None: the one fairsim ships

    def __post_init__(self) -> None:
        super().__post_init__()
        self._use(*read_coefficients(self.coefficients or SHIPPED))

    def with_coefficients(
        self, beta: dict[str, float], frontend: float, frontend_steps: float = 0.0
    ) -> FittedCost:
        """The same model with other coefficients (the fit's iterates)."""
        other = replace(self)
        other._use(dict(beta), float(frontend), float(frontend_steps))
        return other

    def _use(self, beta: dict[str, float], frontend: float, frontend_steps: float = 0.0) -> None:
        object.__setattr__(self, "beta", beta)
        m, g = self.model_spec, self.gpu_spec
        peak, bw = self.tp * g.flops_for(m.attention_compute), self.tp * g.hbm_bandwidth
        # seconds per (query, key) pair and per KV token read, times their coefficient
        object.__setattr__(
            self,
            "_attention",
            (beta["attention"] * m.attention_pair_flops / peak, m.kv_bytes_over(self.tp) / bw),
        )
        object.__setattr__(self, "_counts", {})
        # timed by this class, whatever a subclass records of the run's steps
        n = REFERENCE_BATCH
        reference = FittedCost.one_step(self, n, n, float(n), float(n))
        object.__setattr__(self, "reference_step", reference)
        object.__setattr__(self, "frontend_latency", frontend + frontend_steps * reference)

    def term_matrix(
        self,
        tokens: np.ndarray,
        requests: np.ndarray,
        kv_tokens: np.ndarray,
        pairs: np.ndarray,
    ) -> np.ndarray:
        """The physics terms (columns in TERMS order) of steps of `tokens` tokens from
        `requests` requests, whose attention reads `kv_tokens` tokens of KV (the new ones
        included) over `pairs` (query, key) pairs: seconds at datasheet rates, counts for the
        last three."""
        m, g, tp = self.model_spec, self.gpu_spec, self.tp
        peak, bw = tp * g.flops_for(m.compute), tp * g.hbm_bandwidth
        t = np.asarray(tokens, dtype=np.float64)
        r = np.asarray(requests, dtype=np.float64)
        head = m.vocab * m.hidden
        weights = (m.layer_bytes_read(t) + head * m.dtype_bytes) / bw
        flops = 2.0 * m.layer_params * m.layers * t + 2.0 * head * r
        if m.recurrent_layers:  # the recurrent layers' state updates beyond their projections
            flops = flops + m.recurrent_token_flops * t
        beyond = np.maximum(flops / peak - weights, 0.0)  # compute not hidden under the reads
        attention_peak = tp * g.flops_for(m.attention_compute)
        attention = np.maximum(
            float(m.attention_pair_flops) * np.asarray(pairs, dtype=np.float64) / attention_peak,
            np.asarray(kv_tokens, dtype=np.float64) * m.kv_bytes_over(tp) / bw,
        )
        ring = np.zeros_like(t)
        calls = 0.0
        if tp > 1:
            link = g.allreduce_bandwidth(tp)
            ring = m.allreduces * 2.0 * (tp - 1) / tp * t * m.hidden * 2 / link
            calls = float(m.allreduces)
        ones = np.ones_like(t)
        return np.column_stack([weights, beyond, attention, ring, calls * ones, r, ones])

    def _count_part(self, tokens: int, requests: int) -> float:
        """Every term but attention's, for a step of this many tokens and requests (cached:
        the engines ask tens of thousands of times per run)."""
        cache: dict[tuple[int, int], float] = self._counts  # type: ignore[attr-defined]
        t = cache.get((tokens, requests))
        if t is None:
            beta: dict[str, float] = self.beta  # type: ignore[attr-defined]
            one = np.array([tokens]), np.array([requests]), np.zeros(1), np.zeros(1)
            x = self.term_matrix(*one)[0]
            t = float(sum(beta[k] * x[i] for i, k in enumerate(TERMS) if k != "attention"))
            cache[(tokens, requests)] = t
        return t

    def one_step(self, tokens: int, requests: int, kv_tokens: float, pairs: float) -> float:
        """One step's time (the arguments as `term_matrix` takes them): what `step_time` and
        `decode_time` ask."""
        per_pair, per_token = self._attention  # type: ignore[attr-defined]
        beta = self.beta["attention"]  # type: ignore[attr-defined]
        attention = max(per_pair * pairs, beta * per_token * kv_tokens)
        return self._count_part(tokens, requests) + attention

    def step_time(
        self,
        chunks: Sequence[tuple[int, int]] = (),
        decode_batch: int = 0,
        decode_context: int = 0,
    ) -> float:
        tokens, pairs, kv_read = self._shape(chunks, decode_batch, decode_context)
        return self.one_step(tokens, len(chunks) + decode_batch, kv_read + tokens, pairs)

    def prefill_time(self, prompt_lens: np.ndarray) -> float:
        return self.step_time([(int(p), 0) for p in np.asarray(prompt_lens).tolist()])

    def decode_times(self, batch_size: int, context_tokens: np.ndarray) -> np.ndarray:
        ctx = np.asarray(context_tokens, dtype=np.float64)
        if self._whole is not None:  # type: ignore[attr-defined]
            ctx = np.minimum(ctx, batch_size * self._whole)  # type: ignore[attr-defined]
        per_pair, per_token = self._attention  # type: ignore[attr-defined]
        beta = self.beta["attention"]  # type: ignore[attr-defined]
        shape = self._decode_shape  # type: ignore[attr-defined]
        if shape is None:
            attention = np.maximum(per_pair * ctx, beta * per_token * (ctx + batch_size))
        else:
            pairs, kv = shape(ctx, batch_size)
            attention = np.maximum(per_pair * pairs, beta * per_token * kv)
        return self._count_part(batch_size, batch_size) + attention

    def decode_time(self, batch_size: int, context_tokens: int) -> float:
        ctx = float(context_tokens)
        if self._whole is not None:  # type: ignore[attr-defined]
            ctx = float(min(context_tokens, batch_size * self._whole))  # type: ignore[attr-defined]
        shape = self._decode_shape  # type: ignore[attr-defined]
        if shape is None:
            return self.one_step(batch_size, batch_size, ctx + batch_size, ctx)
        pairs, kv = shape(ctx, batch_size)
        return self.one_step(batch_size, batch_size, float(kv), float(pairs))
