"""Replicas of the vLLM-style engine behind a dispatcher, in one SimPy environment.

Dispatchers (`cluster.dispatcher`):
- round_robin: the i-th arrival goes to replica i mod N;
- client_affinity: every request of client c goes to replica c mod N (clients in trace order);
- least_requests: the replica holding the fewest unfinished requests (ties: lowest index);
- least_tokens: the replica with the fewest tokens still to process: prompt tokens not yet
  computed plus output tokens not yet generated (a router knows each request's max_tokens; the
  output length stands in for it);
- central: no routing; one waiting queue and one policy shared by all replicas, each pulling
  from it when it has room;
- global_vtc: `central` under a counter policy (vtc, weighted vtc, lcf, fairserve): one set of
  counters charged by every replica's service, the VTC paper's distributed direction (C.3).

Round robin and client affinity on an open-loop trace fix every assignment up front, so each
replica runs alone at full speed (fast-forward). Otherwise replicas are coupled and step together.
Per-replica policies are independent copies of the configured one.
"""

from __future__ import annotations

import copy
import time as wallclock
from collections.abc import Generator
from dataclasses import dataclass

import numpy as np
import pandas as pd
import simpy

from cost_models.base import StepCostModel
from policies.base import Policy
from policies.vtc import LeastServed
from simulator.arrivals import Arrivals, chains, first_arrivals
from simulator.engine import Progress, ProgressSnapshot, run_without_cyclic_gc
from simulator.queue import WaitingQueue
from simulator.timeline import IN_FLIGHT, Timeline
from simulator.vllm import VLLMConfig, VLLMEngine
from traces.schema import Trace

DISPATCHERS = (
    "round_robin",
    "client_affinity",
    "least_requests",
    "least_tokens",
    "central",
    "global_vtc",
)
STATIC = ("round_robin", "client_affinity")
SHARED = ("central", "global_vtc")


@dataclass(frozen=True)
class ClusterConfig:
    replicas: int = 1
    dispatcher: str = "round_robin"

    def __post_init__(self) -> None:
        if int(self.replicas) != self.replicas or self.replicas < 1:
            raise ValueError(f"cluster.replicas must be an integer >= 1, got {self.replicas!r}")
        if self.dispatcher not in DISPATCHERS:
            raise ValueError(
                f"cluster.dispatcher must be one of {DISPATCHERS}, got {self.dispatcher!r}"
            )


class RequestLog:
    """Per-request state and results shared by all replicas (a request runs on one replica at
    a time; under a shared queue a preempted request may resume elsewhere)."""

    def __init__(self, trace: Trace) -> None:
        n = len(trace)
        self.prompt: list[int] = trace.prompt_len.tolist()
        self.output: list[int] = trace.output_len.tolist()
        self.client = trace.client
        self.arrival = np.where(trace.predecessor() < 0, trace.arrival, np.nan)
        self.status = np.full(n, IN_FLIGHT, dtype=np.int8)
        self.reason = np.full(n, "not_arrived", dtype=object)
        self.admitted_at = np.full(n, np.nan)
        self.first_token_at = np.full(n, np.nan)
        self.finished_at = np.full(n, np.nan)
        self.replica = np.full(n, -1, dtype=np.int64)
        self.computed = [0] * n
        self.generated = [0] * n
        self.high_water = [0] * n  # tokens ever computed or served from the cache
        self.cached_tokens = [0] * n
        self.preemptions = [0] * n
        self.finished = 0
        self._open: dict[int, tuple[int, int, int]] = {}  # row -> (index, replica, step)
        self.runs: list[tuple[int, int, int, int, int]] = []  # (row, index, replica, step, n)
        self.on_end = lambda req, t: None  # chained traces: releases the next call

    def end(self, req: int, now: float, status: int, reason: str) -> None:
        """Refused, rejected or throttled: never served."""
        self.status[req] = status
        self.reason[req] = reason
        self.finished += 1
        self.on_end(req, now)

    def open_segment(self, req: int, index: int, replica: int, step: int) -> None:
        if req not in self._open:
            self._open[req] = (index, replica, step)

    def close_segment(self, req: int) -> None:
        seg = self._open.pop(req, None)
        if seg is not None:
            index, rep, step = seg
            self.runs.append((req, index, rep, step, self.generated[req] - index))

    def close_all(self) -> None:
        for req in list(self._open):
            self.close_segment(req)


