"""The waiting requests' Andes values, kept by phase so that a pick values a few requests, not
the whole queue.

A waiting request's value (policies/andes.py) moves through three phases as time passes, its
tokens so far fixed while it waits:
- dormant: its user has not yet read what it has (or expects nothing yet): the value is 0;
- rising: the user's expectation overtakes it, the value rises and may fall again;
- settled: the user expects more than a horizon of serving could give, so the delay area
  avoided is the same at every later time while the expected timeline it is normalised by keeps
  growing: the value (and the value per KV block) only falls from here on.
Each phase's end is a closed form of the request's arrival, client and tokens (`Phases`).

Dormant requests wait in a heap by the time they wake. Rising ones (a few seconds' arrivals) are
valued at every new time. Settled ones sit in two max-heaps keyed by upper bounds — their last
computed density and value, which can only have fallen since — and a query values again only
the heap tops whose bound could still beat the best found (the lazy evaluation of CELF-style
greedy selection). Every value compared is computed by the policy's own formula on the same
inputs, so the order is the full ranking's, bit for bit (tests/test_policy_indexes.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Generator
from dataclasses import dataclass

import numpy as np

from simulator.core.queue import WaitingQueue

# a bound is the value last computed times this: the float formula may wander by rounding (a
# few 1e-10 relative at a million simulated seconds), never by this much
SLACK = 1.0 + 1e-6
BATCH = 8  # heap tops valued again in one vectorised call


@dataclass(frozen=True)
class Phases:
    """When each of some requests stops being dormant, and when it settles (arrays)."""

    wakes: np.ndarray
    settles: np.ndarray


Entry = tuple[float, int, int, int]  # (-bound, seq, request, version) of a settled request
Values = Callable[[list[int], float], np.ndarray]
Blocks = Callable[[list[int]], np.ndarray]


class WaitingValues:
    """Andes's waiting requests ranked by value per KV block (ties: queue order) and their best
    value, at any time no earlier than the last one asked about."""

    def __init__(self, values: Values, blocks: Blocks, phases: Callable[[list[int]], Phases]):
        self._values, self._blocks, self._phases = values, blocks, phases
        self._entered: dict[int, None] = {}  # requests that entered the queue since last asked
        self._version: dict[int, int] = {}  # request -> its current entry (it may wait again)
        self._versions = 0
        self._seq: dict[int, int] = {}  # request -> its place in queue order
        self._need: dict[int, int] = {}  # request -> the KV blocks it needs to run
        self._dormant: list[tuple[float, int, int]] = []  # (wakes, request, version)
        self._settling: list[tuple[float, int, int]] = []  # (settles, request, version)
        self._rising: dict[int, int] = {}  # request -> version
        self._rising_changes = 0
        self._rising_valued: tuple[float, int] | None = None  # (time, changes) last valued at
        self._rising_rank: list[tuple[float, int, int]] = []  # (density, seq, req), best first
        self._rising_best = 0.0  # their best value
        # settled requests by upper bounds of their density and value: (-bound, seq, req, version)
        self._by_density: list[Entry] = []
        self._by_value: list[Entry] = []
        self._valued: dict[int, tuple[float, float, float]] = {}  # req -> (at, value, density)

    def entered(self, req: int) -> None:
        """`req` is about to enter the queue (an arrival, or a preempted request put back)."""
        self._entered[req] = None

    def need(self, req: int) -> int:
        """The KV blocks a waiting request needs to run."""
        return self._need[req]

    # ---- keeping the phases ----------------------------------------------------------------
    def _live(self, queue: WaitingQueue, req: int, version: int) -> bool:
        """The entry is the request's current one and the request still waits; an entry of a
        request that left the queue makes the index forget it."""
        if req not in queue:
            self._version.pop(req, None)
            self._seq.pop(req, None)
            self._need.pop(req, None)
            self._valued.pop(req, None)
            return False
        return self._version.get(req) == version

    def _catch_up(self, queue: WaitingQueue, now: float) -> None:
        if self._entered:
            fresh = [r for r in self._entered if r in queue]
            self._entered.clear()
            if fresh:
                phases, need = self._phases(fresh), self._blocks(fresh).tolist()
                for i, req in enumerate(fresh):
                    self._versions += 1
                    self._version[req] = version = self._versions
                    self._seq[req], self._need[req] = queue.sequence(req), need[i]
                    heapq.heappush(self._dormant, (float(phases.wakes[i]), req, version))
                    heapq.heappush(self._settling, (float(phases.settles[i]), req, version))
        while self._dormant and self._dormant[0][0] <= now:
            _, req, version = heapq.heappop(self._dormant)
            if self._live(queue, req, version):
                self._rising[req] = version
                self._rising_changes += 1
        settled = []
        while self._settling and self._settling[0][0] <= now:
            _, req, version = heapq.heappop(self._settling)
            if self._live(queue, req, version):
                del self._rising[req]  # it woke before it settles
                self._rising_changes += 1
                settled.append(req)
        if settled:
            self._value(settled, now)
            for req in settled:
                self._push(self._by_density, req, 2)
                self._push(self._by_value, req, 1)

    def _value(self, rows: list[int], now: float) -> None:
        values = self._values(rows, now)
        densities = values / self._blocks(rows)
        for req, v, d in zip(rows, values.tolist(), densities.tolist(), strict=True):
            self._valued[req] = (now, v, d)

    def _push(self, heap: list[Entry], req: int, field: int) -> None:
        """Push a settled request with its last value (field 1) or density (2) as its bound."""
        bound = self._valued[req][field] * SLACK
        heapq.heappush(heap, (-bound, self._seq[req], req, self._version[req]))

    def _value_rising(self, queue: WaitingQueue, now: float) -> None:
        """Value the rising requests at `now` (once per time and membership)."""
        for req in [r for r, v in self._rising.items() if not self._live(queue, r, v)]:
            del self._rising[req]
            self._rising_changes += 1
        if self._rising_valued == (now, self._rising_changes):
            return
        self._rising_valued = (now, self._rising_changes)
        rows = list(self._rising)
        if not rows:
            self._rising_rank, self._rising_best = [], 0.0
            return
        values = self._values(rows, now)
        densities = (values / self._blocks(rows)).tolist()
        ranked = zip(densities, [self._seq[r] for r in rows], rows, strict=True)
        self._rising_rank = sorted(ranked, key=lambda e: (-e[0], e[1]))
        self._rising_best = float(values.max())

    # ---- the queries -------------------------------------------------------------------------
    def best_value(self, queue: WaitingQueue, now: float) -> float:
        """The largest value of any waiting request at `now` (0 when all are dormant)."""
        self._catch_up(queue, now)
        self._value_rising(queue, now)
        best, heap, seen = self._rising_best, self._by_value, []
        while heap and -heap[0][0] > best:
            batch = self._pop_batch(heap, queue, now, best)
            best = max([best] + [self._valued[req][1] for req in batch])
            seen += batch
        for req in seen:
            self._push(heap, req, 1)
        return best

    def ranked(self, queue: WaitingQueue, now: float) -> Generator[tuple[float, int], None, None]:
        """The waiting requests of positive value, as (density, request), best density first,
        ties in queue order. Close it when done: it puts back what it took."""
        self._catch_up(queue, now)
        self._value_rising(queue, now)
        rising = [e for e in self._rising_rank if e[0] > 0]
        heap = self._by_density
        settled: list[tuple[float, int, int]] = []  # (-density, seq, req) valued at `now`
        taken: list[int] = []
        i = 0
        try:
            while True:
                while i < len(rising) and rising[i][2] not in queue:
                    i += 1
                top = (-rising[i][0], rising[i][1]) if i < len(rising) else None
                # value again every settled request whose bound reaches the best known
                while heap:
                    known = [e for e in (top, settled[0][:2] if settled else None) if e]
                    best = -min(known)[0] if known else 0.0
                    if -heap[0][0] < best:
                        break
                    for req in self._pop_batch(heap, queue, now, best):
                        heapq.heappush(settled, (-self._valued[req][2], self._seq[req], req))
                if settled and (top is None or settled[0][:2] < top):
                    density, _, req = heapq.heappop(settled)
                    taken.append(req)
                    yield -density, req
                elif top is not None:
                    yield rising[i][0], rising[i][2]
                    i += 1
                else:
                    return
        finally:
            for req in taken + [e[2] for e in settled]:
                if req in queue:
                    self._push(heap, req, 2)

    def _pop_batch(
        self,
        heap: list[Entry],
        queue: WaitingQueue,
        now: float,
        at_least: float,
    ) -> list[int]:
        """Take up to BATCH live entries off the heap's top while their bound is at least
        `at_least`, each valued at `now` (those valued earlier, together); drop dead ones."""
        batch: list[int] = []
        while heap and len(batch) < BATCH and -heap[0][0] >= at_least:
            _, _, req, version = heapq.heappop(heap)
            if self._live(queue, req, version):
                batch.append(req)
        stale = [req for req in batch if self._valued[req][0] != now]
        if stale:
            self._value(stale, now)
        return batch
