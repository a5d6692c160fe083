"""Static priorities, vLLM's `--scheduling-policy priority`: each client has a priority (lower
is served first, default 0); waiting requests are admitted in (priority, arrival, row) order,
and a preempting engine evicts the running request with the largest (priority, arrival, row).
With `by_slo_class`, each request's priority is its SLO class's instead (critical first, then
standard, sheddable, batch, background: the gateway's classes, `gateway.classes` or the
workload's)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from policies.base import BasePolicy
from simulator.core.errors import ConfigError
from simulator.core.queue import WaitingQueue
from traces.schema import SLO_CLASSES, SLO_PRIORITY, Trace


class Priority(BasePolicy):
    runs_live = True
    name = "priority"

    def __init__(
        self, priorities: Mapping[str, int] | None = None, by_slo_class: bool = False
    ) -> None:
        if not isinstance(by_slo_class, bool):
            raise ConfigError(f"policy.by_slo_class must be true or false, got {by_slo_class!r}")
        if by_slo_class and priorities:
            raise ConfigError("policy.priorities and policy.by_slo_class=true: give one of them")
        self.by_slo_class = by_slo_class
        self.priorities = dict(priorities or {})
        for name, p in self.priorities.items():
            if int(p) != p:
                raise ConfigError(f"policy.priorities[{name}] must be an integer, got {p!r}")

    def bind(self, trace: Trace) -> None:
        super().bind(trace)
        unknown = set(self.priorities) - set(trace.client_names)
        if unknown:
            raise ConfigError(
                f"policy.priorities: unknown client {sorted(unknown)[0]!r}; clients are "
                f"{list(trace.client_names)}"
            )
        self.level = [int(self.priorities.get(c, 0)) for c in trace.client_names]
        self.per_request: list[int] | None = None  # by SLO class: each request's
        self.lanes_ordered = True  # each client's lane is in priority order
        if self.by_slo_class:
            if trace.slo_class is None:
                raise ConfigError(
                    "policy.by_slo_class=true needs SLO classes: gateway.classes, or a workload "
                    "with an slo_class column"
                )
            rank = np.array([-SLO_PRIORITY[c] for c in SLO_CLASSES])
            self.per_request = rank[trace.slo_class].tolist()
            for c in range(trace.num_clients):
                if np.unique(rank[trace.slo_class[trace.client == c]]).size > 1:
                    self.lanes_ordered = False

    def _key(self, req: int) -> tuple[int, float, int]:
        t = self.trace
        if self.per_request is not None:
            return (self.per_request[req], float(t.arrival[req]), req)
        return (self.level[int(t.client[req])], float(t.arrival[req]), req)

    def pick(self, queue: WaitingQueue, now: float) -> int | None:
        """Each client's lane is in arrival order, so when its requests share one priority the
        best request heads some lane; otherwise (classes per request) the whole queue is read."""
        if not self.lanes_ordered:
            return min(queue.in_order(), key=self._key, default=None)
        heads = [queue.head(c) for c in queue.waiting_clients()]
        return min((h for h in heads if h is not None), key=self._key, default=None)

    def victim(self, running: list[int]) -> int:
        return max(running, key=self._key)
