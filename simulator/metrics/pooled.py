"""Pooled inter-token gaps of a run too large to hold one value per token.

Tokens of a run sit on its replicas' token clocks (simulator/core/timeline.py): within a run
of consecutive ticks, every gap between two tokens is the difference of two neighbouring clock
entries, the same floating-point subtraction the per-token tables make. So the pooled gaps of
any set of requests are the clock's differences, each counted as many times as that set's runs
cover it, plus one gap wherever a request's tokens pass from one run to the next (after a
preemption, or from S-LoRA's prefill step to its decode steps). That is a weighted multiset of
about one value per step instead of one per token: a million-request run holds 16M steps and
260M tokens.

`WeightedValues` answers what the summaries ask of pooled gaps (mean, min, max, numpy's linear
percentiles), with the same order statistics as the expanded values.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from simulator.core.timeline import Timeline

MEAN_CHUNK = 1 << 20  # values summed at once by `WeightedValues.mean`


@dataclass(frozen=True)
class WeightedValues:
    """Values (ascending) each counted `counts` times (>= 0: a subset of pooled gaps is every
    gap weighted, 0 for those it does not cover, rather than a copy of the covered ones)."""

    values: np.ndarray
    counts: np.ndarray

    @property
    def size(self) -> int:
        return int(self.ends[-1]) if self.ends.size else 0

    @cached_property
    def ends(self) -> np.ndarray:
        """Each value's last rank + 1 in the expanded values (int32 while they fit: half the
        memory, one entry per step of the run)."""
        total = int(np.sum(self.counts, dtype=np.int64))
        return np.cumsum(self.counts, dtype=np.int32 if total < 2**31 else np.int64)

    def mean(self) -> float:
        """Summed a chunk at a time: the counts are cast to floats for the products, a chunk's
        worth at once rather than a copy of them all."""
        n = self.size
        if not n:
            return float("nan")
        total = 0.0
        for i in range(0, self.values.shape[0], MEAN_CHUNK):
            total += float(np.dot(self.values[i : i + MEAN_CHUNK], self.counts[i : i + MEAN_CHUNK]))
        return total / n

    def min(self) -> float:
        if not self.size:
            return float("nan")
        return float(self.values[np.argmax(self.counts > 0)])

    def max(self) -> float:
        if not self.size:
            return float("nan")
        return float(self.values[-1 - np.argmax(self.counts[::-1] > 0)])

    def quantile(self, q: float) -> float:
        """np.quantile(expanded values, q) (method "linear"), bit for bit: the same virtual
        index, neighbours and interpolation as numpy's, with the neighbours found by rank."""
        n = self.size
        if n == 0:
            return float("nan")
        virtual = (n - 1) * np.float64(q)
        below = np.floor(virtual)
        if virtual >= n - 1:
            return self.max()
        # ranks of the ends' own type: other keys would make searchsorted cast every end
        ranks = np.array([int(below), int(below) + 1], dtype=self.ends.dtype)
        a, b = self.values[np.searchsorted(self.ends, ranks, side="right")]
        t = virtual - below
        diff = b - a
        return float(b - diff * (1 - t)) if t >= 0.5 else float(a + diff * t)

    def percentile(self, p: float) -> float:
        """np.percentile(expanded values, p)."""
        return self.quantile(np.true_divide(p, 100))

    def summary(self, ps: tuple[int, ...]) -> dict[str, float]:
        """`simulator.metrics.latency.percentiles` of the expanded values."""
        return {"mean": self.mean(), **{f"p{p}": self.percentile(p) for p in ps}}


class PooledGaps:
    """The inter-token gaps of a timeline's requests, for any subset of them (`of`)."""

    def __init__(self, timeline: Timeline) -> None:
        runs = timeline.sorted_token_runs()
        clock = timeline.token_clock
        self._tick, self._count = runs["tick"], runs["count"]
        self._row = runs["row"]
        # a request's next run: the gap from its last token so far to the next run's first
        same = self._row[1:] == self._row[:-1]
        before, after = np.flatnonzero(same), np.flatnonzero(same) + 1
        cross = clock[self._tick[after]] - clock[self._tick[before] + self._count[before] - 1]
        self._cross_row = self._row[after]
        steps = np.diff(clock)  # entry p - 1: the gap between ticks p - 1 and p
        entries = np.concatenate((steps, cross))
        del steps, cross
        self._steps = entries.shape[0] - self._cross_row.shape[0]
        # int32 positions: half the memory of argsort's (a million-request run has 17M entries)
        self._order = np.argsort(entries, kind="stable").astype(np.int32)
        self._sorted = entries[self._order]

    def of(self, rows: np.ndarray) -> WeightedValues:
        """The pooled gaps of the requests where `rows` (a mask over the trace's rows) holds:
        every gap, weighted by how many of them it belongs to (0 for none), rather than a copy
        of the covered gaps and their weights (21 bytes a gap more at once): with int32 ranks
        (`WeightedValues.ends`) and the mean summed in chunks, the 8-replica day of
        benchmarks/fleet_day.py --whole peaks at 1,073 MB instead of 1,449-1,525 MB."""
        mine = rows[self._row] & (self._count > 1)
        tick, count = self._tick[mine], self._count[mine]
        length = self._steps + 1
        # a run covers the gaps ending at ticks tick + 1 .. tick + count - 1 (int32: no gap is
        # shared by 2^31 requests)
        cover = np.zeros(length + 1, dtype=np.int32)
        np.add.at(cover, tick + 1, 1)
        np.add.at(cover, tick + count, -1)
        np.cumsum(cover, out=cover)
        weight = np.concatenate((cover[1:length], rows[self._cross_row].astype(np.int32)))
        del cover
        return WeightedValues(self._sorted, weight[self._order])
