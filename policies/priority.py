"""Static priorities, vLLM's `--scheduling-policy priority`: each client has a priority (lower
is served first, default 0); waiting requests are admitted in (priority, arrival, row) order,
and a preempting engine evicts the running request with the largest (priority, arrival, row)."""

from __future__ import annotations

from collections.abc import Mapping

from policies.base import BasePolicy
from simulator.core.errors import ConfigError
from simulator.core.queue import WaitingQueue
from traces.schema import Trace


class Priority(BasePolicy):
    runs_live = True
    name = "priority"

    def __init__(self, priorities: Mapping[str, int] | None = None) -> None:
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

    def _key(self, req: int) -> tuple[int, float, int]:
        t = self.trace
        return (self.level[int(t.client[req])], float(t.arrival[req]), req)

    def pick(self, queue: WaitingQueue, now: float) -> int | None:
        """Each client's lane is in arrival order, so the best request heads some lane."""
        heads = [queue.head(c) for c in queue.waiting_clients()]
        return min((h for h in heads if h is not None), key=self._key, default=None)

    def victim(self, running: list[int]) -> int:
        return max(running, key=self._key)
