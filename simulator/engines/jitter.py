"""Step-time jitter: a multiplicative noise on every step a replica takes.

A real GPU's step times vary from step to step; a deterministic cost model makes every run one
fixed sample. With `engine.step_jitter_cv > 0`, step k of replica r takes its cost model's time
times f(k), f lognormal with mean 1 and that coefficient of variation. f(k) depends only on
(`engine.step_jitter_seed`, r, k): it comes from its own seeded stream, in blocks of BLOCK steps,
so the workload's randomness never changes, and a run of steps timed at once (fast-forward) is
multiplied by exactly the factors stepping one by one would draw. cv = 0 takes no factor at all:
today's timelines, bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

BLOCK = 4096  # steps per block of factors drawn at once


class StepJitter:
    def __init__(self, cv: float, seed: int, replica: int) -> None:
        self.sigma = math.sqrt(math.log1p(cv * cv))
        self.mu = -self.sigma * self.sigma / 2  # E[f] = exp(mu + sigma^2 / 2) = 1
        self.seed, self.replica = seed, replica
        self._blocks: dict[int, np.ndarray] = {}

    def _block(self, b: int) -> np.ndarray:
        block = self._blocks.get(b)
        if block is None:
            if len(self._blocks) > 2:  # steps move forward: keep the last few blocks
                del self._blocks[min(self._blocks)]
            rng = np.random.default_rng([self.seed, self.replica, b])
            block = self._blocks[b] = rng.lognormal(self.mu, self.sigma, BLOCK)
        return block

    def factor(self, k: int) -> float:
        """f(k) of step k of this replica."""
        return float(self._block(k // BLOCK)[k % BLOCK])

    def factors(self, first: int, n: int) -> np.ndarray:
        """f(first), ..., f(first + n - 1)."""
        out = np.empty(n)
        done = 0
        while done < n:
            k = first + done
            b, i = divmod(k, BLOCK)
            take = min(BLOCK - i, n - done)
            out[done : done + take] = self._block(b)[i : i + take]
            done += take
        return out


def step_jitter(cv: float, seed: int, replica: int) -> StepJitter | None:
    """The replica's jitter, or None when cv is 0 (no factor is taken)."""
    return StepJitter(cv, seed, replica) if cv > 0 else None
