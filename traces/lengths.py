"""Token-length distributions: each draws n integer lengths >= 1 from its own Generator."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from traces.schema import TraceError


class LengthDistribution(Protocol):
    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray: ...


@dataclass(frozen=True)
class Fixed:
    value: int

    def __post_init__(self) -> None:
        if int(self.value) != self.value or self.value < 1:
            raise TraceError(f"Fixed.value must be an integer >= 1, got {self.value!r}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(n, int(self.value), dtype=np.int64)


@dataclass(frozen=True)
class UniformInt:
    """Integers uniform on [low, high) (numpy's and the VTC artifact's half-open convention)."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not (1 <= self.low < self.high):
            raise TraceError(
                f"UniformInt needs 1 <= low < high (high excluded), got [{self.low}, {self.high})"
            )

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(self.low, self.high, size=n, dtype=np.int64)


@dataclass(frozen=True)
class Empirical:
    """Draw from a table of lengths with optional weights (equal weights when omitted)."""

    values: Sequence[int]
    weights: Sequence[float] | None = None

    def __post_init__(self) -> None:
        v = np.asarray(self.values)
        if v.ndim != 1 or v.size == 0:
            raise TraceError("Empirical.values must be a non-empty list of lengths")
        if (v < 1).any() or (v != np.round(v)).any():
            i = int(np.argmax((v < 1) | (v != np.round(v))))
            raise TraceError(f"Empirical.values[{i}] = {v[i]!r}; accepted: integers >= 1")
        if self.weights is not None:
            w = np.asarray(self.weights, dtype=float)
            if w.shape != v.shape or (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
                raise TraceError(
                    "Empirical.weights must match values in length, be finite, >= 0, sum > 0"
                )

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        v = np.asarray(self.values, dtype=np.int64)
        p = None
        if self.weights is not None:
            w = np.asarray(self.weights, dtype=float)
            p = w / w.sum()
        return rng.choice(v, size=n, p=p)


@dataclass(frozen=True)
class LogNormal:
    """Log-normal lengths with the given median and log-space sigma, rounded and capped.

    Values are rounded to integers and limited to [1, max_value] (a documented cap, like the
    caps serving benchmarks apply to ShareGPT); use it for heavy-tailed chat-like lengths.
    """

    median: float
    sigma: float
    max_value: int = 4096

    def __post_init__(self) -> None:
        if not (self.median >= 1 and self.sigma > 0 and self.max_value >= 1):
            raise TraceError(f"LogNormal needs median >= 1, sigma > 0, max_value >= 1; got {self}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        x = rng.lognormal(np.log(self.median), self.sigma, size=n)
        return np.clip(np.rint(x), 1, self.max_value).astype(np.int64)
