"""The seam between step models and scheduling policies: six methods and two declarations.

The engine owns queues, memory and time; a policy owns its own state (counters, windows) and
answers a few questions. For every request, on the replica that serves it:

1. `on_arrival(req, now, queue)`: it arrives, before joining the queue; a reason rejects it.
2. `pick(queue, now)`: while a batch is formed, the waiting request to try next (None: stop).
3. `admit(req, now, fits)`: the engine says whether the picked request fits (memory, token
   budget, running cap); the policy answers `ADMIT` (only if it fits), `WAIT` (it stays queued
   and batch forming ends) or `Drop(reason)` (it leaves the queue, rejected). After a drop the
   engine picks again, unless `Drop(reason, stop=True)`: a throttle of a request that was
   blocked ends forming as a wait would. `admit` is asked again when a preempted request is
   picked to resume.
4. `charge(event)`: service as it is done: `PromptTokens` (prompt tokens computed; an engine
   without chunked prefill reports the whole prompt at admission; cache hits are free),
   `OutputTokens` (one token per listed request per step, several steps at once under
   fast-forward: a policy must end in the same state either way), `Finished`, and `Left` for
   an admitted request that leaves without its last token (its client gave up or went away; a
   prefill replica's handoff under per-pool counters): a policy that charged ahead (a
   predicted output) settles for what was served.
5. `victim(running)`: which running request a preempting engine evicts.

plus `bind(trace)` before the run. A policy declares which charge events it uses (`charged`),
so engines build none of the others: FCFS declares none and costs nothing per step.

Two optional hooks, each a Protocol an engine checks for when it builds its replicas (an
engine that does not offer a hook a policy has refuses the policy, naming the engine that does):
a policy that needs the replica's state (the prefix-locality policies, Andes) is `ReplicaAware`:
`engine=vllm` hands each replica's policy a `ReplicaView` (prefix-cache matches, KV use) through
`see_replica(view)`, so the policy reads the engine's own block cache instead of recomputing it.
A policy that preempts by its own choice (Andes) is also a `Rescheduler`:
`reschedule(running, queue, now)` before each step returns the running requests to preempt (the
engine then steps one at a time, since that choice may change at any step).

A policy also says whether it can serve live mode (`runs_live`): one that reads trace rows only
lazily, as `fairsim-serve` fills them.

Counter reporting is a separate interface: a policy with per-client counters (`CounterPolicy`)
gives its change log after the run, and only such a policy can be shared by every replica of a
cluster under `global_vtc`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd

from simulator.core.counters import CounterLog
from simulator.core.errors import ConfigError
from simulator.core.queue import WaitingQueue
from traces.schema import Trace


class Verdict(Enum):
    """Two of `admit`'s answers (`Drop` is the third)."""

    ADMIT = "admit"
    WAIT = "wait"


ADMIT, WAIT = Verdict.ADMIT, Verdict.WAIT


@dataclass(frozen=True)
class Drop:
    """Take the picked request out of the queue as rejected, with `reason`. `stop`: end batch
    forming after it (a throttle of a request that was blocked); otherwise picking goes on."""

    reason: str
    stop: bool = False


Admission = Verdict | Drop


@dataclass(frozen=True, slots=True)
class PromptTokens:
    """`tokens` more prompt tokens of `req` are computed in the step starting at `now`."""

    req: int
    tokens: int
    now: float


@dataclass(frozen=True, slots=True)
class OutputTokens:
    """Steps ended at `step_ends`; in each, every request in `rows` (trace rows in running
    order; `clients` are their clients) produced one output token after its first.
    `with_first`: the steps count each request's first token too (the gateway charges a whole
    stream when it ends: every token passed it)."""

    rows: np.ndarray
    clients: np.ndarray
    step_ends: np.ndarray
    with_first: bool = False


@dataclass(frozen=True, slots=True)
class Finished:
    """`req` produced its last token at `now` and left the batch."""

    req: int
    now: float


