"""The runner: one SimPy environment, N replicas of a step model behind a dispatcher.

The runner owns a request's journey, everything about a run that does not depend on how a GPU
step is modelled: it arrives (a trace row, a chained call released when its predecessor ends),
is routed to a replica, refused if no replica can ever serve it or rejected by the policy's
arrival hook, waits, runs on its replica's steps and ends (finished, rejected, or in flight at
the horizon); then the run's `Timeline` is assembled (simulator/engines/assemble.py).

Replicas whose arrivals are known up front (one replica, or a static dispatcher on an open-loop
trace) each run alone and may run ahead of simulated time, taking many steps at once
(fast-forward); with `cluster.processes` > 1 an offline run simulates them in forked processes
at once and merges what they return (simulator/engines/forked.py). Otherwise the replicas are
coupled: each decides a step at its start and applies it at its end, so every replica and the
dispatcher see the others exactly as of that instant; a run of decode steps is taken at once
while nothing from outside can read what it changes, cut short where something reaches its
replica (`cut`) or, where a reader needs it, ended at the next arrival (`_frontier_of`). At one
instant, arrivals and other events come first, then the effects of the steps ending then, in
replica order, and the next decisions after all of them, in replica order (`At`).

Online use (`OnlineRunner`, simulator/engines/online.py): nothing arrives from the trace by
itself; arrivals are pushed while the run goes, and `frontier` says up to when every arrival is
known. Replicas never apply a step that ends at or after the frontier, so the timeline is
exactly the one an offline run of the same arrivals gives.
"""

from __future__ import annotations

import copy
import time as wallclock
from bisect import bisect_left
from collections.abc import Callable, Generator
from dataclasses import dataclass
from functools import partial

import numpy as np
import pandas as pd
import simpy
from simpy.events import EventPriority

from cost_models.base import StepCostModel
from simulator.core.queue import WaitingQueue
from simulator.core.requests import CLIENT_TIMEOUT, IN_FLIGHT, REFUSED, REJECTED, RequestState
from simulator.core.seam import CounterPolicy, Finished, Left, Policy
from simulator.core.timeline import SpillPlan, Timeline, TokenRuns
from simulator.engines.arrivals import Arrivals, chains, first_arrivals
from simulator.engines.assemble import ReplicaPart, assemble_timeline, counter_frame, counter_logs
from simulator.engines.autoscaler import (
    DRAINING,
    LOADING,
    READY,
    Autoscaler,
    AutoscalerConfig,
    Fleet,
)
from simulator.engines.dispatch import ClusterConfig, Dispatcher
from simulator.engines.fast_forward import MAX_RUN_SEGMENTS
from simulator.engines.gateway import QUEUED, Gateway
from simulator.engines.pools import DisaggregatedPools
from simulator.engines.step_model import EngineConfig, Plan, StepModel
from traces.schema import Trace


@dataclass(frozen=True)
class ProgressSnapshot:
    """What a progress reporter sees about once a second of wall time (arrays are live views:
    read them during the call, do not keep them)."""

    now: float
    finished: int
    total: int
    arrival: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    first_token_at: np.ndarray
    finished_at: np.ndarray
    done: bool = False  # the last report: the run has ended (at the horizon, or all finished)


Progress = Callable[[ProgressSnapshot], None]


BUSY, IDLE, HELD, DONE = range(4)  # how a standalone replica's burst of steps ended


class At(simpy.Event):
    """An event `delay` from now at a given SimPy priority: of the events at one instant,
    SimPy takes the lower priority first, then the earlier scheduled. Coupled replicas use it
    so that, at one instant, every other event comes first (arrivals, ticks, transfers), then
    the steps ending then, in replica order, then the decisions, in replica order, however
    they were scheduled (a run cut short reschedules its end)."""

    def __init__(self, env: simpy.Environment, delay: float, priority: int) -> None:
        self.env = env  # (as SimPy's own Timeout sets itself up)
        self.callbacks: list = []
        self._value = None
        self._ok = True
        env.schedule(self, EventPriority(priority), delay)


STEP_END = 2  # priority of replica i's step end: STEP_END + i (SimPy's NORMAL events are 1)
ABORTED = "aborted"  # the reason of a request whose client went away (live mode)


