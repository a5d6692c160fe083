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
valued at every new time. Settled ones are grouped so that a group's order never changes
(`SettledGroups`): by client for the best value, by client and KV blocks needed for the best
value per block. A max-heap holds an upper bound per group — a member's value computed earlier,
which can only have fallen since — and a query values only the youngest members of the groups
whose bound could still beat the best found (the lazy evaluation of CELF-style greedy
selection). A group a query takes off the heap first goes back under its bound as of the query's
time, the closed form of a settled value (`settled_value`), so groups are opened in the order of
what they are worth now. Every value compared is computed by the policy's own formula on the
same inputs, so the order is the full ranking's, bit for bit (tests/test_policy_indexes.py).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from simulator.core.queue import WaitingQueue

# a bound is the value last computed times this: the float formula may wander by rounding (a
# few 1e-10 relative at a million simulated seconds), never by this much
SLACK = 1.0 + 1e-6
BATCH = 2  # a group's youngest members valued together when the group is opened


@dataclass(frozen=True)
class Phases:
    """For some requests (arrays): when each stops being dormant, when it settles, when its
    user expects the first token (the later, the more a settled request is worth) and its
    client (whose expectations fix how its value falls)."""

    wakes: np.ndarray
    settles: np.ndarray
    starts: np.ndarray
    clients: np.ndarray


Member = tuple[float, int, int, int]  # (start, -seq, request, version): youngest last


@dataclass
class Room:
    """What a knapsack still has room for: `blocks`, or None once it takes whatever fits."""

    blocks: int | None


Values = Callable[[list[int], float], np.ndarray]
Blocks = Callable[[list[int]], np.ndarray]
SettledValue = Callable[[float, int, float], float]  # (start, client, now) -> value


class SettledGroups:
    """Settled requests in groups whose order by value (or by value per KV block) never changes:
    within a group the request whose user expects its first token latest is worth most, now and
    at every later time. Each group keeps its members by that time; a max-heap holds one upper
    bound per group (`SLACK` times a member's value computed at some earlier time, which its
    own and every older member's can only have fallen below since)."""

    def __init__(self, field: int) -> None:
        self.field = field  # what is bounded: 1 value, 2 value per KV block (`_valued`)
        self.members: dict[object, list[Member]] = {}  # (start, -seq, ..)
        self.bound: dict[object, float] = {}
        self.heap: list[tuple[float, int, object]] = []  # (-bound, stamp, group)
        self.stamp: dict[object, int] = {}  # the group's current heap entry
        self._stamps = 0

    def add(self, group: object, member: Member, bound: float) -> None:
        bisect.insort(self.members.setdefault(group, []), member)
        if bound > self.bound.get(group, -1.0):
            self.set_bound(group, bound)

    def set_bound(self, group: object, bound: float) -> None:
        self.bound[group] = bound
        self._stamps += 1
        self.stamp[group] = self._stamps
        heapq.heappush(self.heap, (-bound, self._stamps, group))

    def top_bound(self) -> float:
        """The highest current bound (0 when no group is left); stale heap entries go."""
        heap = self.heap
        while heap and self.stamp.get(heap[0][2]) != heap[0][1]:
            heapq.heappop(heap)
        return -heap[0][0] if heap else 0.0

    def pop(self) -> object:
        """Take the group of the highest bound off the heap (`top_bound` first)."""
        return heapq.heappop(self.heap)[2]

    def forget(self, group: object) -> None:
        del self.members[group], self.bound[group], self.stamp[group]


