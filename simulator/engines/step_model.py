"""What the runner asks of a step model, and what a step model sees of the runner.

A step model is one replica's scheduler and memory: given its waiting queue and KV pool it
decides the next step at the current instant (`schedule`, returning a `Plan`) and applies it
when the step ends (`apply`), the `schedule()` / `update_from_output()` split of vLLM v1. A
plan may be a run of several decode steps (fast-forward); arrivals falling inside a run are
delivered in order between the effects of its steps, by the model, through `Host.feed`.

An engine config (a frozen dataclass in the model's module, named by `conf/engine/*.yaml`)
builds the replicas and says which requests they can never serve.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np

from cost_models.base import StepCostModel
from simulator.core.errors import ConfigError
from simulator.core.queue import WaitingQueue
from simulator.core.requests import IN_FLIGHT, RequestState
from simulator.core.seam import ADMIT, Drop, Policy, check_hooks
from simulator.core.timeline import StepRecorder, TokenRuns
from simulator.engines.arrivals import Arrivals
from simulator.engines.jitter import StepJitter
from traces.schema import Trace


@dataclass(slots=True)
class Plan:
    """A decided step (or run of decode steps): when it starts, when each of its steps ends,
    and when the last one ends. Each step model adds what it needs to apply it."""

    start: float
    ends: list[float] | np.ndarray
    end: float


def check_integers(config: object, minimum: int, *names: str) -> None:
    """Each named field of an engine config is an integer >= minimum."""
    for name in names:
        v = getattr(config, name)
        if int(v) != v or v < minimum:
            raise ConfigError(f"engine.{name} must be an integer >= {minimum}, got {v!r}")


def check_jitter(cv: float, seed: int, run_cv: float = 0.0) -> None:
    for name, value in (("step_jitter_cv", cv), ("run_speed_cv", run_cv)):
        if not (np.isfinite(value) and value >= 0):
            raise ConfigError(f"engine.{name} must be a number >= 0, got {value!r}")
    if int(seed) != seed or seed < 0:
        raise ConfigError(f"engine.step_jitter_seed must be an integer >= 0, got {seed!r}")


def check_horizon(horizon: float | None) -> None:
    if horizon is not None and not (np.isfinite(horizon) and horizon > 0):
        raise ConfigError(f"engine.horizon must be null or a number > 0, got {horizon!r}")


Knobs = TypeVar("Knobs", bound="EngineKnobs")


@dataclass(frozen=True, kw_only=True)
class EngineKnobs:
    """The knobs every engine config has, and their checks (keyword-only, so each engine's own
    knobs keep their order)."""

    fast_forward: bool = True  # take a run of steps at once where nothing can change inside it
    horizon: float | None = None  # stop at this simulated time (null: when every request ends)
    step_jitter_cv: float = 0.0  # multiplicative noise per step (simulator/engines/jitter.py)
    step_jitter_seed: int = 0
    run_speed_cv: float = 0.0  # one speed factor per replica for the whole run (jitter.py)

    name: ClassVar[str]
    offered_hooks: ClassVar[tuple[type, ...]] = ()  # the optional policy hooks it honours

    def __post_init__(self) -> None:
        check_horizon(self.horizon)
        check_jitter(self.step_jitter_cv, self.step_jitter_seed, self.run_speed_cv)

    def for_cost(self: Knobs, cost: StepCostModel) -> Knobs:
        """This config as it serves the cost model's model (`EngineConfig.for_cost`)."""
        return self

    def build(self, host: Host, pairs: Pairs, cost: StepCostModel, ff: bool) -> list[StepModel]:
        """One replica per (policy, queue) of `pairs`, once every policy is known to need no
        hook this engine does not offer; `ff`: fast-forward on."""
        for policy, _ in pairs:
            check_hooks(policy, self.name, self.offered_hooks)
        return self.replicas(host, pairs, cost, ff)

    def replicas(self, host: Host, pairs: Pairs, cost: StepCostModel, ff: bool) -> list[StepModel]:
        """The replicas, replica i serving `pairs[i]` (its policy and its queue); `ff`:
        fast-forward on."""
        raise NotImplementedError


Pairs = list[tuple[Policy, WaitingQueue]]  # each replica's policy and waiting queue


