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


@dataclass(frozen=True)
class WeightedValues:
    """Values (ascending) each counted `counts` times (> 0)."""

    values: np.ndarray
    counts: np.ndarray

    @property
    def size(self) -> int:
        return int(self.ends[-1]) if self.ends.size else 0

    @cached_property
    def ends(self) -> np.ndarray:
        """Each value's last rank + 1 in the expanded values."""
        return np.cumsum(self.counts, dtype=np.int64)

    def mean(self) -> float:
        n = self.size
        return float(np.dot(self.values, self.counts) / n) if n else float("nan")

    def min(self) -> float:
        return float(self.values[0]) if self.values.size else float("nan")

    def max(self) -> float:
        return float(self.values[-1]) if self.values.size else float("nan")

    def quantile(self, q: float) -> float:
        """np.quantile(expanded values, q) (method "linear"), bit for bit: the same virtual
        index, neighbours and interpolation as numpy's, with the neighbours found by rank."""
        n = self.size
        if n == 0:
            return float("nan")
        virtual = (n - 1) * np.float64(q)
        below = np.floor(virtual)
        if virtual >= n - 1:
            return float(self.values[-1])
        ranks = [int(below), int(below) + 1]
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
        """The pooled gaps of the requests where `rows` (a mask over the trace's rows) holds."""
        mine = rows[self._row] & (self._count > 1)
        tick, count = self._tick[mine], self._count[mine]
        length = self._steps + 1
        # a run covers the gaps ending at ticks tick + 1 .. tick + count - 1 (int32: no gap is
        # shared by 2^31 requests)
        cover = np.zeros(length + 1, dtype=np.int32)
        np.add.at(cover, tick + 1, 1)
        np.add.at(cover, tick + count, -1)
        covered = np.cumsum(cover, dtype=np.int32)[1:length]
        del cover
        weight = np.concatenate((covered, rows[self._cross_row].astype(np.int32)))
        del covered
        weight = weight[self._order]
        keep = weight > 0
        return WeightedValues(self._sorted[keep], weight[keep])
