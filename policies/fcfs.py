"""First come, first served: admit in arrival order, stop at the first request that does not fit."""

from __future__ import annotations

from policies.base import BasePolicy
from simulator.core.queue import WaitingQueue


class FCFS(BasePolicy):
    runs_live = True
    name = "fcfs"

    def pick(self, queue: WaitingQueue, now: float) -> int | None:
        return queue.oldest()
