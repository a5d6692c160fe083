"""The waiting queue the engine owns: per-client FIFO lanes plus the global arrival order.

Requests are row indices of the trace. The global order is the order of `push` (the engine pushes
in arrival order), not the row index: in a chained trace a later row can arrive first.
Policies read it (`oldest`, `head`, `waiting_clients`) and the engine removes what it admits.

Both the global order and the lanes hold sequence numbers, and a request taken out from behind
a head leaves a hole (a number no longer waiting) instead of being searched for: a policy that
admits the newest requests first (Andes under overload) takes each out in amortised constant
time, not in time proportional to its lane (thousands long there).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from functools import partial
from itertools import islice
from operator import is_not
from typing import cast

# removed requests the global order may hold before it is rebuilt without them: a scan for the
# oldest `limit` waiting requests skips at most this many, and a rebuild costs a pass over the
# queue only once per this many removals
MAX_HOLES = 1024
_IS_REQUEST = partial(is_not, None)  # a sequence number still waiting maps to its request


class WaitingQueue:
    def __init__(self, client_of: list[int]) -> None:
        self._client_of = client_of
        # per client, its sequence numbers in ascending order, holes included (see _order)
        self._lanes: dict[int, deque[int]] = {}
        self._lane_holes: dict[int, int] = {}
        self._waiting: dict[int, int] = {}  # client -> its requests waiting
        # sequence numbers in ascending order: push appends a larger one, push_front prepends
        # a smaller one; removed requests leave holes (numbers no longer in _request)
        self._order: deque[int] = deque()
        self._holes = 0
        self._request: dict[int, int] = {}  # sequence number -> request, while it waits
        self._seq: dict[int, int] = {}  # request -> its sequence number, while it waits
        self._back = 0  # next sequence number at the back (push)
        self._front = 0  # last sequence number used at the front (push_front), counting down
        self.last_left_client: int | None = None  # the client whose request last left the queue
        # how often the front could have changed (a request put back at the front, or one
        # taken out) and how many were pushed at the back: while both stand, so do the oldest
        # N waiting requests, and while the first stands and N were waiting, pushes leave them
        self.front_changes = 0
        self.pushed = 0

    def __len__(self) -> int:
        return len(self._seq)

    def __contains__(self, req: int) -> bool:
        return req in self._seq

    def push(self, req: int) -> None:
        self._enter(req, self._back)
        self._back += 1
        self.pushed += 1

    def push_front(self, req: int) -> None:
        """Put a request back at the head of its lane and of the global order (a preempted
        request in the vLLM-style engine)."""
        self._front -= 1
        self._enter(req, self._front)
        self.front_changes += 1

    def _enter(self, req: int, seq: int) -> None:
        if req in self._seq:
            raise ValueError(f"request {req} is already waiting")
        client = self._client_of[req]
        lane = self._lanes.get(client)
        if lane is None:
            lane = self._lanes[client] = deque()
            self._lane_holes[client] = 0
        if seq < 0:
            self._order.appendleft(seq)
            lane.appendleft(seq)
        else:
            self._order.append(seq)
            lane.append(seq)
        self._waiting[client] = self._waiting.get(client, 0) + 1
        self._request[seq] = req
        self._seq[req] = seq

    def oldest(self) -> int | None:
        """The earliest waiting request over all clients (FCFS order)."""
        self._drop_leading_holes()
        return self._request[self._order[0]] if self._order else None

    def _drop_leading_holes(self) -> None:
        order = self._order
        while order and order[0] not in self._request:
            order.popleft()
            self._holes -= 1

    def head(self, client: int) -> int | None:
        """The client's earliest waiting request."""
        if not self._waiting.get(client):
            return None
        lane, request = self._lanes[client], self._request
        while lane[0] not in request:  # a hole: the lane's head left from behind another
            lane.popleft()
            self._lane_holes[client] -= 1
        return request[lane[0]]

    def earliest_head(self, clients: list[int]) -> int | None:
        """Of these clients' waiting requests, the one queued first (a lane is in queue order,
        so it is one of their heads)."""
        heads = [h for c in clients if (h := self.head(c)) is not None]
        return min(heads, key=self._seq.__getitem__) if heads else None

    def sequence(self, req: int) -> int:
        """A waiting request's place in queue order: smaller is earlier (an index keeping the
        queue's ties, as Andes's does)."""
        return self._seq[req]

    def has_waiting(self, client: int) -> bool:
        return bool(self._waiting.get(client))

    def in_order(self, limit: int | None = None) -> list[int]:
        """The waiting requests in queue order (FCFS): all, or the first `limit` (in time
        proportional to `limit`, not to the queue: LPM asks for the oldest 128 at every pick)."""
        self._drop_leading_holes()
        # iterators all the way down, no Python-level loop: 128 requests in 4 us, not 26
        # (LPM and DLPM list the oldest 128 at every re-ranking: benchmarks/policy_overload.py)
        got = map(self._request.get, self._order)
        waiting = cast(Iterator[int], filter(_IS_REQUEST, got))  # the Nones are filtered out
        return list(waiting if limit is None else islice(waiting, limit))

    def waiting_clients(self) -> list[int]:
        """Clients with at least one waiting request, in client-index order."""
        return sorted(c for c, n in self._waiting.items() if n)

    def remove(self, req: int) -> None:
        """Take a waiting request out: usually its client's head; a policy may take a later one
        (FairServe's interaction preference, Andes's most valuable)."""
        seq = self._seq.pop(req, None)
        if seq is None:
            raise ValueError(f"request {req} is not waiting")
        del self._request[seq]
        client = self._client_of[req]
        self._waiting[client] -= 1
        lane = self._lanes[client]
        if lane[0] == seq:
            lane.popleft()
        else:  # a hole, until the lane is rebuilt or its earlier requests leave
            holes = self._lane_holes[client] + 1
            if holes > MAX_HOLES:
                self._lanes[client] = deque(n for n in lane if n in self._request)
                holes = 0
            self._lane_holes[client] = holes
        self.last_left_client = client
        self.front_changes += 1
        self._holes += 1
        if self._holes > MAX_HOLES:
            self._order = deque(seq for seq in self._order if seq in self._request)
            self._holes = 0
