"""The waiting queue the engine owns: per-client FIFO lanes plus the global arrival order.

Requests are row indices of the trace. The global order is the order of `push` (the engine pushes
in arrival order), not the row index: in a chained trace a later row can arrive first.
Policies read it (`oldest`, `head`, `waiting_clients`) and the engine removes what it admits.
"""

from __future__ import annotations

import heapq
from collections import deque


class WaitingQueue:
    def __init__(self, client_of: list[int]) -> None:
        self._client_of = client_of
        self._lanes: dict[int, deque[int]] = {}
        self._heap: list[int] = []  # sequence numbers of waiting requests (and removed ones)
        self._request: dict[int, int] = {}  # sequence number -> request, while it waits
        self._seq: dict[int, int] = {}  # request -> its sequence number, while it waits
        self._back = 0  # next sequence number at the back (push)
        self._front = 0  # last sequence number used at the front (push_front), counting down
        self.last_left_client: int | None = None  # the client whose request last left the queue

    def __len__(self) -> int:
        return len(self._seq)

    def __contains__(self, req: int) -> bool:
        return req in self._seq

    def push(self, req: int) -> None:
        self._lanes.setdefault(self._client_of[req], deque()).append(req)
        self._enter(req, self._back)
        self._back += 1

    def push_front(self, req: int) -> None:
        """Put a request back at the head of its lane and of the global order (a preempted
        request in the vLLM-style engine)."""
        self._lanes.setdefault(self._client_of[req], deque()).appendleft(req)
        self._front -= 1
        self._enter(req, self._front)

    def _enter(self, req: int, seq: int) -> None:
        if req in self._seq:
            raise ValueError(f"request {req} is already waiting")
        heapq.heappush(self._heap, seq)
        self._request[seq] = req
        self._seq[req] = seq

    def oldest(self) -> int | None:
        """The earliest waiting request over all clients (FCFS order)."""
        heap = self._heap
        while heap and heap[0] not in self._request:
            heapq.heappop(heap)  # removed earlier
        return self._request[heap[0]] if heap else None

    def head(self, client: int) -> int | None:
        lane = self._lanes.get(client)
        return lane[0] if lane else None

    def has_waiting(self, client: int) -> bool:
        return bool(self._lanes.get(client))

    def in_order(self, limit: int | None = None) -> list[int]:
        """The waiting requests in queue order (FCFS): all, or the first `limit`."""
        seqs = sorted(self._request) if limit is None else heapq.nsmallest(limit, self._request)
        return [self._request[seq] for seq in seqs]

    def waiting_clients(self) -> list[int]:
        """Clients with at least one waiting request, in client-index order."""
        return sorted(c for c, lane in self._lanes.items() if lane)

    def remove(self, req: int) -> None:
        """Take a waiting request out: usually its client's head; a policy may take a later one
        (FairServe's interaction preference admits an interaction's next call)."""
        client = self._client_of[req]
        lane = self._lanes.get(client)
        if not lane:
            raise ValueError(f"request {req} is not waiting (client {client} has nothing waiting)")
        if lane[0] == req:
            lane.popleft()
        else:
            try:
                lane.remove(req)
            except ValueError:
                raise ValueError(
                    f"request {req} is not waiting in client {client}'s lane"
                ) from None
        del self._request[self._seq.pop(req)]
        self.last_left_client = client
