"""Where a replica's arrivals come from: rows with a known time, chained calls, pushed arrivals.

Rows with a known time arrive in (time, row) order; a chained call (closed-loop users,
multi-call interactions) is released when its predecessor ends, `think_time` later, and an
arrival pushed while the runner runs (live mode) is released the same way; both join the same
order. `ingest(until)` hands every arrival up to `until` (and the horizon) to `deliver`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import numpy as np

from traces.schema import Trace


def chains(trace: Trace) -> dict[int, tuple[int, float]]:
    """Per row with a chained successor: (successor row, think time before it is sent)."""
    before = trace.predecessor()
    think = trace.think_time
    return {
        int(b): (r, float(think[r]))  # type: ignore[index]
        for r, b in enumerate(before.tolist())
        if b >= 0
    }


def first_arrivals(trace: Trace) -> np.ndarray:
    """Rows whose arrival time is known up front (not waiting for a predecessor), in order."""
    return np.flatnonzero(trace.predecessor() < 0)


class Arrivals:
    def __init__(self, rows: list[int], times: list[float], horizon: float | None = None) -> None:
        # a sentinel at the end (time inf) saves a bounds check on every look-up
        self._rows, self._times, self._next = [*rows, -1], [*times, np.inf], 0
        self.horizon = horizon  # arrivals after it never happen
        self._released: list[tuple[float, int]] = []  # heap: (time, row) of released arrivals
        self._next_time = self._times[0]  # kept up to date: engines ask for it very often
        self.deliver: Callable[[int, float], None] = lambda req, t: None

    def next_time(self) -> float:
        """Time of the next arrival known so far (inf: none)."""
        return self._next_time

    def _update_next_time(self) -> None:
        t = self._times[self._next]
        if self._released and self._released[0][0] <= t:
            t = self._released[0][0]
        self._next_time = t

    def ingest(self, until: float) -> None:
        """Deliver every arrival with time <= until (and the horizon), in (time, row) order."""
        if self.horizon is not None:
            until = min(until, self.horizon)
        while self._next_time <= until:
            i = self._next
            if self._released and self._released[0] < (self._times[i], self._rows[i]):
                t, req = heapq.heappop(self._released)
            else:
                t, req = self._times[i], self._rows[i]
                self._next += 1
            self._update_next_time()
            self.deliver(req, t)

    def first_give_up(self, timeouts: np.ndarray, frontend: float, until: float) -> float:
        """The earliest time a client of an arrival up to `until` gives up (inf: none): its
        send (the arrival less `frontend`, as the runner notes it) plus its timeout. A run of
        steps that takes these arrivals in must end with the step under way then, as stepping
        drops the request before the next step."""
        if self.horizon is not None:
            until = min(until, self.horizon)
        first = math.inf
        for t, req in self._released:  # (chained or pushed calls, in heap order)
            if t <= until:
                first = min(first, float(t - frontend + timeouts[req]))
        i, times, rows = self._next, self._times, self._rows
        # a deadline is never before its send: past `first`, no later arrival gives up sooner
        while times[i] <= until and times[i] - frontend < first:
            first = min(first, float(times[i] - frontend + timeouts[rows[i]]))
            i += 1
        return first

    def release(self, req: int, t: float) -> None:
        """`req` will arrive at `t` (a chained call whose predecessor ended, or a pushed one)."""
        heapq.heappush(self._released, (t, req))
        self._update_next_time()
