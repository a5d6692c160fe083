"""The runner: one SimPy environment, N replicas of a step model behind a dispatcher.

The runner owns everything about a run that does not depend on how a GPU step is modelled:
arrivals (the trace's rows, chained calls released when their predecessor ends, arrivals pushed
while it runs), per-request state, refusals of requests no replica can ever serve, the policy's
arrival hook, the horizon, progress reports, finishing, and the `Timeline`.

Replicas whose arrivals are known up front (one replica, or a static dispatcher on an open-loop
trace) each run alone and may run ahead of simulated time, taking many steps at once
(fast-forward); with `cluster.processes` > 1 an offline run simulates them in forked processes
at once (simulator/engines/forked.py) and merges what they return. Otherwise the replicas are
coupled: each decides a step at its start and applies it at its end, one step at a time, so
every replica and the dispatcher see the others exactly as of that instant. At one instant,
arrivals come before the effects of a step ending then, and the next step's decisions come after
both.

Online use (`pushed=True`): nothing arrives from the trace by itself; `push(rows, times)` makes
rows arrive, and `run_until(t)` advances the simulation to t, promising that every arrival before
t has been pushed. Replicas then never apply a step that ends at or after that frontier, so the
timeline is exactly the one an offline run of the same arrivals gives.
"""

from __future__ import annotations

import copy
import time as wallclock
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import pandas as pd
import simpy

from cost_models.base import StepCostModel
from simulator.core.counters import CounterLog
from simulator.core.queue import WaitingQueue
from simulator.core.requests import IN_FLIGHT, REFUSED, REJECTED, RequestState
from simulator.core.seam import CounterPolicy, Finished, Policy
from simulator.core.timeline import SpillPlan, Timeline, TokenRuns
from simulator.engines.arrivals import Arrivals, chains, first_arrivals
from simulator.engines.dispatch import ClusterConfig
from simulator.engines.fast_forward import MAX_RUN_SEGMENTS
from simulator.engines.forked import ForkedTasks, Post, can_fork, shared_copy
from simulator.engines.slora import SLoRAConfig
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


@dataclass
class ReplicaPart:
    """What the timeline takes of one replica after the run."""

    steps: dict[str, np.ndarray]  # its step columns (empty when spilled)
    clock: np.ndarray  # its token clock
    now: float  # the end of its last step
    kv_used: int
    counts: dict[str, int]  # StepModel.counts


@dataclass
class GroupOutcome:
    """What a forked process that simulated some replicas sends back: their parts, and the
    request state, engine columns, token runs and counter events of the rows routed to them."""

    rows: np.ndarray
    state: dict[str, np.ndarray]  # RequestState's per-row arrays (MERGED_STATE) at `rows`
    generated: np.ndarray
    ended: int
    request_columns: dict[str, np.ndarray]  # at `rows`
    tokens: TokenRuns
    parts: dict[int, ReplicaPart]  # by replica
    counter_events: dict[int, pd.DataFrame]  # by replica (its policy), when it keeps counters


# RequestState's per-row arrays a process's outcome carries (its `generated` is a list)
MERGED_STATE = (
    "arrival",
    "status",
    "reason",
    "admitted_at",
    "first_token_at",
    "finished_at",
    "replica",
)

BUSY, IDLE, HELD, DONE = range(4)  # how a standalone replica's burst of steps ended
ABORTED = "aborted"  # the reason of a request whose client went away (live mode)