class WaitingValues:
    """Andes's waiting requests ranked by value per KV block (ties: queue order) and their best
    value, at any time no earlier than the last one asked about."""

    def __init__(
        self,
        values: Values,
        blocks: Blocks,
        phases: Callable[[list[int]], Phases],
        settled_value: SettledValue,
    ):
        self._values, self._blocks, self._phases = values, blocks, phases
        self._settled_value = settled_value
        self._entered: dict[int, None] = {}  # requests that entered the queue since last asked
        self._version: dict[int, int] = {}  # request -> its current entry (it may wait again)
        self._versions = 0
        self._seq: dict[int, int] = {}  # request -> its place in queue order
        self._need: dict[int, int] = {}  # request -> the KV blocks it needs to run
        self._dormant: list[tuple[float, int, int]] = []  # (wakes, request, version)
        self._settling: list[tuple[float, int, int]] = []  # (settles, request, version)
        self._rising: dict[int, int] = {}  # request -> version
        self._rising_changes = 0
        self._rising_checked = -1  # the queue's `front_changes` when rising ones were last checked
        self._rising_valued: tuple[float, int] | None = None  # (time, changes) last valued at
        # the rising ones of positive value as `ranked` orders them: (-density, 1, seq, req)
        self._rising_rank: list[tuple[float, int, int, int]] = []
        self._rising_best = 0.0  # their best value
        self._by_value = SettledGroups(field=1)  # groups: clients
        self._by_density = SettledGroups(field=2)  # groups: (client, blocks needed)
        self._start: dict[int, float] = {}  # request -> when its user expects the first token
        self._client: dict[int, int] = {}
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
            self._start.pop(req, None)
            self._client.pop(req, None)
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
                    self._start[req] = float(phases.starts[i])
                    self._client[req] = int(phases.clients[i])
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
                _, value, density = self._valued[req]
                member = (self._start[req], -self._seq[req], req, self._version[req])
                client = self._client[req]
                self._by_value.add(client, member, value * SLACK)
                self._by_density.add((client, self._need[req]), member, density * SLACK)

    def _value(self, rows: list[int], now: float) -> None:
        values = self._values(rows, now)
        densities = values / self._blocks(rows)
        for req, v, d in zip(rows, values.tolist(), densities.tolist(), strict=True):
            self._valued[req] = (now, v, d)

    def _value_batch(
        self,
        queue: WaitingQueue,
        now: float,
        also: Sequence[int] = (),
        settled: Sequence[int] = (),
    ) -> np.ndarray:
        """Value at `now`, in one call: the rising requests (once per time and membership; their
        ranking and best value are kept), `also` (running requests, whose values it returns)
        and `settled` ones (kept in `_valued`)."""
        if queue.front_changes != self._rising_checked:  # a request left the queue since
            self._rising_checked = queue.front_changes
            for req in [r for r, v in self._rising.items() if not self._live(queue, r, v)]:
                del self._rising[req]
                self._rising_changes += 1
        stale = self._rising_valued != (now, self._rising_changes)
        if not stale and not also:
            return np.zeros(0)
        rising = list(self._rising) if stale else []
        rows = [*also, *rising, *settled]
        values = self._values(rows, now) if rows else np.zeros(0)
        densities = values / self._blocks(rows) if rows else values
        if stale:
            self._rising_valued = (now, self._rising_changes)
            at = slice(len(also), len(also) + len(rising))
            seqs = [self._seq[r] for r in rising]
            ranked = zip(densities[at].tolist(), seqs, rising, strict=True)
            self._rising_rank = sorted((-d, 1, seq, req) for d, seq, req in ranked if d > 0)
            self._rising_best = float(values[at].max()) if rising else 0.0
        first = len(also) + len(rising)
        for req, v, d in zip(settled, values[first:].tolist(), densities[first:].tolist()):
            self._valued[req] = (now, v, d)
        return values[: len(also)]

    # ---- the queries -------------------------------------------------------------------------
    def value_running(self, running: list[int], queue: WaitingQueue, now: float) -> np.ndarray:
        """The running requests' values at `now`, valued together with the rising waiting ones
        (one vectorised call instead of two: the call's own cost, not its rows, dominates at a
        few hundred rows)."""
        self._catch_up(queue, now)
        return self._value_batch(queue, now, running, self._likely_opened(queue, now))

    def _likely_opened(self, queue: WaitingQueue, now: float) -> list[int]:
        """The members a query at `now` will most likely value: the youngest of the groups in
        the first three levels of each heap, where the best bounds are (a guess: a query values
        whatever else it needs itself)."""
        likely: dict[int, None] = {}
        for groups in (self._by_value, self._by_density):
            for _, stamp, group in groups.heap[:7]:
                if groups.stamp.get(group) != stamp:
                    continue
                for _, _, req, version in groups.members[group][-BATCH:]:
                    if self._live(queue, req, version) and self._valued[req][0] != now:
                        likely[req] = None
        return list(likely)

    def best_value(self, queue: WaitingQueue, now: float) -> float:
        """The largest value of any waiting request at `now` (0 when all are dormant)."""
        self._catch_up(queue, now)
        self._value_batch(queue, now)
        groups, best = self._by_value, self._rising_best
        opened: dict[object, int] = {}
        current: set[object] = set()
        while groups.top_bound() > best:
            group = groups.pop()
            if self._made_current(groups, group, current, now):
                continue
            taken = self._open(groups, [group], opened, queue, now)
            best = max([best] + [self._valued[req][1] for req in taken])
        self._close(groups, opened)
        return best

    def ranked(
        self,
        queue: WaitingQueue,
        now: float,
        room: Room | None = None,
        first: Sequence[tuple[float, int, int]] = (),
    ) -> Generator[tuple[float, int], None, None]:
        """The waiting requests of positive value, as (density, request), best density first,
        ties in queue order. Close it when done: it puts back what it took.

        The knapsack's form: `first` (density, request, blocks) ranks requests from outside
        the queue with it, before waiting ones of equal density (ties: in their order), and
        the ranking ends once all of them are passed; while `room.blocks` is set, requests
        needing more blocks are passed over (groups of them unopened)."""
        self._catch_up(queue, now)
        self._value_batch(queue, now)
        need = self._need
        # keys: (-density, 0 for `first` / 1 for waiting, place in its order, request)
        rising = self._rising_rank
        outside = sorted((-d, 0, i, req) for i, (d, req, _) in enumerate(first))
        need_outside = {req: blocks for _, req, blocks in first}
        groups = self._by_density
        opened: dict[object, int] = {}
        current: set[object] = set()  # groups whose bound is as of `now` (`_made_current`)
        deferred: list[object] = []  # groups passed over for want of room
        pool: list[tuple[float, int, int, int]] = []  # opened groups' members, valued at `now`
        last: tuple[float, int, int, int] | None = None  # the last yielded
        ri = fi = 0
        try:
            while True:
                limit = room.blocks if room is not None else None
                if limit is None and deferred:  # room no longer rules: they come back
                    for group in deferred:
                        groups.set_bound(group, groups.bound[group])
                    deferred.clear()
                while ri < len(rising) and rising[ri][3] not in queue:
                    ri += 1
                if first and fi == len(outside):
                    return
                heads = rising[ri : ri + 1] + outside[fi : fi + 1]
                while True:  # open every group whose bound reaches the best known
                    while pool and last is not None and pool[0] <= last:
                        heapq.heappop(pool)  # a group back from deferral: ranked already
                    known = heads + pool[:1]
                    best = -min(known)[0] if known else 0.0
                    if not groups.top_bound() or groups.top_bound() < best:
                        break
                    group = groups.pop()
                    if limit is not None and group[1] > limit:  # type: ignore[index]
                        deferred.append(group)  # every member would be passed over now
                        continue
                    if self._made_current(groups, group, current, now):
                        continue
                    for req in self._open(groups, [group], opened, queue, now):
                        density = self._valued[req][2]
                        heapq.heappush(pool, (-density, 1, self._seq[req], req))
                known = heads + pool[:1]
                if not known:
                    return
                last = min(known)
                if pool and last is pool[0]:
                    heapq.heappop(pool)
                elif last[1] == 1:
                    ri += 1
                else:
                    fi += 1
                blocks = need[last[3]] if last[1] == 1 else need_outside[last[3]]
                if limit is None or blocks <= limit:
                    yield -last[0], last[3]
        finally:
            for group in deferred:
                groups.set_bound(group, groups.bound[group])
            self._close(groups, opened)

    def _made_current(
        self, groups: SettledGroups, group: object, current: set[object], now: float
    ) -> bool:
        """A group taken off the heap by a query at `now` whose bound is from an earlier time
        goes back under its bound as of `now` (True): its youngest member's value in closed
        form (`settled_value`, the formula's up to rounding), which bounds every member's.
        Groups are then opened in the order of what they are worth now, not of what they were
        worth when last valued: the first opened is mostly the one that wins, and fewer are
        opened (False: this one's bound is current, open it)."""
        if group in current:
            return False
        current.add(group)
        start = groups.members[group][-1][0]
        # groups by client (the best value), or by (client, KV blocks needed): bound per block
        client, need = cast(tuple[int, int], group if groups.field == 2 else (group, 1))
        bound = self._settled_value(start, client, now) / need * SLACK
        groups.set_bound(group, min(bound, groups.bound[group]))
        return True

    def _open(
        self,
        groups: SettledGroups,
        opening: list[object],
        opened: dict[object, int],
        queue: WaitingQueue,
        now: float,
    ) -> list[int]:
        """Value each group's next BATCH youngest live members at `now`, all in one call
        (dropping dead ones), and bound each group's older ones by the oldest of them.
        `opened`: how far each group opened in this query has been valued (its members from
        that index on). Returns the members valued."""
        taken: list[int] = []
        oldest: list[tuple[object, int]] = []  # each group with older members left
        for group in opening:
            members = groups.members[group]
            at, count = opened.get(group, len(members)), 0
            while at > 0 and count < BATCH:
                at -= 1
                _, _, req, version = members[at]
                if self._live(queue, req, version):
                    taken.append(req)
                    count += 1
                else:
                    del members[at]
            opened[group] = at
            if count and at > 0:
                oldest.append((group, taken[-1]))
        stale = [req for req in taken if self._valued[req][0] != now]
        if stale:
            self._value(stale, now)
        for group, req in oldest:  # the older members, for the rest of this query
            groups.set_bound(group, self._valued[req][groups.field] * SLACK)
        return taken

    def _close(self, groups: SettledGroups, opened: dict[object, int]) -> None:
        """After a query: each group it opened is bounded by its members valued in it (the
        youngest: every older one is worth less), or forgotten when none is left."""
        for group, at in opened.items():
            members = groups.members[group]
            if not members:
                groups.forget(group)
                continue
            valued = [self._valued[req][groups.field] for _, _, req, _ in members[at:]]
            groups.set_bound(group, max(valued) * SLACK)
