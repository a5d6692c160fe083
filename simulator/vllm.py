"""The vLLM-v1-style engine (spec: engine.md section 2): one replica of a cluster.

Each step has one token budget (`max_num_batched_tokens`) and a cap on running requests
(`max_num_seqs`). Running requests are served first, in order: each catches its computed tokens
up to its tokens (prompt + generated), so a decode takes one token and a prompt is cut into
chunks that fit the budget. KV memory is paged (simulator/kv_blocks.py); when a running request's
blocks cannot be allocated the policy names a victim (FCFS: the tail of running), which loses its
KV (recompute), goes back to the head of the waiting queue and later re-prefills prompt +
generated tokens. Waiting requests are admitted, in the policy's order, only in a step that
preempted nothing, and only while their blocks fit (keeping `watermark` of the pool free while
anything runs); the first that does not fit stops admission. The engine never looks at output
lengths: a request simply finishes when its last token is sampled.

Requests that can never finish (their final KV exceeds the whole pool) are refused on arrival.

Service charged to policies: computed prompt tokens as their chunk is scheduled (`on_prompt`; a
prefix-cache hit is free; recomputation after a preemption only with `charge_recompute`), every
output token after the first when it is sampled (`on_decode`).

Event order at one instant, as in the S-LoRA engine: arrivals at t, then the effects of the step
ending at t, then the next step's decisions. Standalone (one replica, or replicas whose requests
are assigned up front) the engine advances many decode steps at once when nothing can change the
batch ("fast-forward"), with the same timeline as stepping one by one. Coupled replicas (shared
queue, load-aware dispatch, chained calls) step one at a time: decide at the start, apply at the
end, so every replica sees the others exactly as of that instant.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Generator
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING

import numpy as np
import simpy

from cost_models.base import StepCostModel, mixed_step_time
from policies.base import BasePolicy, Policy
from simulator.arrivals import Arrivals
from simulator.kv_blocks import BlockPool, block_keys
from simulator.queue import WaitingQueue
from simulator.timeline import COMPLETED, DECODE, MIXED, PREFILL, REFUSED, REJECTED
from traces.schema import Trace

if TYPE_CHECKING:
    from simulator.cluster import RequestLog

MAX_RUN_STEPS = 4096
MAX_RUN_SEGMENTS = 256  # standalone: steps or runs taken before simulated time catches up
SHORT_RUN_STEPS = 24  # runs up to this long are timed in floats, longer ones as arrays


@dataclass(frozen=True)
class VLLMConfig:
    """Knobs of one vLLM-style replica. `pool_tokens` null: the cost model's KV capacity (GPU
    memory less weights), which the roofline models provide."""

    pool_tokens: int | None = None
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    watermark: float = 0.0
    prefix_caching: bool = True
    charge_recompute: bool = False
    fast_forward: bool = True
    horizon: float | None = None

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_batched_tokens", "max_num_seqs"):
            v = getattr(self, name)
            if int(v) != v or v < 1:
                raise ValueError(f"engine.{name} must be an integer >= 1, got {v!r}")
        if self.pool_tokens is not None and (
            int(self.pool_tokens) != self.pool_tokens or self.pool_tokens < self.block_size
        ):
            raise ValueError(
                f"engine.pool_tokens must be null or an integer >= engine.block_size "
                f"({self.block_size}), got {self.pool_tokens!r}"
            )
        if not (0.0 <= self.watermark < 1.0):
            raise ValueError(f"engine.watermark must be in [0, 1), got {self.watermark!r}")
        if self.horizon is not None and not (np.isfinite(self.horizon) and self.horizon > 0):
            raise ValueError(f"engine.horizon must be null or a number > 0, got {self.horizon!r}")

    def num_blocks(self, cost: StepCostModel) -> int:
        if self.pool_tokens is not None:
            return int(self.pool_tokens) // self.block_size
        capacity = getattr(cost, "kv_capacity_tokens", None)
        if capacity is None:
            raise ValueError(
                "engine.pool_tokens is null but the cost model "
                f"({type(cost).__name__}) cannot derive a KV capacity; set engine.pool_tokens "
                "or use cost_model=roofline / vidur_profile"
            )
        return int(capacity()) // self.block_size


def too_big(trace: Trace, block_size: int, num_blocks: int) -> np.ndarray:
    """Per request, whether it can never finish on one replica: its final KV (prompt + output
    - 1 tokens) needs more blocks than the pool has."""
    return -(-(trace.prompt_len + trace.output_len - 1) // block_size) > num_blocks


def unfit_requests(trace: Trace, cfg: VLLMConfig, cost: StepCostModel) -> dict[str, int]:
    """How many requests the engine will refuse on arrival, to report before a run."""
    count = int(too_big(trace, cfg.block_size, cfg.num_blocks(cost)).sum())
    return {"kv_pool_too_small": count} if count else {}


@dataclass
class Step:
    """One scheduled step: who computes how many tokens, and when it ends."""

    start: float
    rows: list[int]
    new: list[int]
    kind: int
    preempted: int
    end: float = 0.0


class VLLMEngine:
    def __init__(
        self,
        index: int,
        trace: Trace,
        policy: Policy,
        cost: StepCostModel,
        cfg: VLLMConfig,
        log: RequestLog,
        queue: WaitingQueue,
        feed: Arrivals,
        on_finish: Callable[[int, float], None],
    ) -> None:
        self.index, self.trace, self.policy, self.cost, self.cfg = index, trace, policy, cost, cfg
        self.log, self.queue, self.feed, self.notify_finish = log, queue, feed, on_finish
        self.pool = BlockPool(cfg.num_blocks(cost), cfg.block_size, cfg.prefix_caching)
        self.pool_tokens = self.pool.num_blocks * cfg.block_size
        self.watermark_blocks = int(cfg.watermark * self.pool.num_blocks)
        self._too_big = too_big(trace, cfg.block_size, self.pool.num_blocks).tolist()
        self._prompt, self._output = log.prompt, log.output
        self.running: list[int] = []
        # policies that leave on_decode alone (FCFS, RPM) need no per-step arrays
        self.charges_decode = type(policy).on_decode is not BasePolicy.on_decode
        self.now = 0.0
        self.steps = 0
        self.wake: simpy.Event | None = None  # set while idle in a coupled cluster
        self.peers: list[VLLMEngine] = []  # replicas sharing this one's queue (central dispatch)
        self.tick: Callable[[float], None] = lambda now: None  # progress reports
        self._keys: dict[int, list[int]] = {}
        self.prefilling: set[int] = set()  # running requests whose (re)prefill is not done
        self.stalled: set[int] = set()  # decoding requests a step left out (token run ended)
        # step records, compact: every end and KV, and per run of equal steps (first start,
        # steps, kind, batch size, tokens, preempted)
        self._ends = array("d")
        self._kv = array("q")
        self._runs = array("d")

    # ---- arrivals -------------------------------------------------------------------------
    def accept(self, req: int, now: float) -> None:
        """A request dispatched to this replica arrives (refused, rejected or queued)."""
        log = self.log
        log.arrival[req] = now  # chained calls learn their time only now
        if self._too_big[req]:
            log.end(req, now, REFUSED, "kv_pool_too_small")
            return
        rejection = self.policy.on_arrival(req, now, self.queue)
        if rejection is not None:
            log.end(req, now, REJECTED, rejection)
            return
        log.reason[req] = "queued"
        self.queue.push(req)
        self.wake_if_idle()
        for peer in self.peers:
            peer.wake_if_idle()

    def wake_if_idle(self) -> None:
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def keys(self, req: int) -> list[int]:
        if not self.pool.caching or self.trace.block_hashes is None:
            return []
        keys = self._keys.get(req)
        if keys is None:
            keys = block_keys(
                self.trace.block_hashes[req],
                self.trace.hash_block_tokens,
                self.cfg.block_size,
                self._prompt[req],
            )
            self._keys[req] = keys
        return keys

    # ---- the loop -------------------------------------------------------------------------
    def process(self, env: simpy.Environment) -> Generator[simpy.Event, None, None]:
        if self.feed.coupled:
            yield from self._coupled(env)
            return
        while True:
            busy = self._advance()
            yield env.timeout(max(0.0, self.now - env.now))
            if busy:
                continue
            nxt = self.feed.next_time()  # idle: sleep until the next arrival
            if nxt == np.inf or (self.cfg.horizon is not None and nxt > self.cfg.horizon):
                return
            yield env.timeout(max(0.0, nxt - env.now))
            self.now = nxt

    def _advance(self) -> bool:
        """Standalone: take steps (or fast-forward runs) one after another, up to
        MAX_RUN_SEGMENTS of them, then let simulated time catch up; nobody else reads this
        replica's state, so it may run ahead. False: idle (or past the horizon)."""
        horizon = self.cfg.horizon
        for _ in range(MAX_RUN_SEGMENTS):
            self.tick(self.now)
            self.feed.ingest(self.now)
            if horizon is not None and self.now >= horizon:
                return False
            if self.cfg.fast_forward and self._can_run() and self._decode_run():
                continue
            step = self._schedule() if (self.running or len(self.queue)) else None
            if step is None:
                return False
            self.feed.ingest(step.end)
            self._apply(step)
        return True

    def _coupled(self, env: simpy.Environment) -> Generator[simpy.Event, None, None]:
        """Coupled replicas: decide at a step's start, apply at its end, one step at a time."""
        horizon = self.cfg.horizon
        while True:
            self.tick(self.now)
            self.feed.ingest(self.now)
            if horizon is not None and self.now >= horizon:
                return
            step = self._schedule() if (self.running or len(self.queue)) else None
            if step is None:
                self.wake = env.event()
                yield self.wake
                self.wake = None
                self.now = env.now
                continue
            yield env.timeout(max(0.0, step.end - env.now))
            self.feed.ingest(step.end)
            self._apply(step)
            yield env.timeout(0)  # every replica applies its step before any decides
            self.now = env.now

    # ---- deciding a step -----------------------------------------------------------------
    def _schedule(self, carried: int = 0) -> Step | None:
        """Decide one step. `carried`: preemptions of an empty step just before (the victim
        was the request being scheduled and came first), recorded with this one."""
        cfg, pool, log = self.cfg, self.pool, self.log
        prompt, computed, gen = self._prompt, log.computed, log.generated
        held, size, prefilling = pool.held, cfg.block_size, self.prefilling
        budget = cfg.max_num_batched_tokens
        running = self.running
        rows: list[int] = []
        new: list[int] = []
        preempted = 0
        i = 0
        n_run = len(running)
        known = 0  # leading rows known to be plain decodes
        if n_run and n_run <= budget and not prefilling and not self.stalled:
            # the common case: every running request decodes one token; those whose last
            # block is full need a new one, and if the pool has them nothing is preempted
            full = [r for r in running if computed[r] == held[r] * size]
            if len(full) <= pool.free:
                for r in full:
                    held[r] += 1
                pool.take(len(full))
                rows, new, i = list(running), [1] * n_run, n_run
                budget -= n_run
                known = n_run
        while i < len(running) and budget > 0:
            r = running[i]
            if r in prefilling:
                n = min(prompt[r] + gen[r] - computed[r], budget)
                fits = pool.grow(r, computed[r] + n)
            else:  # decoding: one token, a new block only when its last one is full
                n = 1
                fits = computed[r] < held[r] * size or pool.grow(r, computed[r] + 1)
            if not fits:
                i, budget, dropped = self._make_room(r, n, i, rows, new, budget)
                preempted += dropped
                if r not in running:
                    break
            rows.append(r)
            new.append(n)
            budget -= n
            i += 1
        if not preempted:
            budget = self._admit(rows, new, budget)
        if not rows:
            if preempted and running:  # an empty step: decide again, with fewer running
                return self._schedule(carried + preempted)
            return None
        return self._timed(rows, new, preempted + carried, known)

    def _make_room(
        self, r: int, n: int, i: int, rows: list[int], new: list[int], budget: int
    ) -> tuple[int, int, int]:
        """Preempt the policy's victims until `r` (the i-th running request) gets blocks for
        `n` more tokens or is itself the victim. Returns (i, budget, preemptions)."""
        running, count = self.running, 0
        while True:
            victim = self.policy.preemption_victim(running)
            v = running.index(victim)
            if v < i:  # already scheduled this step: give its tokens back
                rows.pop(v)
                budget += new.pop(v)
                i -= 1
            self._preempt(victim, v)
            count += 1
            if victim == r or self.pool.grow(r, self.log.computed[r] + n):
                return i, budget, count

    def _admit(self, rows: list[int], new: list[int], budget: int) -> int:
        cfg, pool, log, policy, queue = self.cfg, self.pool, self.log, self.policy, self.queue
        running, now = self.running, self.now
        while len(queue) and budget > 0 and len(running) < cfg.max_num_seqs:
            req = policy.pick(queue, now)
            if req is None:
                break
            dropped = policy.screen(req, now)
            if dropped is not None:
                queue.remove(req)
                log.end(req, now, REJECTED, dropped)
                continue
            total = self._prompt[req] + log.generated[req]  # a resumed request recomputes all
            keys = self.keys(req)
            hit = pool.cached_prefix(keys, total)
            start = hit * cfg.block_size
            n = min(total - start, budget)
            reserve = self.watermark_blocks if running else 0
            if not pool.admit(req, keys, hit, start + n, reserve):
                throttled = policy.on_blocked(req, now, queue)
                if throttled is not None:
                    queue.remove(req)
                    log.end(req, now, REJECTED, throttled)
                break
            queue.remove(req)
            log.computed[req] = start
            log.cached_tokens[req] += start
            log.high_water[req] = max(log.high_water[req], start)
            log.reason[req] = "running"
            log.replica[req] = self.index
            running.append(req)
            self.prefilling.add(req)
            rows.append(req)
            new.append(n)
            budget -= n
            if log.admitted_at[req] != log.admitted_at[req]:  # NaN: its first admission
                log.admitted_at[req] = now
                policy.on_admit(req, now)
        return budget

    def _preempt(self, req: int, position: int) -> None:
        log = self.log
        self.running.pop(position)
        self.prefilling.discard(req)
        self.stalled.discard(req)
        self.pool.release(req)
        log.high_water[req] = max(log.high_water[req], log.computed[req])
        log.computed[req] = 0
        log.preemptions[req] += 1
        log.close_segment(req)
        log.reason[req] = "preempted"
        self.queue.push_front(req)
        for peer in self.peers:
            peer.wake_if_idle()

    def _timed(self, rows: list[int], new: list[int], preempted: int, known: int = 0) -> Step:
        """Charge the scheduled prompt chunks and time the step (the first `known` rows are
        plain decodes)."""
        log, policy, now, prefilling = self.log, self.policy, self.now, self.prefilling
        prompt, computed, hw = self._prompt, log.computed, log.high_water
        chunks: list[tuple[int, int]] = []
        decodes = known
        context = sum([computed[r] for r in rows[:known]]) + known
        for r, n in zip(rows[known:], new[known:], strict=True):
            c = computed[r]
            if r not in prefilling:
                decodes += 1
                context += c + 1
                continue
            chunks.append((n, c))
            fresh = max(0, min(c + n, prompt[r]) - max(c, hw[r]))
            again = max(0, min(c + n, hw[r]) - c)
            charged = fresh + (again if self.cfg.charge_recompute else 0)
            if charged:
                policy.on_prompt(r, charged, now)
            hw[r] = max(hw[r], c + n)
        if chunks:
            kind = MIXED if decodes else PREFILL
            dt = mixed_step_time(self.cost, chunks, decodes, context)
        else:
            kind = DECODE
            dt = self.cost.decode_time(decodes, context)
        return Step(now, rows, new, kind, preempted, now + dt)

    # ---- fast-forward ---------------------------------------------------------------------
    def _can_run(self) -> bool:
        """Whether the next step is plain decoding of the whole running set with nothing to
        admit (then several steps can be taken at once)."""
        cfg, n = self.cfg, len(self.running)
        if not n or self.prefilling or self.stalled or n > cfg.max_num_batched_tokens:
            return False
        return not len(self.queue) or n >= cfg.max_num_seqs

    def _decode_run(self) -> bool:
        """Take as many decode steps as nothing can change: until a finish, a block shortage,
        an arrival that could be admitted, or the horizon. False: not even one step fits the
        free blocks (the general step preempts).

        Short runs are timed step by step in floats, long ones as arrays; both add the same
        step times in the same order, so the timeline does not depend on the split."""
        cfg, log, pool, policy = self.cfg, self.log, self.pool, self.policy
        b = cfg.block_size
        rows = list(self.running)
        n = len(rows)
        computed, gen, out = log.computed, log.generated, self._output
        first = [(-computed[r]) % b + 1 for r in rows]  # the step each starts a new block
        context = n  # tokens the first step attends to
        k = MAX_RUN_STEPS
        for r in rows:
            context += computed[r]
            left = out[r] - gen[r]
            if left < k:
                k = left
        free = pool.free

        def need(j: int) -> int:
            return sum((j - f) // b + 1 for f in first if f <= j)

        if free < n * (k // b + 1) and need(k) > free:  # (each needs <= k // b + 1 blocks)
            if need(1) > free:
                return False
            lo, hi = 1, k  # need(lo) <= free < need(hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if need(mid) <= free else (lo, mid)
            k = lo
        cut = np.inf if n >= cfg.max_num_seqs else self.feed.next_time()  # an admissible arrival
        if cfg.horizon is not None:
            cut = min(cut, cfg.horizon)
        ends = self._decode_ends(n, context, k, cut)
        k = ends.shape[0]
        last = float(ends[-1])

        if self.charges_decode:
            rows_arr = np.asarray(rows, dtype=np.int64)
            clients = log.client[rows_arr]
            done = 0
            while self.feed.next_time() <= last:  # arrivals see the charges before them
                t = self.feed.next_time()
                j = int(np.searchsorted(ends, t, side="left"))
                if j > done:
                    policy.on_decode(rows_arr, clients, ends[done:j])
                    done = j
                self.feed.ingest(t)
            policy.on_decode(rows_arr, clients, ends[done:])
        else:
            self.feed.ingest(last)

        grown = [0] * (k + 1)  # blocks newly taken at each step of the run
        held = pool.held
        finished = []
        for r, f in zip(rows, first, strict=True):
            while f <= k:
                grown[f] += 1
                f += b
            c = computed[r] + k
            held[r] = -(-c // b)
            computed[r] = c
            g = gen[r] + k
            gen[r] = g
            if g == out[r]:
                finished.append(r)
        # blocks in use after each step, in tokens
        kv = [u * b for u in accumulate(grown[1:], initial=pool.used)][1:]
        pool.take(sum(grown))
        self._record(self.now, ends, DECODE, n, n, kv, 0)
        self.steps += k
        self.now = last
        self._finish(finished)
        return True

    def _decode_ends(self, n: int, context: int, k: int, cut: float) -> np.ndarray:
        """End times of up to k decode steps of n requests from now (context: the tokens the
        first attends to, n more each step), stopping after the step that ends at or after
        `cut` (the next one would start there)."""
        cost = self.cost
        if k <= SHORT_RUN_STEPS:
            end, short = self.now, []
            for j in range(k):  # the same additions, in the same order, as the cumsum below
                end += cost.decode_time(n, context + n * j)
                short.append(end)
                if end >= cut:
                    break
            return np.array(short)
        ends = cost.decode_times(n, context + n * np.arange(k, dtype=np.int64))
        ends[0] += self.now  # now + t0, then + t1, ...: the scalar loop's additions
        np.cumsum(ends, out=ends)
        stop = int(np.searchsorted(ends, cut, side="left"))  # first end >= cut
        return ends[: stop + 1]

    # ---- applying a step -----------------------------------------------------------------
    def _apply(self, step: Step) -> None:
        log, pool, prefilling = self.log, self.pool, self.prefilling
        prompt, out, computed, gen = self._prompt, self._output, log.computed, log.generated
        end = step.end
        emitted: list[int] = []
        finished: list[int] = []
        stalled = self.stalled
        for r, n in zip(step.rows, step.new, strict=True):
            c = computed[r] + n
            computed[r] = c
            if r in prefilling:
                if c - n < prompt[r]:  # prompt positions computed: their full blocks are cached
                    pool.register(r, self.keys(r), c)
                if c < prompt[r] + gen[r]:
                    continue  # more chunks to come
                prefilling.discard(r)  # a token is sampled: the first, or the first after
                log.open_segment(r, gen[r], self.index, self.steps)  # a preemption
                if gen[r] == 0:
                    log.first_token_at[r] = end
                else:
                    emitted.append(r)
            else:
                if stalled and r in stalled:  # skipped in an earlier step: a new token run
                    stalled.discard(r)
                    log.open_segment(r, gen[r], self.index, self.steps)
                emitted.append(r)
            g = gen[r] + 1
            gen[r] = g
            if g == out[r]:
                finished.append(r)
        if len(step.rows) < len(self.running):  # budget or a preemption stopped the loop:
            scheduled = set(step.rows)  # decoders left out produce no token this step
            for r in self.running:
                if r not in scheduled and r not in prefilling and r not in stalled:
                    stalled.add(r)
                    log.close_segment(r)
        if emitted and self.charges_decode:
            rows = np.asarray(emitted, dtype=np.int64)
            self.policy.on_decode(rows, log.client[rows], np.array([end]))
        kv = pool.used * self.cfg.block_size
        if kv > self.pool_tokens:
            raise RuntimeError(f"KV pool over-committed: {kv} > {self.pool_tokens}")
        self._ends.append(end)
        self._kv.append(kv)
        self._runs.extend((step.start, 1, step.kind, len(step.rows), sum(step.new), step.preempted))
        self.steps += 1
        self.now = end
        self._finish(finished)

    def _finish(self, finished: list[int]) -> None:
        log = self.log
        for r in finished:
            self.running.remove(r)
            self.pool.release(r)
            log.close_segment(r)
            log.finished_at[r] = self.now
            log.status[r] = COMPLETED
            log.reason[r] = None
            log.finished += 1
        for r in finished:
            self.policy.on_finish(r, self.now)
            self.notify_finish(r, self.now)

    def _record(
        self,
        start: float,
        ends: np.ndarray,
        kind: int,
        batch: int,
        tokens: int,
        kv: list[int],
        preempted: int,
    ) -> None:
        """Append a run of steps with equal batch: its first start, every end, KV per step."""
        if kv[-1] > self.pool_tokens:  # KV only grows within a record
            raise RuntimeError(f"KV pool over-committed: {kv[-1]} > {self.pool_tokens}")
        self._ends.frombytes(ends.tobytes())
        self._kv.extend(kv)
        self._runs.extend((start, len(kv), kind, batch, tokens, preempted))

    def step_columns(self) -> dict[str, np.ndarray]:
        """Per-step records of this replica (kinds: 0 prefill, 1 decode, 2 mixed)."""
        end = np.frombuffer(self._ends, dtype=np.float64).copy()
        runs = np.array(self._runs, dtype=np.float64).reshape(-1, 6)
        k = runs[:, 1].astype(np.int64)
        start = np.concatenate(([0.0], end[:-1]))
        start[np.cumsum(k) - k] = runs[:, 0]
        return {
            "start": start,
            "end": end,
            "kind": np.repeat(runs[:, 2].astype(np.int8), k),
            "batch_size": np.repeat(runs[:, 3].astype(np.int64), k),
            "num_tokens": np.repeat(runs[:, 4].astype(np.int64), k),
            "kv_used": np.frombuffer(self._kv, dtype=np.int64).copy(),
            "preempted": np.repeat(runs[:, 5].astype(np.int64), k),
        }
