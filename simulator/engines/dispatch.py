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
  distributed direction (its appendix C.3);
- d2lpm: Double Deficit LPM (Cao et al. 2025, the distributed DLPM; `D2LPM` below), for
  engine=vllm: locality among the replicas whose load deficit is in credit, with each replica
  running its own policy (policy=dlpm: the second deficit, per client).

A dispatcher that decides from the request alone (`static`) lets the runner assign an open-loop
trace up front, so each replica runs alone at full speed. To add one: a class here, its name in
DISPATCHERS, and a line in the `cluster` block's comment in conf/config.yaml.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from simulator.core.errors import ConfigError
from simulator.core.seam import CounterPolicy, Policy
from simulator.engines.disaggregation import DisaggregationConfig
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


class D2LPM(Dispatcher):
    """Double Deficit LPM's dispatcher. Each replica holds a load deficit, starting at 0: a
    request goes to the replica with the longest match for its prompt in its prefix cache
    (ties: the most credit, then the lowest index) among replicas in credit, and the replica's
    deficit is charged the work it brings (prompt tokens not cached there plus output tokens,
    which a router knows from max_tokens); when no replica is in credit, all are refilled by
    `quantum` (as many rounds as the least indebted needs). So load stays within a quantum or
    so of even while requests sharing a prefix follow their cache. Fairness between clients is
    each replica's policy's (policy=dlpm: per-client deficits, the second deficit).

    Where I had to choose: the work charged (computed prompt plus output tokens, unweighted);
    the quantum (16,384 tokens, a few long requests; on the prefix-heavy mix with two replicas,
    4,096 to 65,536 all gave a mean per-client E2E of 113-118 s with policy=dlpm, against
    138 s for round robin and VTC); the match is looked up in each replica's block cache when
    the request arrives."""

    quantum: ClassVar[float] = 16384.0

    def __init__(self, replicas: int, client_of: list[int]) -> None:
        super().__init__(replicas, client_of)
        self.credit = [0.0] * replicas

    def route(self, req: int, replicas: list[StepModel]) -> int:
        cached = [getattr(model, "cached_tokens_now", None) for model in replicas]
        if any(lookup is None for lookup in cached):
            raise ConfigError("cluster.dispatcher=d2lpm needs engine=vllm (its prefix caches)")
        if max(self.credit) <= 0:
            rounds = min(int(-c // self.quantum) + 1 for c in self.credit)
            self.credit = [c + rounds * self.quantum for c in self.credit]
        matches = [lookup(req) for lookup in cached]  # type: ignore[misc]
        eligible = [k for k in range(self.n) if self.credit[k] > 0]
        best = max(eligible, key=lambda k: (matches[k], self.credit[k], -k))
        work = replicas[best].remaining_tokens(req) - matches[best]
        self.credit[best] -= work
        return best


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
    "d2lpm": D2LPM,
}


@dataclass(frozen=True)
class ClusterConfig:
    replicas: int = 1
    dispatcher: str = "round_robin"
    # processes that simulate the replicas of a static dispatcher at once in an offline run
    # (same timeline as one process): a number, or "auto" for one per CPU this process may use
    processes: int | str = 1
    # prefill/decode disaggregation (simulator/engines/disaggregation.py): prefill_replicas > 0
    # runs a prefill pool and a decode pool of decode_replicas instead of `replicas`
    prefill_replicas: int = 0
    decode_replicas: int = 0
    disaggregation: DisaggregationConfig | Mapping[str, Any] = field(
        default_factory=DisaggregationConfig
    )

    def __post_init__(self) -> None:
        if int(self.replicas) != self.replicas or self.replicas < 1:
            raise ConfigError(f"cluster.replicas must be an integer >= 1, got {self.replicas!r}")
        self._check_pools()
        p = self.processes
        if p != "auto" and (isinstance(p, bool) or not isinstance(p, int) or p < 1):
            raise ConfigError(f"cluster.processes must be an integer >= 1 or auto, got {p!r}")
        if self.dispatcher not in DISPATCHERS:
            raise ConfigError(
                f"cluster.dispatcher must be one of {tuple(DISPATCHERS)}, got {self.dispatcher!r}"
            )

    def _check_pools(self) -> None:
        for key in ("prefill_replicas", "decode_replicas"):
            v = getattr(self, key)
            if isinstance(v, bool) or int(v) != v or v < 0:
                raise ConfigError(f"cluster.{key} must be an integer >= 0, got {v!r}")
        pd = self.disaggregation
        if isinstance(pd, Mapping):
            accepted = {f.name for f in fields(DisaggregationConfig)}
            unknown = sorted(set(pd) - accepted)
            if unknown:
                raise ConfigError(
                    f"cluster.disaggregation: unknown key(s) {unknown}; "
                    f"accepted: {sorted(accepted)}"
                )
            object.__setattr__(self, "disaggregation", DisaggregationConfig(**pd))
        if not self.prefill_replicas:
            if self.decode_replicas:
                raise ConfigError(
                    "cluster.decode_replicas is set but cluster.prefill_replicas is 0: give both "
                    "(disaggregated pools) or neither (cluster.replicas co-located replicas)"
                )
            return
        if self.decode_replicas < 1:
            raise ConfigError("cluster.prefill_replicas > 0 needs cluster.decode_replicas >= 1")
        if self.replicas not in (1, self.prefill_replicas + self.decode_replicas):
            raise ConfigError(
                f"cluster.replicas={self.replicas} with disaggregated pools: leave it at 1 (the "
                "pools' sizes are cluster.prefill_replicas and cluster.decode_replicas)"
            )
        object.__setattr__(self, "replicas", self.prefill_replicas + self.decode_replicas)
        assert isinstance(self.disaggregation, DisaggregationConfig)
        for pool in ("prefill", "decode"):
            name = getattr(self.disaggregation, f"{pool}_dispatcher")
            routed = [k for k, d in DISPATCHERS.items() if not d.shared]
            if name not in routed:
                raise ConfigError(
                    f"cluster.disaggregation.{pool}_dispatcher must be one of {tuple(routed)}, "
                    f"got {name!r} (pools route each request; counters: shared shares a policy)"
                )

    @property
    def disaggregated(self) -> bool:
        """A prefill pool and a decode pool instead of co-located replicas."""
        return self.prefill_replicas > 0

    @property
    def process_count(self) -> int:
        if self.processes == "auto":
            if hasattr(os, "sched_getaffinity"):
                return len(os.sched_getaffinity(0))
            return os.cpu_count() or 1
        return int(self.processes)

    def make_dispatcher(self, client_of: list[int]) -> Dispatcher:
        return DISPATCHERS[self.dispatcher](self.replicas, client_of)
