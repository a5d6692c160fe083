"""Dispatchers: which replica of a cluster an arriving request goes to (`cluster.dispatcher`).

- round_robin: the i-th arrival goes to replica i mod N;
- client_affinity: every request of client c goes to replica c mod N (clients in trace order);
- least_requests: the replica holding the fewest unfinished requests (ties: lowest index);
- least_tokens: the replica with the fewest tokens still to process, prompt tokens not yet
  computed plus output tokens not yet generated (a router knows each request's max_tokens; the
  output length stands in for it);
- central: no routing; one waiting queue and one policy shared by all replicas, each pulling
  from it when it has room;
- global_vtc: `central` under a policy with per-client counters (vtc, weighted vtc, lcf, drr,
  fairserve): one set of counters charged by every replica's service, the VTC paper's
  distributed direction (its appendix C.3).

A dispatcher that decides from the request alone (`static`) lets the runner assign an open-loop
trace up front, so each replica runs alone at full speed. To add one: a class here, its name in
DISPATCHERS, and a line in the `cluster` block's comment in conf/config.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from simulator.core.errors import ConfigError
from simulator.core.seam import CounterPolicy, Policy
from simulator.engines.step_model import StepModel


class Dispatcher:
    static: ClassVar[bool] = False  # the choice depends on the request only
    shared: ClassVar[bool] = False  # one queue and one policy for every replica
    tracks_load: ClassVar[bool] = False  # wants to hear when a routed request ends

    def __init__(self, replicas: int, client_of: list[int]) -> None:
        self.n, self.client_of = replicas, client_of

    def check(self, policy: Policy) -> None:
        """Refuse a policy this dispatcher cannot work with (a clear error before the run)."""

    def route(self, req: int, replicas: list[StepModel]) -> int:
        """The replica `req` goes to (shared dispatchers are never asked)."""
        raise NotImplementedError

    def released(self, req: int, replica: int) -> None:
        """`req`, routed to `replica`, ended (finished, rejected or refused)."""


class RoundRobin(Dispatcher):
    static = True

    def __init__(self, replicas: int, client_of: list[int]) -> None:
        super().__init__(replicas, client_of)
        self._next = 0

    def route(self, req: int, replicas: list[StepModel]) -> int:
        i = self._next % self.n
        self._next += 1
        return i


class ClientAffinity(Dispatcher):
    static = True

    def route(self, req: int, replicas: list[StepModel]) -> int:
        return self.client_of[req] % self.n


class LeastRequests(Dispatcher):
    tracks_load = True

    def __init__(self, replicas: int, client_of: list[int]) -> None:
        super().__init__(replicas, client_of)
        self.outstanding: list[set[int]] = [set() for _ in range(replicas)]

    def route(self, req: int, replicas: list[StepModel]) -> int:
        i = min(range(self.n), key=lambda k: (self.load(k, replicas), k))
        self.outstanding[i].add(req)
        return i

    def load(self, replica: int, replicas: list[StepModel]) -> int:
        return len(self.outstanding[replica])

    def released(self, req: int, replica: int) -> None:
        if replica >= 0:
            self.outstanding[replica].discard(req)


class LeastTokens(LeastRequests):
    def load(self, replica: int, replicas: list[StepModel]) -> int:
        model = replicas[replica]
        return sum(model.remaining_tokens(r) for r in self.outstanding[replica])


class Central(Dispatcher):
    shared = True


class GlobalVTC(Central):
    def check(self, policy: Policy) -> None:
        if not isinstance(policy, CounterPolicy):
            raise ConfigError(
                f"cluster.dispatcher=global_vtc needs a policy with per-client counters (vtc, "
                f"lcf, drr, fairserve, ...), got policy {policy.name!r}; dispatcher=central "
                "shares any policy"
            )


DISPATCHERS: dict[str, type[Dispatcher]] = {
    "round_robin": RoundRobin,
    "client_affinity": ClientAffinity,
    "least_requests": LeastRequests,
    "least_tokens": LeastTokens,
    "central": Central,
    "global_vtc": GlobalVTC,
}


@dataclass(frozen=True)
class ClusterConfig:
    replicas: int = 1
    dispatcher: str = "round_robin"

    def __post_init__(self) -> None:
        if int(self.replicas) != self.replicas or self.replicas < 1:
            raise ConfigError(f"cluster.replicas must be an integer >= 1, got {self.replicas!r}")
        if self.dispatcher not in DISPATCHERS:
            raise ConfigError(
                f"cluster.dispatcher must be one of {tuple(DISPATCHERS)}, got {self.dispatcher!r}"
            )

    def make_dispatcher(self, client_of: list[int]) -> Dispatcher:
        return DISPATCHERS[self.dispatcher](self.replicas, client_of)
