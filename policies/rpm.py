"""Per-client requests-per-minute limit: admission control at arrival, then FCFS.

A request is rejected (never served) when its client already has `limit` accepted requests that
arrived within the last `window` seconds (inclusive: now - t <= window). Rejected requests do not
count toward the window.
"""

from __future__ import annotations

from collections import deque

from policies.base import BasePolicy
from simulator.core.errors import ConfigError
from simulator.core.queue import WaitingQueue
from traces.schema import Trace


class RPM(BasePolicy):
    runs_live = True
    name = "rpm"

    def __init__(self, limit: int, window: float = 60.0) -> None:
        if int(limit) != limit or limit < 1:
            raise ConfigError(f"policy.limit must be an integer >= 1, got {limit!r}")
        if not window > 0:
            raise ConfigError(f"policy.window must be > 0 seconds, got {window!r}")
        self.limit, self.window = int(limit), float(window)

    def bind(self, trace: Trace) -> None:
        super().bind(trace)
        self.accepted: list[deque[float]] = [deque() for _ in range(trace.num_clients)]

    def on_arrival(self, req: int, now: float, queue: WaitingQueue) -> str | None:
        recent = self.accepted[int(self.trace.client[req])]
        while recent and now - recent[0] > self.window:
            recent.popleft()
        if len(recent) >= self.limit:
            return "rpm_limit"
        recent.append(now)
        return None

    def pick(self, queue: WaitingQueue, now: float) -> int | None:
        return queue.oldest()