def decode_step_ends(
    cost: StepCostModel,
    jitter: StepJitter | None,
    first_step: int,
    now: float,
    n: int,
    context: int,
    k: int,
    short: int,
    cut: float = math.inf,
) -> list[float] | np.ndarray:
    """End times of up to `k` decode steps of `n` requests from `now`: step j (from 0) reads
    `context + n * j` tokens of KV and is step `first_step + j` of its replica (for jitter).
    Runs of up to `short` steps are timed one by one in floats, stopping after the first that
    ends at or after `cut` (a list: array set-up costs more than a few scalar additions); longer
    runs as one array of all `k`. Both add the same step times in the same order, so they give
    the same floats."""
    if k <= short:
        end, ends = now, []
        for j in range(k):
            dt = cost.decode_time(n, context + n * j)
            if jitter is not None:
                dt *= jitter.factor(first_step + j)
            end += dt
            ends.append(end)
            if end >= cut:
                break
        return ends
    times = cost.decode_times(n, context + n * np.arange(k, dtype=np.int64))
    if jitter is not None:
        times *= jitter.factors(first_step, k)
    times[0] += now  # now + t0, then + t1, ...: the scalar loop's additions
    np.cumsum(times, out=times)
    return times


def all_layers_window(cost: StepCostModel) -> int | None:
    """The window every layer of the cost model's model attends to (Mistral 7B v0.1, Phi-3
    4k: `sliding_window` with no full-attention layer), or None."""
    window = getattr(cost, "all_layers_window", None)
    return None if window is None else window()


def state_groups(cost: StepCostModel) -> int | None:
    """The block groups holding a model's recurrent layers' states (the cost model's
    `kv_state_groups`: a page or two per running request in each), or None."""
    groups = getattr(cost, "kv_state_groups", None)
    return None if groups is None else groups()


def chunked_layers(cost: StepCostModel) -> bool:
    """Whether the cost model's model's windowed layers attend within chunks of the window
    (Llama 4's chunked local attention) rather than to a window sliding with each token."""
    chunked = getattr(cost, "kv_chunked", None)
    return chunked is not None and chunked()


Deadlines = list[tuple[float, int]]  # (when its client gives up, request): a heap


def clients_gone(deadlines: Deadlines, status: np.ndarray, until: float) -> Iterator[int]:
    """Take off `deadlines`, in time order, each request whose client gave up by `until`, and
    yield those still in flight (the others ended before)."""
    while deadlines and deadlines[0][0] <= until:
        req = heapq.heappop(deadlines)[1]
        if status[req] == IN_FLIGHT:
            yield req


def next_deadline(deadlines: Deadlines, status: np.ndarray) -> float:
    """When the next client of a request still in flight gives up (inf: none)."""
    while deadlines and status[deadlines[0][1]] != IN_FLIGHT:
        heapq.heappop(deadlines)  # it ended before its client gave up
    return deadlines[0][0] if deadlines else math.inf


def settle(
    policy: Policy, queue: WaitingQueue, host: Host, req: int, now: float, fits: bool, verdict: Any
) -> bool:
    """Carry out an `admit` answer other than ADMIT-and-fits. True: the policy dropped the
    request (now rejected), pick again; False: batch forming ends (WAIT, or a stopping drop)."""
    if verdict is ADMIT:  # (and it does not fit)
        raise RuntimeError(f"policy {policy.name} admitted a request that does not fit")
    if isinstance(verdict, Drop):
        queue.remove(req)
        host.reject(req, now, verdict.reason)
        return not verdict.stop
    return False


class Host(Protocol):
    """The runner, as its replicas see it."""

    trace: Trace
    state: RequestState
    tokens: TokenRuns
    horizon: float | None

    def feed(self, replica: int) -> Arrivals:
        """The arrivals that can reach this replica (ingest them before a step's effects)."""
        ...

    def finish(self, replica: int, rows: list[int], now: float) -> None:
        """These running requests produced their last token at `now` (memory already freed)."""
        ...

    def reject(self, req: int, now: float, reason: str) -> None:
        """The policy dropped a waiting request: it leaves as rejected."""
        ...

    def aborted(self, replica: int, req: int, now: float) -> None:
        """The replica dropped `req`, aborted while running (its memory is free)."""
        ...

    def timed_out(self, replica: int, req: int, now: float) -> None:
        """The replica dropped `req` (waiting or running) at `now`: its client gave up."""
        ...

    def queued(self, replica: int, now: float) -> None:
        """The replica put a request back into its queue at `now` (a preemption): wake who may
        pull it."""
        ...

    def first_give_up(self, replica: int, until: float) -> float:
        """When a client of a request reaching this replica by `until` (not yet arrived) first
        gives up (inf: none does): a run of steps that takes it in ends with the step under way
        then."""
        ...

    def prefilled(self, replica: int, rows: list[int], now: float) -> None:
        """Disaggregated pools: a prefill replica sampled these requests' first tokens and
        holds their KV for a decode replica."""
        ...

    def fetch_kv(self, replica: int, req: int, tokens: int, now: float) -> None:
        """Disaggregated pools: a decode replica admitted `req`; `tokens` tokens of its KV
        start to move there (the replica hears `kv_arrived` when they have)."""
        ...


