"""The S-LoRA router engine the VTC and FairServe papers measured (spec: engine.md section 1).

One iteration is one GPU step. With nothing running the scheduler is asked at once and an admitted
mini-batch is prefilled; after a prefill the batch decodes `max_wait_tokens` steps before the
scheduler is asked again, and from then on it is asked before every step. Admitting a mini-batch
makes that step a prefill-only step. No chunked prefill, no preemption; the server knows each
request's output length, and the fit test below keeps the KV pool from ever running out.

KV accounting is token-granular: a running request holds prompt + generated - 1 tokens (the newest
token's KV is written by the next decode step), at most prompt + output - 1, freed on finish.

Event order at one instant: arrivals up to time t are processed before the effects (tokens,
charges, finishes) of the step ending at t, and the scheduler decides after both. Arrivals are
taken in (time, row) order.

Chained traces (closed-loop users, multi-call interactions): a call arrives `think_time` after its
predecessor ends, so its arrival time is only known then; it is recorded in the timeline.

Fast-forward: when nothing can change the schedule (no finish, and no consultation of the
scheduler that could admit) the engine computes many decode steps in one vectorised go; arrivals
falling inside are still processed in order between the steps' effects, so the result is
bit-identical to stepping one by one (`fast_forward=False`).
"""

from __future__ import annotations

import gc
import heapq
import time as wallclock
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass

import numpy as np
import simpy

from cost_models.base import StepCostModel
from policies.base import BasePolicy, Policy
from simulator.arrivals import Arrivals, chains, first_arrivals
from simulator.fit import BatchFit, RunningFit
from simulator.queue import WaitingQueue
from simulator.timeline import (
    COMPLETED,
    DECODE,
    IN_FLIGHT,
    PREFILL,
    REFUSED,
    REJECTED,
    StepLog,
    Timeline,
)
from traces.schema import Trace

MAX_RUN_STEPS = 4096  # cap on one fast-forward run, to bound temporary arrays
MAX_RUN_SEGMENTS = 256  # segments per run, so progress reports keep coming
SHORT_RUN_STEPS = 8  # runs up to this long are timed step by step, longer ones as arrays


@dataclass(frozen=True)
class ProgressSnapshot:
    """What a progress reporter sees about once a second of wall time (arrays are live views:
    read them during the call, do not keep them)."""

    now: float
    finished: int
    total: int
    arrival: np.ndarray
    output_len: np.ndarray
    first_token_at: np.ndarray
    finished_at: np.ndarray


Progress = Callable[[ProgressSnapshot], None]


@dataclass(frozen=True)
class SLoRAConfig:
    """Knobs of the S-LoRA router engine; defaults are the VTC paper's A10G runs (reserve 0)."""

    pool_tokens: int = 10_000
    max_wait_tokens: int = 10
    batch_max_tokens: int = 3072
    running_max_req_size: int = 1000
    reserve_per_client: int = 0
    fast_forward: bool = True
    horizon: float | None = None

    def __post_init__(self) -> None:
        for name in ("pool_tokens", "batch_max_tokens", "running_max_req_size"):
            v = getattr(self, name)
            if int(v) != v or v < 1:
                raise ValueError(f"engine.{name} must be an integer >= 1, got {v!r}")
        for name in ("max_wait_tokens", "reserve_per_client"):
            v = getattr(self, name)
            if int(v) != v or v < 0:
                raise ValueError(f"engine.{name} must be an integer >= 0, got {v!r}")
        if self.reserve_per_client >= self.pool_tokens:
            raise ValueError("engine.reserve_per_client must be smaller than engine.pool_tokens")
        if self.horizon is not None and not (np.isfinite(self.horizon) and self.horizon > 0):
            raise ValueError(f"engine.horizon must be null or a number > 0, got {self.horizon!r}")


