"""How many decode steps a step model takes at once ("fast-forward").

When nothing can change the batch, a step model computes many decode steps in one vectorised
go. Its own state bounds such a run (steps until the next finish, until the KV pool runs short,
and `MAX_RUN_STEPS`); `run_length` then cuts the run's step end times where something from
outside could matter. Stepping one by one gives exactly the same timeline (tests prove it for
every model and policy), so where a run is cut changes speed, never results.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

import numpy as np

MAX_RUN_STEPS = 4096  # cap on one run, to bound temporary arrays
MAX_RUN_SEGMENTS = 256  # runs or steps a standalone replica takes before simulated time catches up


def run_length(
    ends: Sequence[float] | np.ndarray,
    *,
    next_arrival: float,
    horizon: float | None,
    frontier: float,
    wait_left: int = 0,
) -> int:
    """How many of the computed steps (their end times `ends`, at least one) the run takes:
    the smallest of
    - len(ends): what the model's state allows;
    - arrival: up to the step whose end sees `next_arrival` (inf: none that could be admitted),
      but not fewer than `wait_left` steps (the S-LoRA router waits that long in any case);
    - horizon: no step starts at or after the horizon;
    - frontier: steps that end before the runner's frontier (arrivals still to be pushed may
      come from there on), at least one (the runner holds a step that ends later)."""
    k = len(ends)
    if next_arrival < float("inf"):
        k = min(k, max(wait_left, bisect_left(ends, next_arrival) + 1))
    if horizon is not None:
        k = min(k, 1 + bisect_left(ends, horizon, 0, k - 1))
    if frontier < float("inf"):
        k = min(k, max(1, bisect_left(ends, frontier, 0, k)))
    return k