@dataclass(frozen=True, slots=True)
class Left:
    """`req`, admitted, left this policy's replicas at `now` without its last token: its client
    gave up or went away (`served`: the tokens it emitted), or, under disaggregated pools with
    counters per pool, a prefill replica handed it off (`served` 0: the decode pool's policy
    charges its output). What it was charged ahead of service (a predicted output) beyond
    `served` output tokens was never served here."""

    req: int
    now: float
    served: int


Charge = PromptTokens | OutputTokens | Finished | Left
NO_CHARGES: frozenset[type] = frozenset()
ALL_CHARGES: frozenset[type] = frozenset({PromptTokens, OutputTokens, Finished, Left})


class Policy(Protocol):
    name: str
    charged: frozenset[type]  # the Charge classes the policy uses; engines skip the others
    runs_live: bool  # it can run in live mode (reads trace rows only as they are filled)

    def bind(self, trace: Trace) -> None:
        """Reset all state for a run over `trace` (called once before the run starts)."""
        ...

    def on_arrival(self, req: int, now: float, queue: WaitingQueue) -> str | None:
        """A request arrives (before it joins `queue`). Return a rejection reason, or None."""
        ...

    def pick(self, queue: WaitingQueue, now: float) -> int | None:
        """The waiting request to try next, or None to admit nothing more now."""
        ...

    def admit(self, req: int, now: float, fits: bool) -> Admission:
        """The picked request, and whether the engine has room for it: ADMIT, WAIT or Drop."""
        ...

    def charge(self, event: Charge) -> None:
        """Service done (only the event classes listed in `charged` are reported)."""
        ...

    def victim(self, running: list[int]) -> int:
        """Which running request (listed in admission order) a preempting engine evicts."""
        ...


class ReplicaView(Protocol):
    """One replica's memory, as a policy sees it (engine=vllm)."""

    @property
    def block_size(self) -> int:
        """Tokens per KV block."""
        ...

    def cached_tokens(self, req: int) -> int:
        """Prompt tokens of waiting request `req` that the prefix cache holds now (its longest
        match)."""
        ...

    def match_version(self) -> int:
        """A number that changes whenever `cached_tokens` of a request asked about before (and
        still waiting) changes: while it stands, a ranking by match stands."""
        ...

    def kv_blocks(self) -> tuple[int, int]:
        """(blocks in use, blocks in the pool)."""
        ...


@runtime_checkable
class ReplicaAware(Protocol):
    """A policy that reads its replica's prefix cache and memory (LPM, DLPM, Andes)."""

    def see_replica(self, view: ReplicaView) -> None:
        """The replica this policy object serves, handed over when the replica is built."""
        ...


@runtime_checkable
class Rescheduler(Protocol):
    """A policy that preempts running requests by its own choice (Andes)."""

    def reschedule(self, running: list[int], queue: WaitingQueue, now: float) -> list[int]:
        """Before a step: the running requests to preempt now (they rejoin `queue`)."""
        ...


def check_hooks(policy: Policy, engine: str, offered: tuple[type, ...]) -> None:
    """Refuse a policy that needs a hook (`ReplicaAware`, `Rescheduler`) the engine does not
    offer, in one line naming the engine that does."""
    for hook, what in ((ReplicaAware, "reads its replica's prefix cache and memory"),
                       (Rescheduler, "preempts running requests by its own choice")):  # fmt: skip
        if isinstance(policy, hook) and hook not in offered:
            raise ConfigError(
                f"policy={policy.name} {what}, which engine={engine} does not offer; "
                "use engine=vllm"
            )


@runtime_checkable
class CounterPolicy(Protocol):
    """A policy that keeps one counter per client and logs every change to it (VTC, LCF, DRR,
    FairServe): the run folder gets its log, and a cluster may share it across replicas."""

    def counter_events(self) -> pd.DataFrame:
        """Every change to the per-client counters (simulator/core/counters.py), after the run."""
        ...

    def counter_log(self) -> CounterLog:
        """The log itself, as the run fills it (a large run writes it to disk as it goes)."""
        ...
