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
  running its own policy (policy=dlpm: the second deficit, per client);
- scored: an inference gateway's endpoint picker (llm-d's): a weighted sum of scorers over the
  replicas, the replica-reported ones read from snapshots scraped every `scrape_interval` and
  seen `delay` later (`Scored` below; `cluster.routing`).

A dispatcher that decides from the request alone (`static`) lets the runner assign an open-loop
trace up front, so each replica runs alone at full speed. To add one: a class here, its name in
DISPATCHERS, and a line in the `cluster` block's comment in conf/config.yaml.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import numpy as np

from simulator.core.errors import ConfigError
from simulator.core.seam import CounterPolicy, Policy
from simulator.engines.autoscaler import AutoscalerConfig
from simulator.engines.disaggregation import DisaggregationConfig
from simulator.engines.gateway import GatewayConfig
from simulator.engines.step_model import StepModel


class Dispatcher:
    static: ClassVar[bool] = False  # the choice depends on the request only
    shared: ClassVar[bool] = False  # one queue and one policy for every replica
    tracks_load: ClassVar[bool] = False  # wants to hear when a routed request ends
    # routing reads the replicas' state (not only the request and its own books): a run of
    # decode steps must then end at every arrival (simulator/engines/runner.py, `cuts_runs`)
    reads_replicas: ClassVar[bool] = True
    interval = 0.0  # seconds between the snapshots `scrape` takes (`scrapes`)

    def __init__(self, replicas: int, client_of: list[int]) -> None:
        self.n, self.client_of = replicas, client_of
        # which replicas may take requests now (an elastic fleet's ready ones; None: all)
        self.available: list[bool] | None = None

    def candidates(self) -> list[int]:
        """The replicas a request may go to now, in index order."""
        if self.available is None:
            return list(range(self.n))
        return [k for k in range(self.n) if self.available[k]]

    def check(self, policy: Policy) -> None:
        """Refuse a policy this dispatcher cannot work with (a clear error before the run)."""

    def route(self, req: int, replicas: list[StepModel], now: float = 0.0) -> int:
        """The replica `req` goes to, arriving at `now` (shared dispatchers are never asked)."""
        raise NotImplementedError

    def released(self, req: int, replica: int) -> None:
        """`req`, routed to `replica`, ended (finished, rejected or refused)."""

    def see_trace(self, trace: Any) -> None:
        """The run's trace, before any arrival (a dispatcher that reads prompts uses it)."""

    @property
    def scrapes(self) -> bool:
        """Whether it wants `scrape` called every `interval` seconds of simulated time."""
        return False

    def scrape(self, replicas: list[StepModel], now: float) -> None:
        """Take a snapshot of what the replicas report (a dispatcher with stale signals)."""


class RoundRobin(Dispatcher):
    static = True
    reads_replicas = False

    def __init__(self, replicas: int, client_of: list[int]) -> None:
        super().__init__(replicas, client_of)
        self._next = 0

    def route(self, req: int, replicas: list[StepModel], now: float = 0.0) -> int:
        i = self._next % self.n
        self._next += 1
        while self.available is not None and not self.available[i]:  # one is always ready
            i = self._next % self.n
            self._next += 1
        return i


class ClientAffinity(Dispatcher):
    static = True
    reads_replicas = False

    def route(self, req: int, replicas: list[StepModel], now: float = 0.0) -> int:
        if self.available is None:
            return self.client_of[req] % self.n
        ready = self.candidates()  # an elastic fleet: the client's place among the ready ones
        return ready[self.client_of[req] % len(ready)]


class LeastRequests(Dispatcher):
    tracks_load = True
    reads_replicas = False  # its own count of what it routed and has not ended

    def __init__(self, replicas: int, client_of: list[int]) -> None:
        super().__init__(replicas, client_of)
        self.outstanding: list[set[int]] = [set() for _ in range(replicas)]

    def route(self, req: int, replicas: list[StepModel], now: float = 0.0) -> int:
        i = min(self.candidates(), key=lambda k: (self.load(k, replicas), k))
        self.outstanding[i].add(req)
        return i

    def load(self, replica: int, replicas: list[StepModel]) -> int:
        return len(self.outstanding[replica])

    def released(self, req: int, replica: int) -> None:
        if replica >= 0:
            self.outstanding[replica].discard(req)