class ClusterFeed(Arrivals):
    """All arrivals of a coupled cluster: each is routed when it happens."""

    coupled = True

    def __init__(self, cluster: Cluster, rows: list[int], times: list[float]) -> None:
        super().__init__(rows, times)
        self.cluster = cluster
        self.deliver = cluster.dispatch
        self.changed: simpy.Event | None = None

    def release(self, req: int, t: float) -> None:
        super().release(req, t)
        if self.changed is not None and not self.changed.triggered:
            self.changed.succeed()


class Cluster:
    def __init__(
        self,
        trace: Trace,
        policy: Policy,
        cost: StepCostModel,
        engine: VLLMConfig,
        cluster: ClusterConfig,
        progress: Progress | None = None,
    ) -> None:
        self.trace, self.cost, self.cfg, self.ccfg = trace, cost, engine, cluster
        self.progress, self._reported = progress, wallclock.monotonic()
        self.log = RequestLog(trace)
        n = cluster.replicas
        shared = cluster.dispatcher in SHARED
        if cluster.dispatcher == "global_vtc" and not isinstance(policy, LeastServed):
            raise ValueError(
                f"cluster.dispatcher=global_vtc needs a counter policy (vtc, lcf, fairserve, "
                f"...), got policy {policy.name!r}; dispatcher=central shares any policy"
            )
        copies = 0 if shared else n - 1  # replica 0 runs the given policy object itself
        self.policies = [policy] + [copy.deepcopy(policy) for _ in range(copies)]
        for p in self.policies:
            p.bind(trace, chunked=True)
        client_of = trace.client.tolist()
        queues = [WaitingQueue(client_of) for _ in range(1 if shared else n)]
        if shared:
            queues *= n
        self.successor = chains(trace)
        first = first_arrivals(trace)
        self.coupled = cluster.dispatcher not in STATIC or (trace.chained and n > 1)
        if self.coupled:
            self.feed: Arrivals = ClusterFeed(self, first.tolist(), trace.arrival[first].tolist())
            feeds: list[Arrivals] = [self.feed] * n
        else:
            target = self._static_targets(first)
            feeds = []
            for i in range(n):
                mine = first[target == i]
                feeds.append(Arrivals(mine.tolist(), trace.arrival[mine].tolist()))
            self.feed = feeds[0]
        self.replicas = [
            VLLMEngine(
                i,
                trace,
                self.policies[0 if shared else i],
                cost,
                engine,
                self.log,
                queues[i],
                feeds[i],
                self._release,
            )
            for i in range(n)
        ]
        for feed in feeds:
            feed.horizon = engine.horizon
        for rep in self.replicas:
            rep.tick = self._tick
        if shared:
            for rep in self.replicas:
                rep.peers = self.replicas
        if not self.coupled:
            for feed, rep in zip(feeds, self.replicas, strict=True):
                feed.deliver = rep.accept
        self.log.on_end = self._release
        self._rr = 0
        self.outstanding: list[set[int]] = [set() for _ in range(n)]

    def _static_targets(self, rows: np.ndarray) -> np.ndarray:
        n = self.ccfg.replicas
        if self.ccfg.dispatcher == "round_robin":
            return np.arange(rows.shape[0]) % n
        return self.trace.client[rows] % n

    # ---- routing --------------------------------------------------------------------------
    def dispatch(self, req: int, now: float) -> None:
        d = self.ccfg.dispatcher
        reps = self.replicas
        if d in SHARED:
            reps[0].accept(req, now)  # one queue, one policy; idle replicas wake to pull
            return
        if d == "round_robin":
            i = self._rr % len(reps)
            self._rr += 1
        elif d == "client_affinity":
            i = int(self.trace.client[req]) % len(reps)
        elif d == "least_requests":
            i = min(range(len(reps)), key=lambda k: (len(self.outstanding[k]), k))
        else:
            i = min(range(len(reps)), key=lambda k: (self._tokens_left(k), k))
        self.outstanding[i].add(req)
        self.log.replica[req] = i
        reps[i].accept(req, now)

    def _tokens_left(self, replica: int) -> int:
        log = self.log
        return sum(
            log.prompt[r] + log.output[r] - min(log.computed[r], log.prompt[r]) - log.generated[r]
            for r in self.outstanding[replica]
        )

    def _release(self, req: int, now: float) -> None:
        """`req` ended (finished, rejected or refused): it no longer loads its replica, and a
        chained successor is sent after its think time."""
        rep = int(self.log.replica[req])
        if rep >= 0:
            self.outstanding[rep].discard(req)
        nxt = self.successor.get(req)
        if nxt is not None:
            self.feed.release(nxt[0], now + nxt[1])

    def _tick(self, now: float) -> None:
        """Report progress about once a second of wall time (replicas call this every loop)."""
        if self.progress is None or wallclock.monotonic() - self._reported < 1.0:
            return
        self._reported = wallclock.monotonic()
        log = self.log
        self.progress(
            ProgressSnapshot(
                now,
                log.finished,
                len(self.trace),
                log.arrival,
                self.trace.output_len,
                log.first_token_at,
                log.finished_at,
            )
        )

    # ---- running --------------------------------------------------------------------------
    def _arrivals(self, env: simpy.Environment) -> Generator[simpy.Event, None, None]:
        """Coupled clusters: deliver arrivals while every replica is idle."""
        feed = self.feed
        assert isinstance(feed, ClusterFeed)
        horizon = self.cfg.horizon
        while True:
            feed.ingest(env.now)
            t = feed.next_time()
            if horizon is not None and env.now >= horizon:
                return
            feed.changed = env.event()
            waits = [feed.changed]
            if t < np.inf and (horizon is None or t <= horizon):
                waits.append(env.timeout(t - env.now))
            yield env.any_of(waits)

    def run(self) -> Timeline:
        env = simpy.Environment()
        if self.coupled:
            env.process(self._arrivals(env))
        for rep in self.replicas:
            env.process(rep.process(env))
        run_without_cyclic_gc(env)
        return self._timeline()

    def _timeline(self) -> Timeline:
        log, reps = self.log, self.replicas
        for rep in reps:
            rep.pool.check()  # private + cached + empty blocks add up to the pool
            for r in rep.running:
                log.reason[r] = "running"
        log.close_all()
        cols = [rep.step_columns() for rep in reps]
        offsets = np.cumsum([0] + [c["end"].shape[0] for c in cols])
        steps = {k: np.concatenate([c[k] for c in cols]) for k in cols[0]}
        steps["replica"] = np.repeat(np.arange(len(reps)), np.diff(offsets))
        runs = np.array(log.runs, dtype=np.int64).reshape(-1, 5)
        token_runs = {
            "row": runs[:, 0],
            "index": runs[:, 1],
            "step": runs[:, 3] + offsets[runs[:, 2]],
            "count": runs[:, 4],
        }
        end = max(rep.now for rep in reps)
        completed = log.status == 0
        return Timeline(
            trace=self.trace,
            arrival=log.arrival,
            status=log.status,
            reason=np.where(completed, np.array(None), log.reason),
            admitted_at=log.admitted_at,
            first_token_at=log.first_token_at,
            finished_at=log.finished_at,
            generated=np.asarray(log.generated, dtype=np.int64),
            first_decode=np.full(len(self.trace), -1, dtype=np.int64),
            steps=steps,
            pool_tokens=reps[0].pool_tokens,
            counters=_counters(self.policies),
            info={
                "engine": "vllm",
                "end_time": end,
                "replicas": len(reps),
                "dispatcher": self.ccfg.dispatcher,
                "block_size": self.cfg.block_size,
                "kv_used_at_end": int(sum(r.pool.used for r in reps)) * self.cfg.block_size,
            },
            token_runs=token_runs,
            request_columns={
                "replica": log.replica,
                "preemptions": np.asarray(log.preemptions, dtype=np.int64),
                "cached_tokens": np.asarray(log.cached_tokens, dtype=np.int64),
            },
        )


def _counters(policies: list[Policy]) -> pd.DataFrame | None:
    frames = []
    for i, p in enumerate(policies):
        f = p.counter_events()
        if f is not None:
            if len(policies) > 1:
                f = f.assign(replica=i)
            frames.append(f)
    if not frames:
        return None
    return pd.concat(frames, ignore_index=True)


def simulate_cluster(
    trace: Trace,
    policy: Policy,
    cost: StepCostModel,
    engine: VLLMConfig | None = None,
    cluster: ClusterConfig | None = None,
    progress: Progress | None = None,
) -> Timeline:
    """Run `trace` through vLLM-style replicas behind a dispatcher and return one timeline
    (requests carry their replica; steps carry theirs)."""
    engine, cluster = engine or VLLMConfig(), cluster or ClusterConfig()
    return Cluster(trace, policy, cost, engine, cluster, progress).run()
