"""Step-time jitter: a multiplicative noise on every step a replica takes.

A real GPU's step times vary from step to step; a deterministic cost model makes every run one
fixed sample. With `engine.step_jitter_cv > 0`, step k of replica r takes its cost model's time
times f(k), f lognormal with mean 1 and that coefficient of variation. f(k) depends only on
(`engine.step_jitter_seed`, r, k): it comes from its own seeded stream, in blocks of BLOCK steps,
so the workload's randomness never changes, and a run of steps timed at once (fast-forward) is
multiplied by exactly the factors stepping one by one would draw.

A GPU also runs a whole session a little faster or slower than another (clocks, temperature,
the machine it landed on): with `engine.run_speed_cv > 0` every step of replica r is also
multiplied by one factor g(r), lognormal with mean 1 and that CV, drawn once from
(`engine.step_jitter_seed`, r) on a stream of its own. Both CVs 0 take no factor at all: today's
timelines, bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

BLOCK = 4096  # steps per block of factors drawn at once


def lognormal_parameters(cv: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with mean 1 and coefficient of variation `cv`."""
    sigma = math.sqrt(math.log1p(cv * cv))
    return -sigma * sigma / 2, sigma  # E = exp(mu + sigma^2 / 2) = 1


def run_speed(cv: float, seed: int, replica: int) -> float:
    """g(replica): the one factor of every step of a replica's run (1.0 when cv is 0)."""
    if cv == 0:
        return 1.0
    mu, sigma = lognormal_parameters(cv)
    # spawn key 1: a stream apart from the per-step blocks' ([seed, replica, block])
    stream = np.random.SeedSequence([seed, replica], spawn_key=(1,))
    return float(np.random.default_rng(stream).lognormal(mu, sigma))


class StepJitter:
    def __init__(self, cv: float, seed: int, replica: int, run_cv: float = 0.0) -> None:
        self.mu, self.sigma = lognormal_parameters(cv)
        self.seed, self.replica = seed, replica
        self.speed = run_speed(run_cv, seed, replica)
        self._blocks: dict[int, np.ndarray] = {}

    def _block(self, b: int) -> np.ndarray:
        block = self._blocks.get(b)
        if block is None:
            if len(self._blocks) > 2:  # steps move forward: keep the last few blocks
                del self._blocks[min(self._blocks)]
            if self.sigma == 0:  # a run speed alone: no per-step noise to draw
                block = np.full(BLOCK, self.speed)
            else:
                rng = np.random.default_rng([self.seed, self.replica, b])
                block = rng.lognormal(self.mu, self.sigma, BLOCK)
                if self.speed != 1.0:
                    block *= self.speed
            self._blocks[b] = block
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


def step_jitter(cv: float, seed: int, replica: int, run_cv: float = 0.0) -> StepJitter | None:
    """The replica's jitter, or None when both CVs are 0 (no factor is taken)."""
    return StepJitter(cv, seed, replica, run_cv) if cv > 0 or run_cv > 0 else None