class LeastTokens(LeastRequests):
    reads_replicas = True  # each routed request's tokens left

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

    def route(self, req: int, replicas: list[StepModel], now: float = 0.0) -> int:
        cached = [getattr(model, "cached_tokens_now", None) for model in replicas]
        if any(lookup is None for lookup in cached):
            raise ConfigError("cluster.dispatcher=d2lpm needs engine=vllm (its prefix caches)")
        ready = self.candidates()  # (an elastic fleet: the ready ones)
        if max(self.credit[k] for k in ready) <= 0:
            rounds = min(int(-self.credit[k] // self.quantum) + 1 for k in ready)
            self.credit = [c + rounds * self.quantum for c in self.credit]
        matches = [lookup(req) for lookup in cached]  # type: ignore[misc]
        eligible = [k for k in ready if self.credit[k] > 0]
        best = max(eligible, key=lambda k: (matches[k], self.credit[k], -k))
        work = replicas[best].remaining_tokens(req) - matches[best]
        self.credit[best] -= work
        return best


SCORERS = ("queue_depth", "kv_utilization", "running_requests", "in_flight_tokens", "prefix_match")
SCRAPED = ("queue_depth", "kv_utilization")  # what the replicas report (vLLM's /metrics)


@dataclass(frozen=True)
class RoutingConfig:
    """`cluster.routing`: the scored dispatcher's scorers (name -> weight) and how fresh the
    replica-reported signals are: read at the instant of routing (`scrape_interval` 0), or
    from snapshots taken every `scrape_interval` seconds and seen `delay` seconds later."""

    scorers: Mapping[str, float] = field(
        default_factory=lambda: {"queue_depth": 1.0, "kv_utilization": 1.0, "prefix_match": 1.0}
    )
    scrape_interval: float = 0.0
    delay: float = 0.0

    def __post_init__(self) -> None:
        key = "cluster.routing"
        if not isinstance(self.scorers, Mapping) or not self.scorers:
            raise ConfigError(f"{key}.scorers must map scorer names to weights; one of {SCORERS}")
        unknown = sorted(set(self.scorers) - set(SCORERS))
        if unknown:
            raise ConfigError(f"{key}.scorers: unknown scorer(s) {unknown}; accepted: {SCORERS}")
        for name, w in self.scorers.items():
            if (
                isinstance(w, bool)
                or not isinstance(w, int | float)
                or not (math.isfinite(w) and w >= 0)
            ):
                raise ConfigError(f"{key}.scorers.{name} must be a weight >= 0, got {w!r}")
        if sum(self.scorers.values()) <= 0:
            raise ConfigError(f"{key}.scorers: the weights sum to 0; give one a weight > 0")
        for name in ("scrape_interval", "delay"):
            v = getattr(self, name)
            if (
                isinstance(v, bool)
                or not isinstance(v, int | float)
                or not (math.isfinite(v) and v >= 0)
            ):
                raise ConfigError(f"{key}.{name} must be a number of seconds >= 0, got {v!r}")
        if self.delay > 0 and self.scrape_interval == 0:
            raise ConfigError(
                f"{key}.delay needs {key}.scrape_interval > 0 (signals read at the instant of "
                "routing have no delay)"
            )


def inverse_load(load: np.ndarray) -> np.ndarray:
    """A load scorer: 1 - load / the largest load (1 everywhere when all are 0), so the least
    loaded replica scores highest and equal loads score equal."""
    top = load.max()
    return 1.0 - load / top if top > 0 else np.ones_like(load)


class Scored(Dispatcher):
    """An inference gateway's endpoint picker (llm-d's, the Gateway API inference extension's):
    each request goes to the replica with the highest weighted sum of scores in [0, 1] (ties:
    the lowest index). Scorers:
    - queue_depth, kv_utilization: what each replica reports (waiting requests; KV in use over
      its pool), read at the instant of routing, or, with `scrape_interval` > 0, from the last
      snapshot taken on that interval that is at least `delay` old (none yet: all equal);
    - running_requests, in_flight_tokens: the gateway's own count of the requests it routed to
      each replica and not yet ended, and of their tokens still to process (alone, each picks
      as least_requests and least_tokens do, bit for bit);
    - prefix_match: the share of the request's prompt blocks (the trace's hash ids) that the
      gateway last routed to that replica, remembered per replica as an LRU index as large as
      the replica's KV pool (llm-d's approximate prefix scorer)."""

    tracks_load = True

    def __init__(self, replicas: int, client_of: list[int], routing: RoutingConfig) -> None:
        super().__init__(replicas, client_of)
        self.weights = [(name, float(routing.scorers[name])) for name in SCORERS
                        if routing.scorers.get(name, 0) > 0]  # fmt: skip
        self.interval, self.delay = float(routing.scrape_interval), float(routing.delay)
        self.outstanding: list[set[int]] = [set() for _ in range(replicas)]
        self.seen = np.zeros((replicas, len(SCRAPED)))  # the snapshot the picker reads
        self.taken: deque[tuple[float, np.ndarray]] = deque()  # (seen from, snapshot)
        self.hashes: list[np.ndarray] | None = None
        self.hash_block = 1
        self.index: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(replicas)]

    def see_trace(self, trace: Any) -> None:
        """The trace's prompt block ids, for the prefix scorer."""
        self.hashes = trace.block_hashes
        self.hash_block = int(trace.hash_block_tokens)

    @property
    def scrapes(self) -> bool:
        return self.interval > 0 and any(name in SCRAPED for name, _ in self.weights)

    @property
    def reads_replicas(self) -> bool:  # type: ignore[override]
        """Reports read at the instant of routing, or each routed request's tokens left."""
        instant = self.interval == 0 and any(name in SCRAPED for name, _ in self.weights)
        return instant or any(name == "in_flight_tokens" for name, _ in self.weights)

    def scrape(self, replicas: list[StepModel], now: float) -> None:
        """Take a snapshot of the replicas' reports; the picker sees it `delay` later."""
        self.taken.append((now + self.delay, reported(replicas)))

    def route(self, req: int, replicas: list[StepModel], now: float = 0.0) -> int:
        if any(name in SCRAPED for name, _ in self.weights):
            if self.interval == 0:
                self.seen = reported(replicas)
            while self.taken and self.taken[0][0] <= now:
                self.seen = self.taken.popleft()[1]
        total = np.zeros(self.n)
        for name, weight in self.weights:
            total += weight * self._score(name, req, replicas)
        if self.available is not None:
            total[~np.array(self.available)] = -np.inf
        best = int(np.argmax(total))  # the first of equal scores: the lowest index
        self.outstanding[best].add(req)
        self._remember(req, best, replicas[best])
        return best

    def _score(self, name: str, req: int, replicas: list[StepModel]) -> np.ndarray:
        if name == "queue_depth":
            return inverse_load(self.seen[:, 0])
        if name == "kv_utilization":
            return 1.0 - self.seen[:, 1]
        if name == "running_requests":
            return inverse_load(np.array([len(o) for o in self.outstanding], dtype=float))
        if name == "in_flight_tokens":
            tokens = [sum(rep.remaining_tokens(r) for r in o)
                      for rep, o in zip(replicas, self.outstanding, strict=True)]  # fmt: skip
            return inverse_load(np.array(tokens, dtype=float))
        ids = [] if self.hashes is None else self.hashes[req].tolist()
        if not ids:
            return np.zeros(self.n)
        matched = np.zeros(self.n)
        for k, index in enumerate(self.index):
            for i in ids:
                if i not in index:
                    break
                matched[k] += 1
        return matched / len(ids)

    def _remember(self, req: int, replica: int, rep: StepModel) -> None:
        if self.hashes is None or not any(name == "prefix_match" for name, _ in self.weights):
            return
        index = self.index[replica]
        for i in self.hashes[req].tolist():
            index[i] = None
            index.move_to_end(i)
        capacity = max(1, rep.pool_tokens // self.hash_block)
        while len(index) > capacity:
            index.popitem(last=False)

    def released(self, req: int, replica: int) -> None:
        if replica >= 0:
            self.outstanding[replica].discard(req)


def reported(replicas: list[StepModel]) -> np.ndarray:
    """What each replica reports now: (waiting requests, KV in use over its pool after its
    last step; the blocks a step in flight took at its start count once it has ended)."""
    return np.array(
        [[len(rep.queue), rep.steps.last_kv / rep.pool_tokens] for rep in replicas], dtype=float
    )


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
    "scored": Scored,  # takes the routing config too (make_dispatcher)
}


def make_dispatcher(
    name: str, replicas: int, client_of: list[int], routing: RoutingConfig
) -> Dispatcher:
    """The dispatcher `name` for `replicas` replicas (the scored one with `routing`)."""
    if name == "scored":
        return Scored(replicas, client_of, routing)
    return DISPATCHERS[name](replicas, client_of)


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
    # the scored dispatcher's scorers and signal freshness (`RoutingConfig`)
    routing: RoutingConfig | Mapping[str, Any] = field(default_factory=RoutingConfig)
    # the gateway in front of the replicas (simulator/engines/gateway.py; the `gateway:` block)
    gateway: GatewayConfig | None = None
    # an elastic fleet (simulator/engines/autoscaler.py): `replicas` at the start, then as the
    # autoscaler decides, between its min_replicas and max_replicas
    autoscaler: AutoscalerConfig | Mapping[str, Any] = field(default_factory=AutoscalerConfig)

    def __post_init__(self) -> None:
        if int(self.replicas) != self.replicas or self.replicas < 1:
            raise ConfigError(f"cluster.replicas must be an integer >= 1, got {self.replicas!r}")
        self._check_pools()
        if isinstance(self.routing, Mapping):
            accepted = {f.name for f in fields(RoutingConfig)}
            unknown = sorted(set(self.routing) - accepted)
            if unknown:
                raise ConfigError(
                    f"cluster.routing: unknown key(s) {unknown}; accepted: {sorted(accepted)}"
                )
            object.__setattr__(self, "routing", RoutingConfig(**self.routing))
        if self.gateway is not None and self.gateway.active and self.disaggregated:
            raise ConfigError(
                "the gateway's admission and flow control run in front of co-located replicas "
                "only: leave gateway.admission.type=always and gateway.flow_control.enabled=false "
                "with cluster.prefill_replicas"
            )
        p = self.processes
        if p != "auto" and (isinstance(p, bool) or not isinstance(p, int) or p < 1):
            raise ConfigError(f"cluster.processes must be an integer >= 1 or auto, got {p!r}")
        if self.dispatcher not in DISPATCHERS:
            raise ConfigError(
                f"cluster.dispatcher must be one of {tuple(DISPATCHERS)}, got {self.dispatcher!r}"
            )
        self._check_autoscaler()

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

    def _check_autoscaler(self) -> None:
        a = self.autoscaler
        if isinstance(a, Mapping):
            accepted = sorted(f.name for f in fields(AutoscalerConfig))
            unknown = sorted(set(a) - set(accepted))
            if unknown:
                raise ConfigError(
                    f"cluster.autoscaler: unknown key(s) {unknown}; accepted: {accepted}"
                )
            a = AutoscalerConfig(**a)
            object.__setattr__(self, "autoscaler", a)
        assert isinstance(a, AutoscalerConfig)
        if not a.enabled:
            return
        if not a.min_replicas <= self.replicas <= a.max_replicas:
            raise ConfigError(
                f"cluster.replicas={self.replicas} (the fleet at the start) must be within "
                f"cluster.autoscaler.min_replicas={a.min_replicas} and "
                f"max_replicas={a.max_replicas}"
            )
        if self.disaggregated:
            raise ConfigError(
                "cluster.autoscaler scales co-located replicas only: leave it disabled with "
                "cluster.prefill_replicas"
            )
        if DISPATCHERS[self.dispatcher].shared:
            raise ConfigError(
                f"cluster.autoscaler needs a dispatcher that routes each request (the replicas "
                f"leaving must stop taking work), not cluster.dispatcher={self.dispatcher}; "
                "for one set of counters across the fleet use the gateway's flow control "
                "(gateway.flow_control.fairness=vtc)"
            )

    @property
    def elastic(self) -> bool:
        """An autoscaler adds and removes replicas."""
        return isinstance(self.autoscaler, AutoscalerConfig) and self.autoscaler.enabled

    @property
    def fleet_size(self) -> int:
        """Replicas built for the run: all that may ever serve."""
        if self.elastic:
            assert isinstance(self.autoscaler, AutoscalerConfig)
            return self.autoscaler.max_replicas
        return self.replicas

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
        assert isinstance(self.routing, RoutingConfig)
        return make_dispatcher(self.dispatcher, self.fleet_size, client_of, self.routing)
