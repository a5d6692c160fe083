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
        self._heap: list[int] = []  # push sequence numbers
        self._pushed: list[int] = []  # request of each sequence number
        self._removed: set[int] = set()
        self._size = 0
        self.last_left_client: int | None = None  # the client whose request last left the queue

    def __len__(self) -> int:
        return self._size

    def push(self, req: int) -> None:
        self._lanes.setdefault(self._client_of[req], deque()).append(req)
        heapq.heappush(self._heap, len(self._pushed))
        self._pushed.append(req)
        self._size += 1

    def oldest(self) -> int | None:
        """The earliest waiting request over all clients (FCFS order)."""
        heap, pushed = self._heap, self._pushed
        while heap and pushed[heap[0]] in self._removed:
            self._removed.discard(pushed[heapq.heappop(heap)])
        return pushed[heap[0]] if heap else None

    def head(self, client: int) -> int | None:
        lane = self._lanes.get(client)
        return lane[0] if lane else None

    def has_waiting(self, client: int) -> bool:
        return bool(self._lanes.get(client))

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
        self._removed.add(req)
        self._size -= 1
        self.last_left_client = client
