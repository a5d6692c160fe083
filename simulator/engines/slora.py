"""The S-LoRA router the VTC and FairServe papers measured, as a step model.

One iteration is one GPU step. With nothing running the scheduler is asked at once and an admitted
mini-batch is prefilled; after a prefill the batch decodes `max_wait_tokens` steps before the
scheduler is asked again, and from then on it is asked before every step. Admitting a mini-batch
makes that step a prefill-only step. No chunked prefill, no preemption; the server knows each
request's output length, and the fit test (simulator/engines/fit.py) keeps the KV pool from ever
running out. A request's whole prompt is charged to its policy when it is admitted.

KV accounting is token-granular: a running request holds prompt + generated - 1 tokens (the newest
token's KV is written by the next decode step), at most prompt + output - 1, freed on finish.

Fast-forward: when nothing can change the schedule (no finish, and no consultation of the
scheduler that could admit) a plan is a run of many decode steps; arrivals falling inside are
processed in order between the steps' charges, so the timeline is bit-identical to stepping one
by one (`fast_forward=False`).

Tokens: a request's first token comes from its prefill step, every later one from a decode step,
and it takes part in every decode step while it runs; so the token clock is the decode steps'
ends followed by the prefill steps' ends, and each request has two token runs.
"""

from __future__ import annotations

import dataclasses
import heapq
from array import array
from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

from cost_models.base import StepCostModel
from simulator.core.errors import ConfigError
from simulator.core.queue import WaitingQueue
from simulator.core.seam import ADMIT, OutputTokens, Policy, PromptTokens
from simulator.core.timeline import DECODE, PREFILL, StepRecorder
from simulator.engines.fast_forward import MAX_RUN_STEPS, run_length
from simulator.engines.fit import BatchFit, RunningFit
from simulator.engines.jitter import step_jitter
from simulator.engines.step_model import (
    Deadlines,
    EngineKnobs,
    Host,
    Pairs,
    Plan,
    StepModel,
    all_layers_window,
    check_integers,
    clients_gone,
    decode_step_ends,
    next_deadline,
    settle,
)
from traces.schema import Trace

# Runs up to this long are timed step by step in floats, longer ones as numpy arrays: array set-up
# costs more than a few scalar additions; the scalar path saves 24% of the core benchmark's
# simulation instructions (cachegrind, 20,000 requests, against SHORT_RUN_STEPS = 0).
SHORT_RUN_STEPS = 8


@dataclass(frozen=True)
class SLoRAConfig(EngineKnobs):
    """Knobs of the S-LoRA router engine; defaults are the VTC paper's A10G runs (reserve 0).
    The knobs every engine has come from `EngineKnobs`."""

    pool_tokens: int = 10_000
    max_wait_tokens: int = 10
    batch_max_tokens: int = 3072
    running_max_req_size: int = 1000
    reserve_per_client: int = 0

    name = "slora"

    def __post_init__(self) -> None:
        check_integers(self, 1, "pool_tokens", "batch_max_tokens", "running_max_req_size")
        check_integers(self, 0, "max_wait_tokens", "reserve_per_client")
        if self.reserve_per_client >= self.pool_tokens:
            raise ConfigError("engine.reserve_per_client must be smaller than engine.pool_tokens")
        super().__post_init__()

    def refusals(self, trace: Trace, cost: StepCostModel) -> np.ndarray:
        """Per request, why the engine can never run it (None: it can): its peak KV need
        exceeds the pool less one reservation, its prompt exceeds the prefill budget, or its
        context passes the window of a model whose every layer slides (`all_layers_window`)."""
        peak = trace.prompt_len + trace.output_len + 1
        too_big = peak > self.pool_tokens - self.reserve_per_client
        too_long = trace.prompt_len > self.batch_max_tokens
        reason = np.full(len(trace), None, dtype=object)
        window = all_layers_window(cost)  # this engine keeps every token's KV: past the
        if window is not None:  # window of a model whose every layer slides, it would be wrong
            reason[trace.prompt_len + trace.output_len - 1 > window] = "exceeds_sliding_window"
        reason[too_long] = "prompt_exceeds_batch_max_tokens"
        reason[too_big] = "kv_pool_too_small"  # checked first
        return reason

    def for_lone_requests(self, prompt_tokens: int, cost: StepCostModel) -> SLoRAConfig:
        """A copy in which a lone request of up to `prompt_tokens` prompt tokens and one output
        token always runs (no horizon): for profiling."""
        return dataclasses.replace(
            self,
            batch_max_tokens=max(self.batch_max_tokens, prompt_tokens),
            pool_tokens=max(self.pool_tokens, prompt_tokens + 2 + self.reserve_per_client),
            horizon=None,
        )

    def replicas(self, host: Host, pairs: Pairs, cost: StepCostModel, ff: bool) -> list[StepModel]:
        return [SLoRAReplica(i, host, p, q, cost, self, ff) for i, (p, q) in enumerate(pairs)]

    def info(self) -> dict[str, object]:
        return {}