class Runner:
    def __init__(
        self,
        trace: Trace,
        policy: Policy,
        cost: StepCostModel,
        engine: EngineConfig,
        cluster: ClusterConfig | None = None,
        progress: Progress | None = None,
        pushed: bool = False,
        spill: SpillPlan | None = None,
    ) -> None:
        cluster = cluster or ClusterConfig()
        self.trace, self.engine, self.cluster = trace, engine, cluster
        self.horizon = engine.horizon
        self.progress, self._reported = progress, wallclock.monotonic()
        self.state = RequestState(trace)
        self.tokens = TokenRuns()
        self.dispatcher = cluster.make_dispatcher(self.state.client_of)
        self.dispatcher.check(policy)
        n, shared = cluster.replicas, self.dispatcher.shared
        copies = 0 if shared else n - 1  # replica 0 runs the given policy object itself
        self.policies = [policy] + [copy.deepcopy(policy) for _ in range(copies)]
        for p in self.policies:
            p.bind(trace)
        self._cost = cost
        self._refusal = engine.refusals(trace, cost).tolist()
        self.successor = chains(trace)
        self.coupled = not self.dispatcher.static or (trace.chained and n > 1)
        self.pushed = pushed
        self._pushed: set[int] = set()
        self._aborted: set[int] = set()  # online: requests whose client went away
        self._chained = {row for row, _ in self.successor.values()}
        self.frontier = 0.0 if pushed else np.inf  # every arrival before it is known
        first = [] if pushed else first_arrivals(trace).tolist()
        self._feeds = self._make_feeds(first, n)
        client_of = self.state.client_of
        queues = [WaitingQueue(client_of) for _ in range(1 if shared else n)]
        self.queues = queues * n if shared else queues
        per_replica = self.policies * n if shared else self.policies
        fast = engine.fast_forward and not self.coupled
        self.replicas = engine.build(self, per_replica, self.queues, cost, fast)
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
        self._changed: simpy.Event | None = None  # coupled: a release or push to wait for
        self._frontier_moved = self.env.event()
        self._started = False
        self._simulated = list(range(n))  # the replicas this process simulates
        # while forked processes simulate other replicas: the simulated time each has reached
        self._forked: ForkedTasks[GroupOutcome] | None = None
        self._children: dict[int, float] = {}

    # ---- arrivals ---------------------------------------------------------------------------
    def _make_feeds(self, first: list[int], n: int) -> list[Arrivals]:
        arrival = self.trace.arrival
        if self.coupled:
            feed = Arrivals(first, arrival[first].tolist(), self.horizon)
            feed.deliver = self._dispatch
            return [feed] * n
        mine: list[list[int]] = [[] for _ in range(n)]
        for r in first:  # static dispatch: every assignment up front
            mine[self.dispatcher.route(r, [])].append(r)
        self._routed = mine
        feeds = [Arrivals(rows, arrival[rows].tolist(), self.horizon) for rows in mine]
        for i, feed in enumerate(feeds):
            feed.deliver = partial(self._accept, i)
        return feeds

    def feed(self, replica: int) -> Arrivals:
        return self._feeds[replica]

    def _dispatch(self, req: int, now: float) -> None:
        """Coupled replicas: route an arrival when it happens."""
        if self.dispatcher.shared:
            self._accept(0, req, now)  # one queue, one policy; idle replicas wake to pull
            return
        i = self.dispatcher.route(req, self.replicas)
        self.state.replica[req] = i
        self._accept(i, req, now)

    def _accept(self, replica: int, req: int, now: float) -> None:
        """A request arrives at a replica: refused, rejected, or queued."""
        state = self.state
        state.arrival[req] = now  # chained calls learn their time only now
        if req in self._aborted:  # its client left before it arrived here
            self._end(req, now, REJECTED, ABORTED)
            return
        refusal = self._refusal[req]
        if refusal is not None:
            self._end(req, now, REFUSED, refusal)
            return
        queue = self.queues[replica]
        rejection = self.replicas[replica].policy.on_arrival(req, now, queue)
        if rejection is not None:
            self._end(req, now, REJECTED, rejection)
            return
        state.reason[req] = "queued"
        queue.push(req)
        if self.coupled:
            self.queued(replica, now)

    def _release(self, req: int, t: float) -> None:
        feed = self._feeds[0] if self.coupled else self._feeds[self._target(req)]
        feed.release(req, t)
        if self._changed is not None and not self._changed.triggered:
            self._changed.succeed()

    def _target(self, req: int) -> int:
        """Standalone replicas: the replica a chained call or a pushed arrival goes to."""
        return self.dispatcher.route(req, self.replicas) if len(self.replicas) > 1 else 0

    def push(self, rows: Sequence[int], times: Sequence[float] | None = None) -> None:
        """Make trace rows arrive at `times` (default: their trace times), each at or after
        the frontier. Only for a runner made with `pushed=True`; chained calls are still
        released by the runner when their predecessor ends. A static dispatcher assigns
        pushed rows in the order they are pushed."""
        if not self.pushed:
            raise ValueError("Runner.push needs a runner made with pushed=True")
        rows = [int(r) for r in rows]
        for req in rows:
            if not 0 <= req < len(self.trace) or req in self._chained:
                raise ValueError(f"push: row {req} is not a first arrival of the trace")
        at = self.trace.arrival[rows] if times is None else np.asarray(times, float)
        for req, t in zip(rows, at.tolist(), strict=True):
            if not t >= self.frontier:
                raise ValueError(f"push: arrival at {t} s is before the frontier {self.frontier} s")
            if req in self._pushed:
                raise ValueError(f"push: row {req} was pushed before")
            self._pushed.add(req)
            self._release(req, t)

    def fill_row(self, req: int, client: int, prompt_len: int, output_len: int) -> None:
        """A live run learns row `req` of its trace only when that request arrives: write it
        into the trace and the request state, and decide whether the engine can ever run it.
        Push it next."""
        trace, state = self.trace, self.state
        trace.client[req], trace.prompt_len[req], trace.output_len[req] = (
            client,
            prompt_len,
            output_len,
        )
        state.client_of[req], state.prompt[req], state.output[req] = client, prompt_len, output_len
        self._refusal[req] = self.engine.refusals(trace.take(np.array([req])), self._cost)[0]

    def abort(self, req: int, now: float) -> None:
        """Online use: the client of `req` went away. Waiting, it leaves its queue; running, its
        replica drops it at its next step and frees its memory; not yet delivered, it never
        arrives. It ends as rejected, reason `aborted`."""
        if self.state.status[req] != IN_FLIGHT:
            return
        self._aborted.add(req)
        for queue in {id(q): q for q in self.queues}.values():
            if req in queue:
                queue.remove(req)
                self._end(req, now, REJECTED, ABORTED)
                return
        if self.state.reason[req] != "not_arrived":  # running, or in a step being formed:
            for rep in self.replicas:  # the replica running it drops it at its next step
                rep.abort(req)

    def aborted(self, replica: int, req: int, now: float) -> None:
        """A replica dropped an aborted running request (its memory is free)."""
        self._end(req, now, REJECTED, ABORTED)

    # ---- endings ----------------------------------------------------------------------------
    def _end(self, req: int, now: float, status: int, reason: str) -> None:
        self.state.end(req, status, reason)
        self._released(req, now)

    def reject(self, req: int, now: float, reason: str) -> None:
        self._end(req, now, REJECTED, reason)

    def finish(self, replica: int, rows: list[int], now: float) -> None:
        self.state.complete(rows, now)
        policy = self.replicas[replica].policy
        if Finished in policy.charged:
            for r in rows:
                policy.charge(Finished(r, now))
        if self.dispatcher.tracks_load or self.successor:
            for r in rows:
                self._released(r, now)

    def _released(self, req: int, now: float) -> None:
        """`req` ended: it no longer loads its replica, and a chained successor is sent after
        its think time."""
        if self.dispatcher.tracks_load:
            self.dispatcher.released(req, int(self.state.replica[req]))
        nxt = self.successor.get(req)
        if nxt is not None:
            self._release(nxt[0], now + nxt[1])

    def queued(self, replica: int, now: float) -> None:
        """Wake the replicas that may pull from `replica`'s queue: they resume at `now` exactly
        (SimPy's clock adds relative delays, so it may differ from `now` in the last bit)."""
        for i in range(len(self.replicas)) if self.dispatcher.shared else (replica,):
            wake = self._wake[i]
            if wake is not None and not wake.triggered:
                wake.succeed(now)

    # ---- running ----------------------------------------------------------------------------
    def run(self) -> Timeline:
        """Run to the end (offline) and return the timeline."""
        groups = self._process_groups()
        if len(groups) > 1:
            return self._run_in_processes(groups)
        return self.close()

    def _process_groups(self) -> list[list[int]]:
        """The replicas each process simulates: all in this one unless `cluster.processes` > 1
        and the replicas run standalone (static dispatch, offline, no spill)."""
        n = len(self.replicas)
        k = min(self.cluster.process_count, n)
        alone = not (self.coupled or self.pushed or self._started)
        if k < 2 or not alone or self.spill is not None or not can_fork():
            return [list(range(n))]
        return [list(range(j, n, k)) for j in range(k)]

    def _run_in_processes(self, groups: list[list[int]]) -> Timeline:
        if self.progress is not None:  # the progress line sees every process's requests end
            state = self.state
            state.status = shared_copy(state.status)
            state.first_token_at = shared_copy(state.first_token_at)
            state.finished_at = shared_copy(state.finished_at)
        tasks = ForkedTasks(
            lambda k, post: self._simulate_group(groups[k], post),
            len(groups),
            self._child_progress,
        )
        self._forked, self._children = tasks, {}
        outcomes = tasks.run(lambda: self._tick(self.env.now))
        self._forked = None
        parts: dict[int, ReplicaPart] = {}
        events: dict[int, pd.DataFrame] = {}
        columns = self.replicas[0].request_columns()  # this process's rows (group 0) are set
        for k, outcome in enumerate(outcomes):
            parts.update(outcome.parts)
            events.update(outcome.counter_events)
            if k > 0:
                self._merge(outcome, columns)
        counters = _counters([events.get(i) for i in range(len(self.policies))])
        ordered = [parts[i] for i in range(len(self.replicas))]
        if self.progress is not None:
            self._report(max(part.now for part in ordered), done=True)
        return self._assemble(ordered, counters, columns)

    def _simulate_group(self, group: list[int], post: Post | None) -> GroupOutcome:
        """Simulate replicas `group` alone to the end: in this process (`post` None), or in a
        forked one, whose progress reports are posted to this one."""
        self._simulated = group
        if post is not None:  # a forked process: its reports go to the parent
            self._forked = None
            if self.progress is not None:  # its statuses and times are in shared memory
                self.progress = lambda snap: post(snap.now)
        self.frontier = np.inf
        self._advance_env(None)
        reps = [self.replicas[i] for i in group]
        for rep in reps:
            rep.close()
            rep.steps.close()
        state = self.state
        self.tokens.close_all(state.generated)
        rows = np.array(sorted(r for i in group for r in self._routed[i]), dtype=np.int64)
        columns = self.replicas[0].request_columns()
        return GroupOutcome(
            rows=rows,
            state={name: getattr(state, name)[rows] for name in MERGED_STATE},
            generated=np.asarray(state.generated, dtype=np.int64)[rows],
            ended=state.ended,
            request_columns={name: col[rows] for name, col in columns.items()},
            tokens=self.tokens,
            parts={rep.index: self._part(rep) for rep in reps},
            counter_events={
                i: p.counter_events()
                for i in group
                if isinstance(p := self.policies[i], CounterPolicy)
            },
        )

    def _child_progress(self, k: int, now: float) -> None:
        """A forked process's progress: the simulated time it has reached."""
        self._children[k] = now

    def _merge(self, outcome: GroupOutcome, request_columns: dict[str, np.ndarray]) -> None:
        """Take what another process simulated: its rows' state, columns and token runs."""
        state, rows = self.state, outcome.rows
        for name in MERGED_STATE:
            getattr(state, name)[rows] = outcome.state[name]
        for row, generated in zip(rows.tolist(), outcome.generated.tolist(), strict=True):
            state.generated[row] = generated
        state.ended += outcome.ended
        for name, col in request_columns.items():
            col[rows] = outcome.request_columns[name]
        self.tokens.absorb(outcome.tokens)

    def run_until(self, t: float) -> None:
        """Advance to time `t`: every arrival before `t` has been pushed."""
        if t < self.frontier:
            raise ValueError(f"run_until: {t} s is before the frontier {self.frontier} s")
        self.frontier = t
        self._advance_env(t)

    def next_event(self) -> float:
        """Online use: the earliest simulated time at which a step may end or a known arrival
        come (inf: nothing until something is pushed)."""
        ends = [plan.end for plan in self._held if plan is not None]
        ends += [t for t in self._stepping if t is not None]
        # an arrival before the frontier waits only for the step under way to end
        ends += [t for t in (feed.next_time() for feed in self._feeds) if t >= self.frontier]
        return float(min(ends, default=np.inf))

    def close(self) -> Timeline:
        """No more arrivals will be pushed: run to completion (or the horizon)."""
        self.frontier = np.inf
        self._advance_env(None)
        if self.progress is not None:
            self._report(self.env.now, done=True)
        return self._timeline()

    def _advance_env(self, until: float | None) -> None:
        if not self._started:
            self._started = True
            if self.coupled:
                self.env.process(self._arrivals())
            for i in self._simulated:
                rep = self.replicas[i]
                self.env.process(self._coupled(rep) if self.coupled else self._standalone(rep))
        moved, self._frontier_moved = self._frontier_moved, self.env.event()
        moved.succeed()
        if until is not None and until <= self.env.now:
            return
        self.env.run(until)

    def _tick(self, now: float) -> None:
        """Report progress about once a second of wall time (replicas call this every loop)."""
        if self.progress is None or wallclock.monotonic() - self._reported < 1.0:
            return
        self._report(now)

    def _report(self, now: float, done: bool = False) -> None:
        assert self.progress is not None
        self._reported = wallclock.monotonic()
        state, ended = self.state, self.state.ended
        if self._forked is not None:  # this process simulates some replicas, forked ones the rest
            self._forked.drain()
            now = min([now, *self._children.values()])  # reached by every process
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
            nxt = self._next_arrival(rep)  # idle: sleep until the next arrival
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
        for _ in range(MAX_RUN_SEGMENTS):
            plan = self._held[i]
            if plan is None:
                if self.progress is not None:
                    self._tick(rep.now)
                if horizon is not None and rep.now >= horizon:
                    return DONE
                plan = rep.schedule(self.frontier)
                if plan is None:
                    return IDLE
            if plan.end >= self.frontier:
                self._held[i] = plan
                return HELD
            self._held[i] = None
            rep.apply(plan)
        return BUSY

    def _coupled(self, rep: StepModel) -> Generator[simpy.Event, float, None]:
        """Coupled replicas: decide at a step's start, apply at its end, one step at a time."""
        env, feed = self.env, self._feeds[rep.index]
        while True:
            self._tick(rep.now)
            feed.ingest(rep.now)
            if self._past_horizon(rep.now):
                return
            plan = rep.schedule(self.frontier)
            if plan is None:
                wake = self._wake[rep.index] = env.event()
                rep.now = yield wake  # the time of the arrival (or preemption) that woke it
                self._wake[rep.index] = None
                continue
            # simulated time reaches plan.end only once the frontier has passed it
            self._stepping[rep.index] = plan.end
            yield env.timeout(max(0.0, plan.end - env.now))
            self._stepping[rep.index] = None
            rep.apply(plan)  # now = plan.end
            yield env.timeout(0)  # every replica applies its step before any decides

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
        parts = [self._part(rep) for rep in self.replicas]
        counters = None
        if self.spill is None:
            events = [
                p.counter_events() if isinstance(p, CounterPolicy) else None for p in self.policies
            ]
            counters = _counters(events)
        return self._assemble(parts, counters, self.replicas[0].request_columns())

    def _part(self, rep: StepModel) -> ReplicaPart:
        return ReplicaPart(
            steps={} if self.spill is not None else rep.steps.columns(),
            clock=rep.token_clock(rep.steps.clock_columns()),
            now=rep.now,
            kv_used=rep.kv_used(),
            counts=rep.counts(),
        )

    def _assemble(
        self,
        parts: list[ReplicaPart],
        counters: pd.DataFrame | None,
        engine_columns: dict[str, np.ndarray],
    ) -> Timeline:
        state = self.state
        clocks = [part.clock for part in parts]
        if self.spill is not None:
            steps: dict[str, np.ndarray] = {}
        else:
            cols = [part.steps for part in parts]
            # one replica's columns are the run's: no copy of 57 bytes a step (a 100,000-request
            # overload run records 1.6M steps; its simulation peaks at 518 MB instead of 593 MB)
            steps = (
                cols[0]
                if len(cols) == 1
                else {k: np.concatenate([c[k] for c in cols]) for k in cols[0]}
            )
            steps["replica"] = np.repeat(np.arange(len(parts)), [c["end"].shape[0] for c in cols])
        offsets = np.cumsum([0] + [c.shape[0] for c in clocks])
        counts: dict[str, int] = {}
        for part in parts:
            for name, value in part.counts.items():
                counts[name] = counts.get(name, 0) + value
        return Timeline(
            trace=self.trace,
            arrival=state.arrival,
            status=state.status,
            reason=state.reason,
            admitted_at=state.admitted_at,
            first_token_at=state.first_token_at,
            finished_at=state.finished_at,
            generated=np.asarray(state.generated, dtype=np.int64),
            steps=steps,
            token_runs=self.tokens.columns(offsets[:-1]),
            token_clock=clocks[0] if len(clocks) == 1 else np.concatenate(clocks),
            pool_tokens=self.replicas[0].pool_tokens,
            counters=counters,
            counter_logs=_counter_logs(self.policies) if self.spill else None,
            info={
                "engine": self.engine.name,
                "end_time": max(part.now for part in parts),
                "replicas": len(parts),
                "dispatcher": self.cluster.dispatcher,
                "kv_used_at_end": sum(part.kv_used for part in parts),
                **self.engine.info(),
                **counts,
            },
            request_columns={"replica": state.replica, **engine_columns},
            step_files=(
                None if self.spill is None else [rep.steps.spill_file() for rep in self.replicas]
            ),
        )


def _counters(events: list[pd.DataFrame | None]) -> pd.DataFrame | None:
    """The counter events of every policy (by index; None: it keeps no counters), with the
    replica of each when there are several policies."""
    frames = []
    for i, f in enumerate(events):
        if f is not None:
            frames.append(f.assign(replica=i) if len(events) > 1 else f)
    if not frames:
        return None
    return pd.concat(frames, ignore_index=True)


def _counter_logs(policies: list[Policy]) -> list[CounterLog] | None:
    logs = [p.counter_log() for p in policies if isinstance(p, CounterPolicy)]
    return logs or None


def simulate(
    trace: Trace,
    policy: Policy,
    cost_model: StepCostModel,
    engine: EngineConfig | None = None,
    cluster: ClusterConfig | None = None,
    progress: Progress | None = None,
    spill: SpillPlan | None = None,
) -> Timeline:
    """Run `trace` under `policy` on the configured engine (S-LoRA by default), on
    `cluster.replicas` replicas behind its dispatcher, and return one timeline (requests and
    steps carry their replica). With `spill`, step records go to disk as the run goes."""
    engine = SLoRAConfig() if engine is None else engine
    return Runner(trace, policy, cost_model, engine, cluster, progress, spill=spill).run()
