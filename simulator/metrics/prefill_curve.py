"""The prefill-time curve behind fluidity's first-token deadline (docs/metrics.md, fluidity).

Etalon profiles the serving system with one request at a time at several prompt lengths, takes
the minimum TTFT per length, and fits a curve (simulator/api/prefill_profile.py profiles the
simulated engine). Fit: least squares of TTFT on [1, P, P^2] (Etalon uses a random forest on
[P, P^2]); the curve is flat outside the profiled range, as Etalon's is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from simulator.core.errors import ConfigError


@dataclass(frozen=True)
class PrefillCurve:
    """Predicted prefill seconds c0 + c1 P + c2 P^2, with P clipped to the profiled range."""

    coefficients: tuple[float, float, float]
    min_prompt: int
    max_prompt: int

    def __call__(self, prompt_lens: np.ndarray | Sequence[int]) -> np.ndarray:
        p = np.clip(np.asarray(prompt_lens, dtype=np.float64), self.min_prompt, self.max_prompt)
        c0, c1, c2 = self.coefficients
        return c0 + p * (c1 + p * c2)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def fit_prefill_curve(profile: pd.DataFrame) -> PrefillCurve:
    """Least-squares quadratic through the minimum TTFT per profiled prompt length."""
    best = profile.groupby("prompt_len", sort=True)["ttft"].min()
    if len(best) < 3 or best.isna().any():
        raise ConfigError(
            f"a prefill curve needs the TTFT of at least 3 distinct prompt lengths; got {len(best)}"
        )
    p = best.index.to_numpy(dtype=np.float64)
    c2, c1, c0 = np.polyfit(p, best.to_numpy(), 2)
    return PrefillCurve((float(c0), float(c1), float(c2)), int(p.min()), int(p.max()))