@dataclass(slots=True)
class PrefillPlan(Plan):
    batch: list[int]
    rows: np.ndarray  # the batch as an array
    tokens: int  # prompt tokens


@dataclass(slots=True)
class DecodePlan(Plan):
    pass


class SLoRAReplica:
    """One S-LoRA router replica (the `StepModel` the runner hosts): an idle replica admits a
    mini-batch and prefills it in a step of its own; the batch then decodes `max_wait_tokens`
    steps before the policy is asked again, then before every step. Admission is S-LoRA's fit
    test (`engines/fit.py`): peak future KV if every running request runs to its full length."""

    def __init__(
        self,
        index: int,
        host: Host,
        policy: Policy,
        queue: WaitingQueue,
        cost: StepCostModel,
        cfg: SLoRAConfig,
        fast_forward: bool,
    ) -> None:
        self.index, self.host, self.policy, self.queue = index, host, policy, queue
        self.cost, self.cfg, self.fast_forward = cost, cfg, fast_forward
        self.feed = host.feed(index)
        state, trace = host.state, host.trace
        self.state = state
        self.charge_prompt = PromptTokens in policy.charged
        self.charge_output = OutputTokens in policy.charged
        n = len(trace)
        self.prompt, self.output = trace.prompt_len, trace.output_len
        self._prompt, self._output, self._client_of = state.prompt, state.output, state.client_of
        self.first_decode = np.full(n, -1, dtype=np.int64)  # decode count at its prefill
        self.finish_decode = np.full(n, -1, dtype=np.int64)  # decode count when it finishes
        self.prefill_step = np.full(n, -1, dtype=np.int64)  # which of this replica's prefills
        # running requests in admission order: rows (trace row, client, finish decode count)
        self._run_table = np.empty((3, 0), dtype=np.int64)
        self.running = self._run_table[0]  # their trace rows
        self._admitted = 0  # admissions so far: ties in the finish heap keep admission order
        # heap of (decode count at which it finishes, admission number, trace row)
        self._finishes: list[tuple[int, int, int]] = []
        self._fit: RunningFit | None = None  # fit-test state; finishes keep it valid
        self.running_clients: dict[int, int] = {}
        self.pool_tokens = cfg.pool_tokens
        self.steps = StepRecorder()
        self.decode_ends = array("d")  # every decode step's end: token k >= 1 of a request
        self._aborting: list[int] = []  # live mode: running requests to drop at the next step
        # (when its client gives up, request) of requests that may be here: a heap
        self.deadlines: Deadlines = []
        self._gone: set[int] = set()  # dropped: their finish-heap entries are skipped
        self.stopped_at = np.full(n, -1, dtype=np.int64)  # tokens an aborted request emitted
        self.jitter = step_jitter(cfg.step_jitter_cv, cfg.step_jitter_seed, index, cfg.run_speed_cv)
        self.now = 0.0
        self.decodes = 0  # decode steps so far
        self.prefills = 0  # prefill steps so far
        self.wait_steps = 0  # decode steps since the last prefill (capped at max_wait_tokens)
        self.kv = 0  # KV tokens in use

    # ---- what the runner asks ------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.running.shape[0] or len(self.queue))

    def next_event(self) -> float:
        """The next client giving up on a request here (inf: none): nothing else of its own
        happens while it idles."""
        return next_deadline(self.deadlines, self.state.status)

    def kv_used(self) -> int:
        return self.kv

    def schedule(self, frontier: float) -> Plan | None:
        if self._aborting:
            self._drop_aborted()
        if self.deadlines and self.deadlines[0][0] <= self.now:
            self._drop_timed_out(self.now)
        cfg = self.cfg
        idle = not self.running.shape[0]
        if idle or (self.wait_steps >= cfg.max_wait_tokens and len(self.queue)):
            batch = self._form_batch()
            if batch:
                rows = np.asarray(batch, dtype=np.int64)
                prompts = self.prompt[rows]
                dt = self.cost.prefill_time(prompts)
                if self.jitter is not None:
                    dt *= self.jitter.factor(len(self.steps))
                end = self.now + dt
                return PrefillPlan(self.now, [end], end, batch, rows, int(prompts.sum()))
        if not self.running.shape[0]:
            return None
        return self._decode_plan(frontier)

    def apply(self, plan: Plan) -> None:
        if type(plan) is DecodePlan:
            self._apply_decode(plan)
        else:
            assert isinstance(plan, PrefillPlan)
            self._apply_prefill(plan)

    def remaining_tokens(self, req: int) -> int:
        fd = int(self.first_decode[req])
        if fd < 0:
            return self._prompt[req] + self._output[req]
        return self._output[req] - min(self.decodes - fd + 1, self._output[req])

    def close(self) -> None:
        if self.cfg.horizon is not None:  # (a run of steps may have passed a deadline)
            self._drop_timed_out(self.cfg.horizon)
        state = self.state
        state.reason[self.running] = "running"
        rows = np.flatnonzero(self.first_decode >= 0)
        fd = self.first_decode[rows]
        generated = np.minimum(self.decodes - fd + 1, self.output[rows])
        stopped = self.stopped_at[rows]
        generated = np.where(stopped >= 0, stopped, generated)
        for r, g in zip(rows.tolist(), generated.tolist(), strict=True):
            state.generated[r] = g
        ones = np.ones(rows.shape[0], dtype=np.int64)
        tokens = self.host.tokens
        tokens.add(rows, 0 * ones, ones, self.index, self.decodes + self.prefill_step[rows])
        tokens.add(rows, ones, generated - 1, self.index, fd)

    def abort(self, req: int) -> None:
        self._aborting.append(req)

    def _drop_aborted(self) -> None:
        """Drop the aborted running requests before the next step."""
        for req in self._aborting:
            if np.any(self.running == req):  # (else it finished meanwhile)
                self._stop(req)
                self.host.aborted(self.index, req, self.now)
        self._aborting.clear()

    def forget_waiting(self, req: int) -> None:
        """(The router keeps nothing for a waiting request.)"""

    def watch_timeout(self, req: int, deadline: float) -> None:
        """`req` joins this replica's queue; its client gives up at `deadline`."""
        heapq.heappush(self.deadlines, (deadline, req))

    def _drop_timed_out(self, until: float) -> None:
        """Before the next step (`until`: now), or when the run stops at its horizon (`until`:
        the horizon): each request here whose client gave up by `until` leaves the queue or
        the running batch, ending at `until`."""
        queue = self.queue
        for req in clients_gone(self.deadlines, self.state.status, until):
            if req in queue:
                queue.remove(req)
                self.host.timed_out(self.index, req, until)
            elif np.any(self.running == req):
                self._stop(req)
                self.host.timed_out(self.index, req, until)

    def _stop(self, req: int) -> None:
        """Running `req` stops where it is: its KV (prompt and every token but the last) is
        freed; the tokens it emitted stay emitted."""
        emitted = min(self.decodes - int(self.first_decode[req]) + 1, self._output[req])
        self.stopped_at[req] = emitted
        self.state.generated[req] = emitted  # (the others' counts are written at `close`)
        table = self._run_table
        self._set_running(table.compress(table[0] != req, axis=1))
        self._leave(req, self._prompt[req] + emitted - 1)
        self._gone.add(req)
        self._fit = None

    def token_times(self, req: int, start: int) -> list[float]:
        """Times of the tokens `req` has emitted so far, from index `start` on: the first at the
        end of its prefill step, token k at the end of its k-th decode step."""
        fd = int(self.first_decode[req])
        if fd < 0:
            return []
        emitted = min(self.decodes - fd + 1, self._output[req])
        if self.stopped_at[req] >= 0:
            emitted = int(self.stopped_at[req])
        times = [float(self.state.first_token_at[req])] if start == 0 < emitted else []
        times.extend(self.decode_ends[fd + max(start, 1) - 1 : fd + emitted - 1])
        return times

    def token_clock(self, steps: dict[str, np.ndarray]) -> np.ndarray:
        # the decode steps' ends are kept apart already: no masked copy of every step's end
        prefill_ends = steps["end"][steps["kind"] == PREFILL]
        return np.concatenate((np.frombuffer(self.decode_ends, dtype=np.float64), prefill_ends))

    def request_columns(self) -> dict[str, np.ndarray]:
        return {}

    def counts(self) -> dict[str, int]:
        return {"decode_steps": self.decodes}

    # ---- admission ----------------------------------------------------------------------
    def _form_batch(self) -> list[int]:
        """Ask the policy for requests until one does not fit (then stop: no look-ahead)."""
        policy, queue, now = self.policy, self.queue, self.now
        batch: list[int] = []
        if self.running.shape[0] >= self.cfg.running_max_req_size:
            return batch  # a full batch: the router does not ask the scheduler (S-LoRA's rule)
        tokens = 0
        if self._fit is None:
            rows = self.running
            self._fit = RunningFit(
                self.prompt[rows], self.first_decode[rows], self.finish_decode[rows]
            )
        fit = self._fit.batch(self.decodes)  # counts in each admitted member
        clients = set(self.running_clients)
        while len(queue):
            req = policy.pick(queue, now)
            if req is None:
                break
            p, o, c = self._prompt[req], self._output[req], self._client_of[req]
            fits = self._fits(fit, clients, p, o, c, tokens, len(batch))
            verdict = policy.admit(req, now, fits)
            if verdict is not ADMIT or not fits:
                if settle(policy, queue, self.host, req, now, fits, verdict):
                    continue
                break
            queue.remove(req)
            batch.append(req)
            tokens += p
            clients.add(c)
            fit.add(p, o)
            if self.charge_prompt:
                policy.charge(PromptTokens(req, p, now))
        return batch

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
    def _apply_prefill(self, plan: PrefillPlan) -> None:
        end = plan.end
        self.feed.ingest(end)
        idx = plan.rows
        self.state.admitted_at[idx] = plan.start
        self.state.replica[idx] = self.index
        self.state.first_token_at[idx] = end
        self.first_decode[idx] = self.decodes
        self.prefill_step[idx] = self.prefills
        finish = self.decodes + self.output[idx] - 1
        self.finish_decode[idx] = finish
        for req, f in zip(plan.batch, finish.tolist(), strict=True):
            heapq.heappush(self._finishes, (f, self._admitted, req))
            self._admitted += 1
        clients = self.state.client[idx]
        joined = np.array((idx, clients, finish))
        self._set_running(np.concatenate((self._run_table, joined), axis=1))
        self._fit = None  # requests joined: rebuilt when the next fit test needs it
        for c in clients.tolist():
            self.running_clients[c] = self.running_clients.get(c, 0) + 1
        self.kv += plan.tokens  # the first output token has no KV yet
        self._check_pool()
        self.steps.record(plan.start, [end], [self.kv], PREFILL, len(plan.batch), plan.tokens)
        self.prefills += 1
        self.now = end
        self.wait_steps = 0
        self._finish_due()

    def _decode_plan(self, frontier: float) -> DecodePlan:
        """The next decode step, or (fast-forward) a run of them: bounded by the next finish,
        by the wait before the scheduler is asked again while requests wait, and by
        MAX_RUN_STEPS; then cut by `run_length`."""
        cfg = self.cfg
        n = self.running.shape[0]
        k = 1
        if self.fast_forward:
            k = min(self._finishes[0][0] - self.decodes, MAX_RUN_STEPS)
            room = n < cfg.running_max_req_size
            if room and len(self.queue):  # the scheduler is asked once the wait is over
                k = min(k, max(cfg.max_wait_tokens - self.wait_steps, 1))
        ends = self._step_ends(n, k)
        if len(ends) > 1:
            nxt = self.feed.next_time()
            admissible = n < cfg.running_max_req_size and not len(self.queue)
            k = run_length(
                ends,
                next_arrival=nxt if admissible else np.inf,
                horizon=cfg.horizon,
                frontier=frontier,
                wait_left=cfg.max_wait_tokens - self.wait_steps,
            )
            # a client giving up ends the run with the step under way then, however long the
            # router would wait (the next step drops the request): a waiting one's, or one's
            # whose request arrives during the run
            gone = min(self.next_event(), self.host.first_give_up(self.index, ends[k - 1]))
            k = min(k, bisect_left(ends, gone) + 1)
            ends = ends[:k]
        return DecodePlan(self.now, ends, ends[-1])

    def _step_ends(self, n: int, k: int) -> list[float]:
        """End times of the next `k` decode steps of `n` requests (each adds a token per
        request to the KV it reads)."""
        ends = decode_step_ends(
            self.cost, self.jitter, len(self.steps), self.now, n, self.kv + n, k, SHORT_RUN_STEPS
        )
        return ends if isinstance(ends, list) else ends.tolist()

    def _apply_decode(self, plan: Plan) -> None:
        """Decode steps with a fixed batch; arrivals inside take effect between steps."""
        cfg, feed = self.cfg, self.feed
        n = self.running.shape[0]
        ends = plan.ends
        k = len(ends)
        last = plan.end
        clients = self._run_table[1]
        done = 0
        limit = last if cfg.horizon is None else min(last, cfg.horizon)
        while feed.next_time() <= limit:
            t = feed.next_time()
            if self.charge_output:
                j = bisect_left(ends, t)
                if j > done:  # steps ending before this arrival take effect first
                    self.policy.charge(OutputTokens(self.running, clients, np.array(ends[done:j])))
                    done = j
            feed.ingest(t)
        if self.charge_output:
            self.policy.charge(OutputTokens(self.running, clients, np.array(ends[done:])))
        kv = range(self.kv + n, self.kv + n * k + 1, n)  # in use after each step
        self.steps.record(plan.start, ends, kv, DECODE, n, n)
        self.decode_ends.extend(ends)
        self.decodes += k
        self.kv += n * k
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
            req = heapq.heappop(finishes)[2]
            if req not in self._gone:
                rows.append(req)
        table = self._run_table
        self._set_running(table.compress(table[2] != self.decodes, axis=1))
        for req in rows:
            self._leave(req, self._prompt[req] + self._output[req] - 1)
        self.host.finish(self.index, rows, self.now)

    def _leave(self, req: int, kv_tokens: int) -> None:
        """`req` has left the running set (finished or aborted): its `kv_tokens` of KV are free
        and its client runs one request fewer (the fit test's per-client reservation)."""
        self.kv -= kv_tokens
        c = self._client_of[req]
        self.running_clients[c] -= 1
        if not self.running_clients[c]:
            del self.running_clients[c]

    def _set_running(self, table: np.ndarray) -> None:
        """Replace the running set (rows: trace row, client, finish decode count)."""
        self._run_table = table
        self.running = table[0]

    def _check_pool(self) -> None:
        if self.kv > self.cfg.pool_tokens:
            raise RuntimeError(
                f"KV pool over-committed: {self.kv} > {self.cfg.pool_tokens} tokens "
                "(the fit test should make this impossible; please report it)"
            )