class StepModel(Protocol):
    index: int
    now: float  # the end of the last step applied
    queue: WaitingQueue
    policy: Policy
    steps: StepRecorder
    pool_tokens: int

    def has_work(self) -> bool:
        """Anything running or waiting."""
        ...

    def next_event(self) -> float:
        """When the replica next has something of its own to do while nothing arrives (a load
        of KV from its CPU tier ending); inf: nothing. An idle replica wakes then."""
        ...

    def schedule(self, frontier: float) -> Plan | None:
        """Decide the next step (or run) at `now`; None: nothing to do. A run's steps end before
        `frontier`, except a single step (which the runner holds until the frontier passes)."""
        ...

    def apply(self, plan: Plan) -> None:
        """Apply a plan at its end: deliver arrivals up to it, then its tokens, charges and
        finishes."""
        ...

    def remaining_tokens(self, req: int) -> int:
        """Tokens `req` still needs this replica to process (prompt not computed + output not
        generated): what a load-aware dispatcher weighs."""
        ...

    def kv_used(self) -> int:
        """KV tokens in use now."""
        ...

    def close(self) -> None:
        """After the run: check the memory books, mark running requests, and write the token
        runs and emitted counts the model kept to itself."""
        ...

    def abort(self, req: int) -> None:
        """Drop running `req` at the start of the next step, freeing its memory, and tell the
        host (`Host.aborted`)."""
        ...

    def forget_waiting(self, req: int) -> None:
        """Waiting `req` left for good (its client went away): drop what the replica kept for
        it (a prefix match it tracks, KV swapped out to its CPU tier)."""
        ...

    def watch_timeout(self, req: int, deadline: float) -> None:
        """`req` joins this replica's queue and its client gives up at `deadline`: the replica
        drops it then, waiting or running, before its next step (`Host.timed_out`)."""
        ...

    def token_times(self, req: int, start: int) -> list[float]:
        """Times of the output tokens `req` has emitted on this replica so far, from index
        `start` on (a live run streams them as simulated time passes)."""
        ...

    def token_clock(self, steps: dict[str, np.ndarray]) -> np.ndarray:
        """This replica's token clock (see simulator/core/timeline.py), from its steps' ends and
        kinds (`StepRecorder.clock_columns`)."""
        ...

    def request_columns(self) -> dict[str, np.ndarray]:
        """Per-request columns this model adds to requests.parquet (may be empty)."""
        ...

    def counts(self) -> dict[str, int]:
        """Counts for the timeline's `info`, summed over the replicas (may be empty)."""
        ...


class EngineConfig(Protocol):
    """A step model's configuration; `conf/engine/*.yaml` names the class."""

    @property
    def name(self) -> str: ...

    @property
    def fast_forward(self) -> bool:
        """Whether a replica may take many decode steps at once (while nothing outside can
        reach or read it)."""
        ...

    @property
    def horizon(self) -> float | None:
        """Simulated seconds after which nothing starts (None: run until every request ends)."""
        ...

    def refusals(self, trace: Trace, cost: StepCostModel) -> np.ndarray:
        """Per request, why a replica can never serve it (None: it can): refused on arrival."""
        ...

    def for_lone_requests(self, prompt_tokens: int, cost: StepCostModel) -> EngineConfig:
        """A copy in which a lone request of up to `prompt_tokens` prompt tokens and one output
        token always runs, without a horizon (to profile the engine's prefill times)."""
        ...

    def for_cost(self, cost: StepCostModel) -> EngineConfig:
        """This config as it serves the cost model's model (an engine may adapt a knob to the
        model, as vLLM does its block size)."""
        ...

    def build(self, host: Host, pairs: Pairs, cost: StepCostModel, ff: bool) -> list[StepModel]:
        """One replica per (policy, queue) of `pairs` (several replicas may share one of each);
        it refuses a policy that needs a hook it does not offer."""
        ...

    def info(self) -> dict[str, object]:
        """Model facts for the timeline's `info` (beyond engine, end time, replicas and the
        replicas' `counts`)."""
        ...