class Runner:
    """One run: the trace's requests through `cluster.replicas` replicas of `engine` under
    `policy` (a copy per replica unless the dispatcher shares one queue), to a `Timeline`.
    `close()` runs it to the end; `simulate()` (simulator/engines/simulate.py) is the usual way
    in. It is the `Host` its replicas see."""

    pushed = False  # arrivals come from the trace (True: they are pushed, OnlineRunner)

    def __init__(
        self,
        trace: Trace,
        policy: Policy,
        cost: StepCostModel,
        engine: EngineConfig,
        cluster: ClusterConfig | None = None,
        *,
        progress: Progress | None = None,
        spill: SpillPlan | None = None,
    ) -> None:
        cluster = cluster or ClusterConfig()
        engine = engine.for_cost(cost)  # (vLLM's block size for a model with recurrent layers)
        self.trace, self.engine, self.cluster = trace, engine, cluster
        self.horizon = engine.horizon
        self.progress, self._reported = progress, wallclock.monotonic()
        self.state = RequestState(trace)
        self.tokens = TokenRuns()
        self.dispatcher = cluster.make_dispatcher(self.state.client_of)
        self.dispatcher.check(policy)
        self.dispatcher.see_trace(trace)
        n, shared = cluster.fleet_size, self.dispatcher.shared
        timeouts = trace.client_timeout  # None: no client ever gives up
        self.timeouts = None if timeouts is None or np.isinf(timeouts).all() else timeouts
        # prefill and decode pools (simulator/engines/pools.py) instead of co-located replicas
        self.pools = (
            DisaggregatedPools(self, cluster, policy, engine, cost)
            if cluster.disaggregated
            else None
        )
        if self.pools is not None:
            self.policies = list({id(p): p for p in self.pools.policies}.values())
        else:
            copies = 0 if shared else n - 1  # replica 0 runs the given policy object itself
            self.policies = [policy] + [copy.deepcopy(policy) for _ in range(copies)]
        for p in self.policies:
            p.bind(trace)
        self._cost = cost
        self._refusal = (
            engine.refusals(trace, cost).tolist()
            if self.pools is None
            else self.pools.refusals(trace)
        )
        self.successor = chains(trace)
        # the gateway in front (simulator/engines/gateway.py), when it decides anything
        gateway = cluster.gateway
        self.gateway = (
            Gateway(gateway, trace, self.state.client_of, self.deadline)
            if gateway is not None and gateway.active
            else None
        )
        # an elastic fleet (simulator/engines/autoscaler.py): replicas that load, serve, drain
        self.fleet = Fleet(n, cluster.replicas) if cluster.elastic else None
        if self.fleet is not None:
            assert isinstance(cluster.autoscaler, AutoscalerConfig)
            self.autoscaler = Autoscaler(cluster.autoscaler)
            self.dispatcher.available = self.fleet.available
            self.under_provisioned = np.zeros(len(trace), dtype=bool)  # arrived short of replicas
            self.routed_to: list[set[int]] = [set() for _ in range(n)]  # requests not yet ended
        self._hears_ends = any(x is not None for x in (self.gateway, self.pools, self.fleet))
        self.coupled = not self.dispatcher.static or (trace.chained and n > 1) or self._hears_ends
        # a request is sent at its arrival time and reaches the engine's queue this much later
        # (a cost model's front end: HTTP, tokenizing); its latencies count from the send
        self.frontend = float(getattr(cost, "frontend_latency", 0.0))
        self.frontier = 0.0 if self.pushed else np.inf  # every arrival before it is known
        first = [] if self.pushed else first_arrivals(trace).tolist()
        self._feeds = self._make_feeds(first, n)
        client_of = self.state.client_of
        queues = [WaitingQueue(client_of) for _ in range(1 if shared else n)]
        self.queues = queues * n if shared else queues
        if self.pools is not None:
            self.replicas = self.pools.build(self.queues)
        else:
            per_replica = self.policies * n if shared else self.policies
            # coupled replicas take runs of decode steps too, each cut where something from
            # outside could reach or read it (`_frontier_of`), unless they share one queue and
            # policy or a finish anywhere may send a chained call at any instant
            fast = engine.fast_forward and not (self.coupled and (shared or trace.chained))
            pairs = list(zip(per_replica, self.queues, strict=True))
            self.replicas = engine.build(self, pairs, cost, fast)
        self.spill = spill
        if spill is not None:
            spill.folder.mkdir(parents=True, exist_ok=True)
            for rep in self.replicas:
                rep.steps.spill_to(spill.folder / f"steps-{rep.index}.parquet", spill.steps)
            for i, p in enumerate(self.policies):
                if isinstance(p, CounterPolicy):
                    p.counter_log().spill_to(spill.folder / f"counters-{i}.parquet", spill.steps)
        self.env = simpy.Environment()
        self._wake: list[simpy.Event | None] = [None] * n  # set while a coupled replica idles
        self._held: list[Plan | None] = [None] * n  # a step ending at or after the frontier
        self._stepping: list[float | None] = [None] * n  # coupled: the end of the step under way
        self._in_flight: list[Plan | None] = [None] * n  # coupled: the plan under way
        self._procs: list[simpy.Process | None] = [None] * n  # coupled: each replica's process
        self._changed: simpy.Event | None = None  # coupled: a release or push to wait for
        self._frontier_moved = self.env.event()
        self.started = False
        # live (OnlineRunner): False while the tokens of the steps just applied are handed out;
        # a standalone replica that applied a step then forms the next only once it is True
        self.forming = True
        self._next_scrape = np.inf  # when a dispatcher next takes a snapshot of its replicas
        self._next_tick = np.inf  # when the autoscaler next reads the replicas
        self._gateway_wake: simpy.Event | None = None  # set while the gateway's TTL timer waits
        self.simulated = list(range(n))  # the replicas this process simulates
        self.cuts_runs = self._cuts_runs()
        if self.cuts_runs:
            for rep in self.replicas:
                rep.runs_cut = True  # type: ignore[attr-defined]
            if self.gateway is not None:
                self.gateway.kv_now = self._reported_kv
        # while forked processes simulate the other replicas (forked.py): drains their news and
        # gives the simulated time every one of them has reached
        self.others_reached: Callable[[], float] | None = None

    # ---- arrivals ---------------------------------------------------------------------------
    def _make_feeds(self, first: list[int], n: int) -> list[Arrivals]:
        arrival = self.trace.arrival + self.frontend  # when each reaches the engine
        if self.coupled:
            feed = Arrivals(first, arrival[first].tolist(), self.horizon)
            feed.deliver = self._dispatch
            return [feed] * n
        mine: list[list[int]] = [[] for _ in range(n)]
        for r in first:  # static dispatch: every assignment up front
            mine[self.dispatcher.route(r, [])].append(r)
        self.routed = mine  # the rows each replica serves
        feeds = [Arrivals(rows, arrival[rows].tolist(), self.horizon) for rows in mine]
        for i, feed in enumerate(feeds):
            feed.deliver = partial(self.accept, i)
        return feeds

    def feed(self, replica: int) -> Arrivals:
        return self._feeds[replica]

    def _dispatch(self, req: int, now: float) -> None:
        """Coupled replicas: an arrival, through the gateway if there is one, then routed."""
        if self.fleet is not None and self.fleet.wanted > self.fleet.count(READY):
            self.under_provisioned[req] = True
        gateway = self.gateway
        if gateway is not None:
            held = self._gateway_holds()
            self.state.arrival[req] = now - self.frontend
            reason = gateway.arrive(req, now, self._serving())
            if reason is not None:
                self._end(req, now, REJECTED, reason)
                return
            if gateway.flow.enabled:  # it waits at the gateway
                self.state.reason[req] = QUEUED
                self._wake_gateway()
                self._pump(now)
                if self.cuts_runs and not held and self._gateway_holds():
                    for i in range(len(self.replicas)):  # from now on, one step at a time
                        self.cut(i, now)
                return
        self._route(req, now)

    def _route(self, req: int, now: float) -> None:
        """Send a request to the replica (or pool) the dispatcher picks."""
        if self.pools is not None:
            self.pools.route(req, now)
            return
        if self.dispatcher.shared:
            self.accept(0, req, now)  # one queue, one policy; idle replicas wake to pull
            return
        i = self.dispatcher.route(req, self.replicas, now)
        self.state.replica[req] = i
        if self.fleet is not None:
            self.routed_to[i].add(req)
        self.accept(i, req, now)

    def accept(self, replica: int, req: int, now: float) -> None:
        """A request arrives at a replica: refused, rejected, or queued."""
        state = self.state
        if self.gateway is None:  # (the gateway notes it on arrival: this may be later)
            state.arrival[req] = now - self.frontend  # sent then (chained calls learn it now)
        refusal = self._refusal[req]
        if refusal is not None:
            self._end(req, now, REFUSED, refusal)
            return
        queue = self.queues[replica]
        if self.cuts_runs:  # its policy and queue as of now
            self.cut(replica, now)
        rejection = self.replicas[replica].policy.on_arrival(req, now, queue)
        if rejection is not None:
            self._end(req, now, REJECTED, rejection)
            return
        if self.timeouts is not None and not self.watch_timeout(replica, req, now):
            return
        state.reason[req] = "queued"
        queue.push(req)
        if self.coupled:
            self.queued(replica, now)

    def first_give_up(self, replica: int, until: float) -> float:
        if self.timeouts is None:
            return np.inf
        return self._feeds[replica].first_give_up(self.timeouts, self.frontend, until)

    def deadline(self, req: int) -> float:
        """When the client of `req` gives up (inf: never), counted from its send."""
        if self.timeouts is None:
            return np.inf
        return float(self.state.arrival[req] + self.timeouts[req])

    def watch_timeout(self, replica: int, req: int, now: float) -> bool:
        """`req` joins `replica`'s queue: that replica (every replica, where they share one
        queue) drops it when its client gives up; False: the client already has (the request
        ends here)."""
        deadline = self.deadline(req)
        if deadline == np.inf:
            return True
        if deadline <= now:
            self.timed_out(replica, req, now)
            return False
        for rep in self.replicas if self.dispatcher.shared else [self.replicas[replica]]:
            rep.watch_timeout(req, deadline)
        return True

    def _release(self, req: int, t: float) -> None:
        feed = self._feeds[0] if self.coupled else self._feeds[self._target(req)]
        feed.release(req, t + self.frontend)
        if self._changed is not None and not self._changed.triggered:
            self._changed.succeed()

    def _target(self, req: int) -> int:
        """Standalone replicas: the replica a chained call or a pushed arrival goes to."""
        return self.dispatcher.route(req, self.replicas) if len(self.replicas) > 1 else 0

    def aborted(self, replica: int, req: int, now: float) -> None:
        """A replica dropped an aborted running request (its memory is free)."""
        self._end(req, now, REJECTED, ABORTED)

    def timed_out(self, replica: int, req: int, now: float) -> None:
        """The client of `req` gave up: the replica dropped it from its queue or its running
        batch (its memory is free)."""
        self._end(req, now, REJECTED, CLIENT_TIMEOUT)

    # ---- endings ----------------------------------------------------------------------------
    def _end(self, req: int, now: float, status: int, reason: str) -> None:
        state = self.state
        state.end(req, status, reason)
        if state.admitted_at[req] == state.admitted_at[req]:  # (not NaN) it was admitted
            policy = self.replicas[int(state.replica[req])].policy
            if Left in policy.charged:
                policy.charge(Left(req, now, int(state.generated[req])))
        self._released(req, now, completed=False)

    def reject(self, req: int, now: float, reason: str) -> None:
        self._end(req, now, REJECTED, reason)

    def finish(self, replica: int, rows: list[int], now: float) -> None:
        self.state.complete(rows, now)
        policy = self.replicas[replica].policy
        if Finished in policy.charged:
            for r in rows:
                policy.charge(Finished(r, now))
        if self.dispatcher.tracks_load or self.successor or self._hears_ends:
            for r in rows:
                self._released(r, now, completed=True)

    def _released(self, req: int, now: float, completed: bool) -> None:
        """`req` ended (`completed`: with its last token): it no longer loads its replica, and
        a chained successor is sent after its think time."""
        if self.gateway is not None:
            self.gateway.ended(req, now, int(self.state.generated[req]), completed)
        if self.fleet is not None and self.state.replica[req] >= 0:
            self.routed_to[int(self.state.replica[req])].discard(req)
        if self.pools is not None:
            self.pools.released(req, now)
        elif self.dispatcher.tracks_load:
            self.dispatcher.released(req, int(self.state.replica[req]))
        nxt = self.successor.get(req)
        if nxt is not None:
            self._release(nxt[0], now + nxt[1])

    def prefilled(self, replica: int, rows: list[int], now: float) -> None:
        """Disaggregated pools: a prefill replica handed these requests off."""
        assert self.pools is not None
        if self.cuts_runs:  # their decode replicas' policies and queues as of now
            for j in sorted({int(self.pools.decode_of[r]) for r in rows}):
                self.cut(j, now)
        self.pools.prefilled(replica, rows, now)

    def fetch_kv(self, replica: int, req: int, tokens: int, now: float) -> None:
        """Disaggregated pools: a decode replica admitted `req`; `tokens` of its KV move."""
        assert self.pools is not None
        self.pools.fetch(replica, req, tokens, now)

    def queued(self, replica: int, now: float) -> None:
        """Wake the replicas that may pull from `replica`'s queue: they resume at `now` exactly
        (SimPy's clock adds relative delays, so it may differ from `now` in the last bit)."""
        for i in range(len(self.replicas)) if self.dispatcher.shared else (replica,):
            wake = self._wake[i]
            if wake is not None and not wake.triggered:
                wake.succeed(now)

    # ---- running ----------------------------------------------------------------------------
    def close(self) -> Timeline:
        """No more arrivals will be pushed: run to completion (or the horizon)."""
        self.frontier, self.forming = np.inf, True
        self.advance(None)
        if self.progress is not None:
            self.report(self.env.now, done=True)
        return self._timeline()

    def advance(self, until: float | None) -> None:
        """Run the simulation to `until` (None: to the end); the first call starts it."""
        if not self.started:
            self.started = True
            if self.coupled:
                self.env.process(self._arrivals())
            scraped = self._scraped()
            if scraped:
                self.env.process(self._scrape(scraped))
            gateway = self.gateway
            if gateway is not None and (gateway.flow.ttl is not None or self.timeouts is not None):
                self.env.process(self._gateway_expiries())
            if self.fleet is not None:
                self.env.process(self._autoscale())
            for i in self.simulated:
                rep = self.replicas[i]
                if self.coupled:
                    self._procs[i] = self.env.process(self._coupled(rep))
                else:
                    self.env.process(self._standalone(rep))
        moved, self._frontier_moved = self._frontier_moved, self.env.event()
        moved.succeed()
        if until is not None and until <= self.env.now:
            return
        self.env.run(until)

    def tick(self, now: float) -> None:
        """Report progress about once a second of wall time (replicas call this every loop)."""
        if self.progress is None or wallclock.monotonic() - self._reported < 1.0:
            return
        self.report(now)

    def report(self, now: float, done: bool = False) -> None:
        assert self.progress is not None
        self._reported = wallclock.monotonic()
        state, ended = self.state, self.state.ended
        if self.others_reached is not None:  # forked processes simulate the other replicas
            now = min(now, self.others_reached())  # reached by every process
            ended = int(np.count_nonzero(state.status != IN_FLIGHT))  # the statuses are shared
        self.progress(
            ProgressSnapshot(
                now,
                ended,
                len(self.trace),
                state.arrival,
                self.trace.prompt_len,
                self.trace.output_len,
                state.first_token_at,
                state.finished_at,
                done,
            )
        )

    def _past_horizon(self, now: float) -> bool:
        return self.horizon is not None and now >= self.horizon

    def _next_arrival(self, rep: StepModel) -> float:
        """When the next arrival may come: a known one, or the frontier."""
        return min(self._feeds[rep.index].next_time(), self.frontier)

    def _standalone(self, rep: StepModel) -> Generator[simpy.Event, None, None]:
        """A replica alone: it takes steps one after another, up to MAX_RUN_SEGMENTS of them,
        then lets simulated time catch up; nobody else reads its state, so it may run ahead."""
        env = self.env
        while True:
            burst = self._burst(rep)
            yield env.timeout(max(0.0, rep.now - env.now))
            if burst == BUSY:
                continue
            if burst == HELD:
                yield self._frontier_moved
                continue
            if burst == DONE:
                return
            # idle: sleep until the next arrival, or its own next event (a KV load ending)
            nxt = min(self._next_arrival(rep), rep.next_event())
            if nxt == np.inf or (self.horizon is not None and nxt > self.horizon):
                return
            if nxt >= self.frontier:
                yield self._frontier_moved
                continue
            yield env.timeout(max(0.0, nxt - env.now))
            rep.now = nxt

    def _burst(self, rep: StepModel) -> int:
        feed, i, horizon = self._feeds[rep.index], rep.index, self.horizon
        feed.ingest(rep.now)  # applying a plan delivers every arrival up to its end
        applied = False
        for _ in range(MAX_RUN_SEGMENTS):
            plan = self._held[i]
            if plan is None:
                if self.progress is not None:
                    self.tick(rep.now)
                if horizon is not None and rep.now >= horizon:
                    return DONE
                if applied and not self.forming:  # its tokens go out first (OnlineRunner.form)
                    return HELD
                plan = rep.schedule(self.frontier)
                if plan is None:
                    return IDLE
            if plan.end >= self.frontier:
                self._held[i] = plan
                return HELD
            self._held[i] = None
            rep.apply(plan)
            applied = True
        return BUSY

    def _coupled(self, rep: StepModel) -> Generator[simpy.Event, float, None]:
        """Coupled replicas: decide at a step's start, apply at its end, one step (or run) at a
        time. At one instant, the steps ending then take effect in replica order, after every
        other event of the instant, and the decisions follow in replica order (`At`)."""
        env, feed, i = self.env, self._feeds[rep.index], rep.index
        step_end, decide = STEP_END + i, STEP_END + len(self.replicas) + i
        while True:
            self.tick(rep.now)
            feed.ingest(rep.now)
            if self._past_horizon(rep.now):
                return
            plan = rep.schedule(self._frontier_of(rep))
            if plan is None:
                wake = self._wake[i] = env.event()
                own = rep.next_event()  # a KV load of its own ending
                if own == np.inf:
                    rep.now = yield wake  # the time of the arrival (or preemption) that woke it
                else:
                    yield env.any_of([wake, env.timeout(max(0.0, own - env.now))])
                    rep.now = wake.value if wake.triggered else own  # type: ignore[assignment]
                self._wake[i] = None
                yield At(env, 0.0, decide)
                continue
            # simulated time reaches plan.end only once the frontier has passed it
            self._stepping[i], self._in_flight[i] = plan.end, plan
            while True:
                try:
                    yield At(env, max(0.0, plan.end - env.now), step_end)
                    break
                except simpy.Interrupt:  # the run was cut short (`cut`): wait for its new end
                    plan = self._in_flight[i] or plan
            plan = self._in_flight[i] or plan  # what a cut left of it, same end or not
            self._in_flight[i] = self._stepping[i] = None
            rep.apply(plan)  # now = plan.end
            fleet = self.fleet
            if fleet is not None and fleet.state[i] == DRAINING and not rep.has_work():
                fleet.release(i, rep.now)  # drained: its GPU is free
            if self.gateway is not None:
                self._pump(rep.now)  # the pool may have room now
            # every replica applies its step before any decides; with nothing else due at
            # this instant there is nothing to wait for, and the decision comes at once, as
            # it would have after the wait (the P/D Azure run: one SimPy event a step fewer)
            if env.peek() <= env.now:
                yield At(env, 0.0, decide)

    # ---- runs past arrivals -------------------------------------------------------------------
    def _cuts_runs(self) -> bool:
        """Whether coupled replicas' runs of decode steps may go on past arrivals, each cut
        (`cut`) where something reaches its replica instead (a request routed to it, a
        handoff from a prefill replica, the gateway starting to hold requests). Then whatever
        reads a replica at an arrival reads nothing a run changes before its end: the
        dispatcher its own books only, the gateway queue lengths and the KV use as of the
        instant (`_reported_kv`); every replica taking runs can cut them (no CPU tier), and
        arrivals are known in advance (not live, no chained calls)."""
        if not self.coupled or self.pushed or self.dispatcher.shared or self.trace.chained:
            return False
        runs = [rep for rep in self.replicas if getattr(rep, "fast_forward", False)]
        if not runs or not all(getattr(rep, "runs_may_be_cut", False) for rep in runs):
            return False
        pools = self.pools
        if pools is None:
            return not self.dispatcher.reads_replicas
        return (
            self.gateway is None
            and pools.pd.decider != "cache_miss_above"  # (it reads a decode replica's cache)
            and not pools.decode_dispatcher.reads_replicas
        )

    def cut(self, replica: int, t: float) -> None:
        """Something reaches `replica` at `t`: a run of decode steps under way takes effect up
        to `t` and ends with the step under way then (`VLLMReplica.cut_run`)."""
        plan = self._in_flight[replica]
        if plan is None:
            return
        rest = self.replicas[replica].cut_run(plan, t)  # type: ignore[attr-defined]
        if rest is plan:
            return
        self._in_flight[replica] = rest
        if rest.end != self._stepping[replica]:
            self._stepping[replica] = rest.end
            proc = self._procs[replica]
            assert proc is not None
            proc.interrupt()  # it waits for the new end

    def _reported_kv(self, rep: StepModel, now: float) -> int:
        """KV in use on `rep` after its last step ending before `now`: a run under way records
        its steps at its end."""
        plan = self._in_flight[rep.index]
        kv = getattr(plan, "kv_used", None)
        if plan is not None and kv is not None:
            done = bisect_left(plan.ends, now)
            if done:
                return int(kv[done - 1])
        return rep.steps.last_kv

    def _frontier_of(self, rep: StepModel) -> float:
        """Until when a run of decode steps of coupled replica `rep` may go, nothing from
        outside reaching or reading it meanwhile but what cuts the run (`cut`): the frontier;
        for co-located replicas, `_colocated_frontier`; for a decode replica of disaggregated
        pools (whose policy is its own), the next KV transfer to it and snapshot, and unless
        handoffs cut its runs (`cuts_runs`), the next arrival (the dispatchers read it), the
        next end of a prefill step (a handoff), the next KV load an idle prefill replica waits
        for, or now if an idle prefill replica with work waiting could start a step at any
        instant (when blocks it needs are freed)."""
        pools = self.pools
        if pools is None:
            return self._colocated_frontier(rep)
        if not pools.fast_forward or rep.index < pools.P:
            return self.frontier
        if self.cuts_runs:  # handoffs and KV transfers to it cut its runs
            return min(self.frontier, self._next_scrape)
        until = min(
            self.frontier,
            self._feeds[0].next_time(),
            pools.next_kv_arrival(rep.index),
            self._next_scrape,  # a snapshot reads the replica as of its instant
        )
        for p in range(pools.P):
            end = self._stepping[p]
            if end is not None:
                until = min(until, end)
            elif self._wake[p] is None or len(self.queues[p]):  # deciding now, or may wake
                return rep.now
            else:  # idle: it steps again when a KV load of its own ends
                until = min(until, self.replicas[p].next_event())
        return until

    def _colocated_frontier(self, rep: StepModel) -> float:
        """For a coupled co-located replica taking runs: the next snapshot and autoscaler tick
        (they read it) and, unless an arrival routed to it cuts its run (`cuts_runs`), the
        next arrival (the dispatcher and the gateway read the replicas, and it may come here);
        or now (one step) while the gateway holds requests: it reads every replica at every
        step end to send one."""
        if self._gateway_holds():
            return rep.now
        if self.cuts_runs:  # an arrival routed to it cuts its run
            return min(self.frontier, self._next_scrape, self._next_tick)
        return min(self.frontier, self._feeds[0].next_time(), self._next_scrape, self._next_tick)

    def _gateway_holds(self) -> bool:
        gateway = self.gateway
        return gateway is not None and bool(gateway.queued or gateway.expiries)

    def _scraped(self) -> list[tuple[Dispatcher, list[StepModel]]]:
        """The dispatchers that read snapshots of their replicas, and those replicas."""
        if self.pools is not None:
            pairs = self.pools.dispatchers()
        else:
            pairs = [(self.dispatcher, self.replicas)]
        return [(d, reps) for d, reps in pairs if d.scrapes]

    def _scrape(
        self, scraped: list[tuple[Dispatcher, list[StepModel]]]
    ) -> Generator[simpy.Event, None, None]:
        """Snapshots of the replicas' reports every `interval` seconds (the dispatchers share
        the routing config), while anything else may still happen (`_next_scrape`: when the
        next is taken)."""
        env, interval = self.env, scraped[0][0].interval
        while True:
            for dispatcher, replicas in scraped:
                dispatcher.scrape(replicas, env.now)
            self._next_scrape = np.inf
            if self._past_horizon(env.now):
                return
            if self.fleet is not None and not self.pushed and self.state.ended == len(self.trace):
                return  # every request ended: the autoscaler's ticks alone would keep it going
            if env.peek() == np.inf:  # nothing else is scheduled
                if not self.pushed or self.frontier == np.inf:
                    return
                yield self._frontier_moved  # live: more arrivals may come
                continue
            self._next_scrape = env.now + interval
            yield env.timeout(interval)

    # ---- the gateway ----------------------------------------------------------------------
    def _pump(self, now: float) -> None:
        """Let the gateway dispatch what the pool has room for."""
        gateway = self.gateway
        assert gateway is not None
        if gateway.queued or gateway.expiries:  # (nothing waits: nothing to do)
            gateway.pump(now, self._serving(), self._route, self.reject)

    def _serving(self) -> list[StepModel]:
        """The replicas that take requests now (an elastic fleet's ready ones)."""
        if self.fleet is None:
            return self.replicas
        return [rep for rep, ok in zip(self.replicas, self.fleet.available, strict=True) if ok]

    def _wake_gateway(self) -> None:
        if self._gateway_wake is not None and not self._gateway_wake.triggered:
            self._gateway_wake.succeed()

    def _gateway_expiries(self) -> Generator[simpy.Event, None, None]:
        """Reject requests whose time at the gateway (its TTL) runs out, when it runs out."""
        assert self.gateway is not None
        env = self.env
        while True:
            t = self.gateway.next_expiry()
            self._gateway_wake = env.event()
            waits = [self._gateway_wake]
            if t < np.inf:
                waits.append(env.timeout(max(0.0, t - env.now)))
            yield env.any_of(waits)
            if self._past_horizon(env.now):
                return
            self._pump(env.now)

    # ---- the elastic fleet ------------------------------------------------------------------
    def _autoscale(self) -> Generator[simpy.Event, None, None]:
        """Every `interval` seconds: read the signal, decide, add or remove replicas; while
        anything else may still happen."""
        assert self.fleet is not None
        env, interval = self.env, self.autoscaler.cfg.interval
        while True:
            if self._past_horizon(env.now):
                return
            if env.peek() == np.inf:  # nothing else is scheduled
                if not self.pushed or self.frontier == np.inf:
                    return
                yield self._frontier_moved  # live: more arrivals may come
                continue
            self._next_tick = env.now + interval
            yield env.timeout(interval)
            self._next_tick = np.inf
            self._scale(env.now)

    def _load(self) -> float:
        """The autoscaler's signal, summed over the ready replicas."""
        assert self.fleet is not None
        ready = [rep for rep, s in zip(self.replicas, self.fleet.state, strict=True) if s == READY]
        metric = self.autoscaler.cfg.metric
        if metric == "queue_depth":
            waiting = self.gateway.queued if self.gateway is not None else 0
            return float(sum(len(rep.queue) for rep in ready) + waiting)
        if metric == "kv_utilization":
            return float(sum(rep.steps.last_kv / rep.pool_tokens for rep in ready))
        return float(
            sum(rep.remaining_tokens(r) for rep in ready for r in self.routed_to[rep.index])
        )

    def _scale(self, now: float) -> None:
        fleet = self.fleet
        assert fleet is not None
        provisioned = fleet.count(LOADING, READY)
        wanted = self.autoscaler.recommend(now, self._load(), provisioned)
        fleet.wanted = wanted
        for _ in range(wanted - provisioned):
            i = fleet.add(now)
            if i is not None:
                self.env.process(self._loading(i, now + self.autoscaler.delay()))
        for _ in range(provisioned - wanted):
            i = fleet.remove(now)
            if fleet.state[i] == DRAINING and not self.replicas[i].has_work():
                fleet.release(i, now)

    def _loading(self, i: int, ready_at: float) -> Generator[simpy.Event, None, None]:
        """Replica `i` loads until `ready_at`; then it takes requests (the gateway may send)."""
        assert self.fleet is not None
        yield self.env.timeout(max(0.0, ready_at - self.env.now))
        self.fleet.loaded(i, ready_at)
        if self.gateway is not None:
            self._pump(ready_at)

    def _arrivals(self) -> Generator[simpy.Event, None, None]:
        """Coupled replicas: deliver arrivals while every replica is idle."""
        env, feed = self.env, self._feeds[0]
        while True:
            feed.ingest(env.now)
            if self._past_horizon(env.now):
                return
            t = feed.next_time()
            self._changed = env.event()
            waits = [self._changed]
            if t < np.inf and (self.horizon is None or t <= self.horizon):
                waits.append(env.timeout(t - env.now))
            yield env.any_of(waits)

    # ---- the result -------------------------------------------------------------------------
    def _timeline(self) -> Timeline:
        for rep in self.replicas:
            rep.close()
            rep.steps.close()
        self.tokens.close_all(self.state.generated)
        parts = [self.replica_part(rep) for rep in self.replicas]
        counters = None
        if self.spill is None:
            events = [
                p.counter_events() if isinstance(p, CounterPolicy) else None for p in self.policies
            ]
            counters = counter_frame(events)
        columns = self.replicas[0].request_columns()
        if self.gateway is not None:
            columns |= self.gateway.request_columns()
        if self.fleet is not None:
            columns |= {"under_provisioned": self.under_provisioned}
        if self.pools is not None:
            columns |= self.pools.request_columns()
        timeline = self.assemble(parts, counters, columns)
        if self.pools is not None:
            timeline.info.update(self.pools.info())
        if self.fleet is not None:
            self.fleet.close(max(rep.now for rep in self.replicas))
            timeline.info["fleet"] = self.fleet.report()
        return timeline

    def replica_part(self, rep: StepModel) -> ReplicaPart:
        """What the timeline takes of a replica at the run's end (its step clock is handed over:
        the timeline's joined clock is then the one copy of it)."""
        steps = {} if self.spill is not None else rep.steps.columns()  # read before the handover
        return ReplicaPart(
            steps=steps,
            clock=rep.token_clock(rep.steps.take_clock_columns()),
            now=rep.now,
            kv_used=rep.kv_used(),
            counts=rep.counts(),
        )

    def assemble(
        self,
        parts: list[ReplicaPart],
        counters: pd.DataFrame | None,
        engine_columns: dict[str, np.ndarray],
    ) -> Timeline:
        spilled = None
        if self.spill is not None:
            spilled = counter_logs(self.policies), [rep.steps.spill_file() for rep in self.replicas]
        return assemble_timeline(
            self.trace,
            self.state,
            self.tokens,
            parts,
            counters,
            engine_columns,
            self.engine,
            self.cluster,
            self.replicas[0].pool_tokens,
            spilled,
        )
