"""The seam between engines and scheduling policies.

The engine owns queues and memory; a policy owns its own state (counters, windows) and answers
the engine's questions. Call order on one engine, for every request:
`on_arrival` (may reject) -> `pick` ... `on_admit` -> `on_decode` (per decode run) -> `on_finish`.
A chunked-prefill engine (vLLM-style) binds with `chunked=True`: prompts are then charged
chunk by chunk through `on_prompt` instead of at admission, and the engine may preempt a running
request (`preemption_victim`) and later admit it again (without a second `on_admit`).
`pick` is asked repeatedly while a batch is formed. The engine first `screen`s the picked request
(a reason drops it from the queue as rejected, and picking goes on); when the picked request
cannot be admitted (memory, prefill budget or running cap) the engine calls `on_blocked` (a reason
throttles it: dropped as rejected) and stops forming the batch either way.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import pandas as pd

from simulator.queue import WaitingQueue
from traces.schema import Trace


class Policy(Protocol):
    name: str

    def bind(self, trace: Trace, chunked: bool = False) -> None:
        """Reset all state for a run over `trace` (called once before the run starts)."""
        ...

    def on_arrival(self, req: int, now: float, queue: WaitingQueue) -> str | None:
        """A request arrives (before it joins `queue`). Return a rejection reason, or None."""
        ...

    def pick(self, queue: WaitingQueue, now: float) -> int | None:
        """The waiting request to admit next, or None to admit nothing more now."""
        ...

    def on_admit(self, req: int, now: float) -> None:
        """`req` left the queue and is prefilled in the step starting at `now`."""
        ...

    def on_prompt(self, req: int, tokens: int, now: float) -> None:
        """Chunked engines: `tokens` more prompt tokens of `req` are computed in the step
        starting at `now` (cache hits are not reported; recomputation only if charged)."""
        ...

    def screen(self, req: int, now: float) -> str | None:
        """`req` was picked: a reason to drop it (rejected) instead of trying to admit it."""
        ...

    def on_blocked(self, req: int, now: float, queue: WaitingQueue) -> str | None:
        """`req` was picked but does not fit; batch forming stops after this call. Return a
        reason to throttle it (it leaves the queue, rejected), or None to keep it waiting."""
        ...

    def on_decode(self, running: np.ndarray, clients: np.ndarray, step_ends: np.ndarray) -> None:
        """Decode steps ended at the times `step_ends`; in each, every request in `running` (trace
        rows in admission order; `clients` are their clients) produced one token. Engines may
        report several steps at once (fast-forward); a policy must end in the same state
        either way."""
        ...

    def on_finish(self, req: int, now: float) -> None:
        """`req` produced its last token at `now` and left the batch."""
        ...

    def preemption_victim(self, running: list[int]) -> int:
        """Which running request a preempting engine (vLLM-style) evicts; `running` is in
        admission order."""
        ...

    def counter_events(self) -> pd.DataFrame | None:
        """Every change to the policy's per-client counters (policies/counters.py), or None for
        a policy without counters. Called once, after the run."""
        ...


class BasePolicy:
    """No-op hooks, so a policy only writes the ones it needs."""

    name = "base"

    def bind(self, trace: Trace, chunked: bool = False) -> None:
        self.trace = trace
        self.chunked = chunked

    def on_arrival(self, req: int, now: float, queue: WaitingQueue) -> str | None:
        return None

    def pick(self, queue: WaitingQueue, now: float) -> int | None:
        raise NotImplementedError

    def on_admit(self, req: int, now: float) -> None:
        return None

    def on_prompt(self, req: int, tokens: int, now: float) -> None:
        return None

    def screen(self, req: int, now: float) -> str | None:
        return None

    def on_blocked(self, req: int, now: float, queue: WaitingQueue) -> str | None:
        return None

    def on_decode(self, running: np.ndarray, clients: np.ndarray, step_ends: np.ndarray) -> None:
        return None

    def on_finish(self, req: int, now: float) -> None:
        return None

    def preemption_victim(self, running: list[int]) -> int:
        """vLLM's FCFS rule: the most recently admitted request."""
        return running[-1]

    def counter_events(self) -> pd.DataFrame | None:
        return None