def run_without_cyclic_gc(env: simpy.Environment) -> None:
    """Run a simulation with the cyclic garbage collector paused (then restored): engine loops
    allocate many short-lived objects and no reference cycles, so it only costs time (about 6%
    of a run)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        env.run()
    finally:
        if collecting:
            gc.enable()


def refusals(trace: Trace, cfg: SLoRAConfig) -> np.ndarray:
    """Per request, why the engine can never run it (None: it can): its peak KV need exceeds the
    pool less one reservation, or its prompt exceeds the prefill budget."""
    too_big = trace.prompt_len + trace.output_len + 1 > cfg.pool_tokens - cfg.reserve_per_client
    too_long = trace.prompt_len > cfg.batch_max_tokens
    reason = np.full(len(trace), None, dtype=object)
    reason[too_long] = "prompt_exceeds_batch_max_tokens"
    reason[too_big] = "kv_pool_too_small"  # checked first
    return reason


def unfit_requests(trace: Trace, cfg: SLoRAConfig) -> dict[str, int]:
    """How many requests the engine will refuse at arrival, by reason, so a run can report them
    before it starts."""
    return dict(sorted(Counter(r for r in refusals(trace, cfg).tolist() if r is not None).items()))


class SLoRAEngine:
    """Runs one trace through the engine as a SimPy process and records its timeline."""

    def __init__(
        self,
        trace: Trace,
        policy: Policy,
        cost: StepCostModel,
        config: SLoRAConfig,
        progress: Progress | None = None,
    ) -> None:
        self.trace, self.policy, self.cost, self.cfg = trace, policy, cost, config
        # policies that leave on_decode alone (FCFS, RPM) need no per-step calls
        self.charges_decode = type(policy).on_decode is not BasePolicy.on_decode
        self.progress = progress
        n = len(trace)
        self.prompt = trace.prompt_len
        self.output = trace.output_len
        self.client = trace.client
        # arrival times as they happen (NaN until then); chained calls wait for their predecessor
        first = first_arrivals(trace)
        self.arrival = np.full(n, np.nan)
        self.arrival[first] = trace.arrival[first]
        self._successor = chains(trace)
        self.arrivals = Arrivals(first.tolist(), trace.arrival[first].tolist(), config.horizon)
        self.arrivals.deliver = self._arrive
        # Python scalars: fast access in the loop
        self._prompt, self._output = trace.prompt_len.tolist(), trace.output_len.tolist()
        self._client_of = trace.client.tolist()
        self._refusal = refusals(trace, config).tolist()
        self.queue = WaitingQueue(self._client_of)
        self.status = np.full(n, IN_FLIGHT, dtype=np.int8)
        self.reason = np.full(n, "not_arrived", dtype=object)
        self.admitted_at = np.full(n, np.nan)
        self.first_token_at = np.full(n, np.nan)
        self.finished_at = np.full(n, np.nan)
        self.first_decode = np.full(n, -1, dtype=np.int64)
        self.finish_decode = np.full(n, -1, dtype=np.int64)  # decode count when it finishes
        self.steps = StepLog()
        # running requests in admission order: rows (trace row, client, finish decode count)
        self._run_table = np.empty((3, 0), dtype=np.int64)
        self.running = self._run_table[0]  # their trace rows
        self._admitted = 0  # admissions so far: ties in the finish heap keep admission order
        # heap of (decode count at which it finishes, admission number, trace row)
        self._finishes: list[tuple[int, int, int]] = []
        self._fit: RunningFit | None = None  # fit-test state; finishes keep it valid
        self.running_clients: dict[int, int] = {}
        self.now = 0.0
        self.decodes = 0  # decode steps so far
        self.wait_steps = 0  # decode steps since the last prefill (capped at max_wait_tokens)
        self.kv_used = 0
        self.finished = 0

    # ---- public -------------------------------------------------------------------------
    def run(self) -> Timeline:
        self.policy.bind(self.trace)
        env = simpy.Environment()
        env.process(self._loop(env))
        run_without_cyclic_gc(env)
        horizon = self.cfg.horizon
        self.arrivals.ingest(self.now if horizon is None else max(self.now, horizon))
        self.reason[self.running] = "running"
        generated = np.where(
            self.first_decode >= 0, np.minimum(self.decodes - self.first_decode + 1, self.output), 0
        )
        return Timeline(
            trace=self.trace,
            arrival=self.arrival,
            status=self.status,
            reason=np.where(self.status == COMPLETED, np.array(None), self.reason),
            admitted_at=self.admitted_at,
            first_token_at=self.first_token_at,
            finished_at=self.finished_at,
            generated=generated.astype(np.int64),
            first_decode=self.first_decode,
            steps=self.steps.columns(),
            pool_tokens=self.cfg.pool_tokens,
            counters=self.policy.counter_events(),
            info={
                "engine": "slora",
                "end_time": self.now,
                "decode_steps": self.decodes,
                "kv_used_at_end": self.kv_used,
            },
        )

    # ---- the loop -----------------------------------------------------------------------
    def _loop(self, env: simpy.Environment) -> Generator[simpy.Event, None, None]:
        cfg = self.cfg
        last_report = wallclock.monotonic()
        while True:
            if self.progress is not None and wallclock.monotonic() - last_report > 1.0:
                last_report = wallclock.monotonic()
                self.progress(self._snapshot())
            self.arrivals.ingest(self.now)
            if cfg.horizon is not None and self.now >= cfg.horizon:
                return
            idle = not self.running.shape[0]
            if idle or (self.wait_steps >= cfg.max_wait_tokens and len(self.queue)):
                batch = self._form_batch()
                if batch:
                    yield from self._prefill(env, batch)
                    continue
            if not self.running.shape[0]:
                nxt = self.arrivals.next_time()
                if nxt == np.inf:
                    return
                if cfg.horizon is not None and nxt > cfg.horizon:
                    return
                yield env.timeout(max(0.0, nxt - env.now))
                self.now = nxt
                continue
            yield from self._decode_run(env)

    def _snapshot(self) -> ProgressSnapshot:
        t = self.trace
        return ProgressSnapshot(
            self.now,
            self.finished,
            len(t),
            self.arrival,
            t.output_len,
            self.first_token_at,
            self.finished_at,
        )

    def _release_successor(self, req: int, ended_at: float) -> None:
        """A chained trace's next call of `req`'s interaction is sent after the think time."""
        nxt = self._successor.get(req)
        if nxt is not None:
            self.arrivals.release(nxt[0], ended_at + nxt[1])

    def _arrive(self, req: int, now: float) -> None:
        self.arrival[req] = now  # chained calls learn their time only now
        refusal = self._refusal[req]
        if refusal is not None:
            self._end(req, now, REFUSED, refusal)
            return
        rejection = self.policy.on_arrival(req, now, self.queue)
        if rejection is not None:
            self._end(req, now, REJECTED, rejection)
            return
        self.reason[req] = "queued"
        self.queue.push(req)

    def _end(self, req: int, now: float, status: int, reason: str | None) -> None:
        """Refused or rejected at its arrival."""
        self.status[req] = status
        self.reason[req] = reason
        self.finished += 1
        if self._successor:
            self._release_successor(req, now)

    # ---- admission ----------------------------------------------------------------------
    def _form_batch(self) -> list[int]:
        """Ask the policy for requests until one does not fit (then stop: no look-ahead)."""
        batch: list[int] = []
        tokens = 0
        if self._fit is None:
            rows = self.running
            self._fit = RunningFit(
                self.prompt[rows], self.first_decode[rows], self.finish_decode[rows]
            )
        fit = self._fit.batch(self.decodes)  # counts in each admitted member
        clients = set(self.running_clients)
        while len(self.queue):
            req = self.policy.pick(self.queue, self.now)
            if req is None:
                break
            dropped = self.policy.screen(req, self.now)
            if dropped is not None:
                self._drop(req, dropped)
                continue
            p, o, c = self._prompt[req], self._output[req], self._client_of[req]
            if not self._fits(fit, clients, p, o, c, tokens, len(batch)):
                throttled = self.policy.on_blocked(req, self.now, self.queue)
                if throttled is not None:
                    self._drop(req, throttled)
                break
            self.queue.remove(req)
            batch.append(req)
            tokens += p
            clients.add(c)
            fit.add(p, o)
            self.policy.on_admit(req, self.now)
        return batch

    def _drop(self, req: int, reason: str) -> None:
        """The policy takes a waiting request out of the queue: rejected, never served."""
        self.queue.remove(req)
        self._end(req, self.now, REJECTED, reason)

    def _fits(
        self, fit: BatchFit, clients: set[int], p: int, o: int, c: int, tokens: int, pending: int
    ) -> bool:
        """S-LoRA's test: peak future KV need < pool - reserve; prefill budget and cap hold."""
        cfg = self.cfg
        if tokens + p > cfg.batch_max_tokens:
            return False
        if self.running.shape[0] + pending >= cfg.running_max_req_size:
            return False
        limit = cfg.pool_tokens
        if cfg.reserve_per_client:
            limit -= cfg.reserve_per_client * (len(clients) + (c not in clients))
        return fit.need(p, o, enough=limit) < limit

    # ---- steps --------------------------------------------------------------------------
    def _prefill(
        self, env: simpy.Environment, batch: list[int]
    ) -> Generator[simpy.Event, None, None]:
        idx = np.asarray(batch, dtype=np.int64)
        prompts = self.prompt[idx]
        start = self.now
        end = start + self.cost.prefill_time(prompts)
        yield env.timeout(max(0.0, end - env.now))
        self.admitted_at[idx] = start
        self.first_token_at[idx] = end
        self.first_decode[idx] = self.decodes
        finish = self.decodes + self.output[idx] - 1
        self.finish_decode[idx] = finish
        for req, f in zip(batch, finish.tolist(), strict=True):
            heapq.heappush(self._finishes, (f, self._admitted, req))
            self._admitted += 1
        clients = self.client[idx]
        joined = np.array((idx, clients, finish))
        self._set_running(np.concatenate((self._run_table, joined), axis=1))
        self._fit = None  # requests joined: rebuilt when the next fit test needs it
        for c in clients.tolist():
            self.running_clients[c] = self.running_clients.get(c, 0) + 1
        tokens = int(prompts.sum())
        self.kv_used += tokens  # the first output token has no KV yet
        self._check_pool()
        self.steps.append_run(start, [end], PREFILL, len(batch), tokens, self.kv_used, 0)
        self.now = end
        self.wait_steps = 0
        self.arrivals.ingest(end)
        self._finish_due()

    def _plan_run(self) -> int:
        """Upper bound on decode steps before anything could change the schedule."""
        cfg = self.cfg
        until_finish = self._finishes[0][0] - self.decodes
        if not cfg.fast_forward:
            return 1
        if self.running.shape[0] >= cfg.running_max_req_size:
            return min(until_finish, MAX_RUN_STEPS)  # nothing can be admitted before a finish
        wait_left = cfg.max_wait_tokens - self.wait_steps
        if len(self.queue):
            return min(until_finish, max(wait_left, 1), MAX_RUN_STEPS)
        return min(until_finish, MAX_RUN_STEPS)

    def _step_ends(self, n: int, k: int) -> list[float]:
        """End times of the next decode steps of `n` requests: at most `k`, cut at the next
        arrival that could be admitted and at the horizon."""
        cfg = self.cfg
        if k <= SHORT_RUN_STEPS:  # the common case: scalar arithmetic beats array set-up
            end, ends = self.now, []
            for j in range(1, k + 1):  # the same additions, in the same order, as the cumsum
                end += self.cost.decode_time(n, self.kv_used + n * j)
                ends.append(end)
        else:
            context = self.kv_used + n * np.arange(1, k + 1, dtype=np.int64)  # KV read per step
            times = self.cost.decode_times(n, context)
            ends = np.cumsum(np.concatenate(([self.now], times)))[1:].tolist()
        room = n < cfg.running_max_req_size
        nxt = self.arrivals.next_time()
        if room and not len(self.queue) and nxt < np.inf:
            # stop at the step whose end sees the next arrival, unless still inside the wait
            seen = bisect_left(ends, nxt) + 1
            k = min(k, max(cfg.max_wait_tokens - self.wait_steps, seen))
        if cfg.horizon is not None:  # no step starts at or after the horizon (now < horizon)
            k = min(k, 1 + bisect_left(ends, cfg.horizon, 0, k - 1))
        return ends[:k]

    def _decode_run(self, env: simpy.Environment) -> Generator[simpy.Event, None, None]:
        """Decode until the loop has something else to do, then let simulated time catch up.

        Segments end at finishes (the batch changes) and at admissible arrivals; the loop's
        other work (the scheduler, an idle engine, the horizon) is checked between segments.
        With fast-forward off, every step is its own run.
        """
        for _ in range(MAX_RUN_SEGMENTS):
            self._decode_segment()
            if not (self.cfg.fast_forward and self._keeps_decoding()):
                break
        yield env.timeout(max(0.0, self.now - env.now))

    def _keeps_decoding(self) -> bool:
        """Whether the loop's next iteration would only decode again."""
        cfg = self.cfg
        if not self.running.shape[0]:
            return False
        if cfg.horizon is not None and self.now >= cfg.horizon:
            return False
        return not (self.wait_steps >= cfg.max_wait_tokens and len(self.queue))

    def _decode_segment(self) -> None:
        """Decode steps with a fixed batch; arrivals inside take effect between steps."""
        cfg = self.cfg
        n = self.running.shape[0]
        ends = self._step_ends(n, self._plan_run())
        k = len(ends)
        last = ends[-1]
        clients = self._run_table[1]
        done = 0
        limit = last if cfg.horizon is None else min(last, cfg.horizon)
        while self.arrivals.next_time() <= limit:
            t = self.arrivals.next_time()
            if self.charges_decode:
                j = bisect_left(ends, t)
                if j > done:  # steps ending before this arrival take effect first
                    self.policy.on_decode(self.running, clients, np.array(ends[done:j]))
                    done = j
            self.arrivals.ingest(t)
        if self.charges_decode:
            self.policy.on_decode(self.running, clients, np.array(ends[done:]))

        self.steps.append_run(self.now, ends, DECODE, n, n, self.kv_used + n, n)
        self.decodes += k
        self.kv_used += n * k
        self._check_pool()
        self.wait_steps = min(cfg.max_wait_tokens, self.wait_steps + k)
        self.now = last
        self._finish_due()

    def _finish_due(self) -> None:
        """Release every running request that has produced its last token."""
        finishes = self._finishes
        if not finishes or finishes[0][0] != self.decodes:
            return
        rows = []  # in admission order, as in the running set
        while finishes and finishes[0][0] == self.decodes:
            rows.append(heapq.heappop(finishes)[2])
        table = self._run_table
        self._set_running(table.compress(table[2] != self.decodes, axis=1))
        self.finished += len(rows)
        for req in rows:
            self.finished_at[req] = self.now
            self.status[req] = COMPLETED
            self.reason[req] = None
            self.kv_used -= self._prompt[req] + self._output[req] - 1
            c = self._client_of[req]
            self.running_clients[c] -= 1
            if not self.running_clients[c]:
                del self.running_clients[c]
        for req in rows:
            self.policy.on_finish(req, self.now)
            if self._successor:
                self._release_successor(req, self.now)

    def _set_running(self, table: np.ndarray) -> None:
        """Replace the running set (rows: trace row, client, finish decode count)."""
        self._run_table = table
        self.running = table[0]

    def _check_pool(self) -> None:
        if self.kv_used > self.cfg.pool_tokens:
            raise RuntimeError(
                f"KV pool over-committed: {self.kv_used} > {self.cfg.pool_tokens} tokens "
                "(the fit test should make this impossible; please report it)"
            )
