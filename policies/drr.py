"""Adapted deficit round robin (VTC paper, Appendix C.2): VTC's ancestor, kept for comparison.

Each client holds a credit C_i (starting at 0). Clients are visited round-robin in the order they
first appeared; a visited client with C_i <= 0 is refilled by the quantum Q (clients with nothing
waiting too, so an idle client ends up with credit in (0, Q]). A waiting client with C_i > 0 has
its requests scheduled until its credit is used up: the prompt's cost is subtracted as it is
computed (at admission on the S-LoRA engine) and every decoded token's cost as it comes (the same
charges as VTC, policies/charging.py), so C_i can go far below 0
and the client then sits out rounds until refills bring it back. With Q -> 0 this becomes VTC.
Rounds in which no waiting client could turn positive are skipped in bulk.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from policies.base import BasePolicy
from policies.charging import TokenCharges, client_weights, sequential_sum
from simulator.core.counters import DECODE, PROMPT, REFILL, CounterLog
from simulator.core.errors import ConfigError
from simulator.core.queue import WaitingQueue
from simulator.core.seam import Admission, Charge, OutputTokens, PromptTokens, Verdict
from simulator.core.service import make_service
from traces.schema import Trace


class DRR(BasePolicy):
    runs_live = True
    name = "drr"
    charged = frozenset({PromptTokens, OutputTokens})

    def __init__(
        self,
        quantum: float = 500.0,
        input_price: float = 1.0,
        output_price: float = 2.0,
        weights: Mapping[str, float] | None = None,
        service: str = "linear",
    ) -> None:
        if not (np.isfinite(quantum) and quantum > 0):
            raise ConfigError(f"policy.quantum must be a number > 0, got {quantum!r}")
        self.quantum = float(quantum)
        self.service = make_service(service, input_price, output_price)
        self.weights = dict(weights or {})

    def bind(self, trace: Trace) -> None:
        super().bind(trace)
        weight = client_weights(trace, self.weights)
        self.charges = TokenCharges(trace, self.service, weight)
        self.credit = np.zeros(trace.num_clients)
        self.order: list[int] = []  # clients in the order they first appeared: the round
        self.position = -1  # index into `order` of the client being served
        self.log = CounterLog()

    def counter_events(self) -> pd.DataFrame:
        return self.log.frame(list(self.trace.client_names))

    def counter_log(self) -> CounterLog:
        return self.log

    def on_arrival(self, req: int, now: float, queue: WaitingQueue) -> str | None:
        c = int(self.trace.client[req])
        if c not in self.order:
            self.order.append(c)
        return None

    def pick(self, queue: WaitingQueue, now: float) -> int | None:
        if self.position >= 0:  # the client whose turn it is, while in credit and waiting
            current = self.order[self.position]
            if self.credit[current] > 0 and queue.has_waiting(current):
                return queue.head(current)
        waiting = set(queue.waiting_clients())
        if not waiting:
            return None
        self._skip_idle_rounds(waiting, now)
        while True:  # ends within one round: _skip_idle_rounds left a client one refill away
            self.position = (self.position + 1) % len(self.order)
            c = self.order[self.position]
            if self.credit[c] <= 0:
                self._refill(c, 1, now)
            if c in waiting and self.credit[c] > 0:
                return queue.head(c)

    def _refills_needed(self, c: int) -> int:
        """Refills until C_c > 0 (0 when it already is)."""
        return 0 if self.credit[c] > 0 else math.floor(-self.credit[c] / self.quantum) + 1

    def _skip_idle_rounds(self, waiting: set[int], now: float) -> None:
        rounds = min(self._refills_needed(c) for c in waiting) - 1
        if rounds <= 0:
            return
        for c in self.order:
            n = min(rounds, self._refills_needed(c))
            if n:
                self._refill(c, n, now)

    def _refill(self, c: int, times: int, now: float) -> None:
        delta = self.quantum * times
        self.credit[c] += delta
        self.log.add(now, c, delta, float(self.credit[c]), REFILL)

    def admit(self, req: int, now: float, fits: bool) -> Admission:
        if not fits:
            return Verdict.WAIT
        if not self.charges.admitted(req):
            self.charges.admit(req)  # no prediction: nothing to charge yet
        return Verdict.ADMIT

    def charge(self, event: Charge) -> None:
        if isinstance(event, PromptTokens):
            c = int(self.trace.client[event.req])
            cost = self.charges.prompt_tokens(event.req, event.tokens)
            self.credit[c] -= cost
            self.log.add(event.now, c, -cost, float(self.credit[c]), PROMPT)
        elif isinstance(event, OutputTokens):
            steps = event.step_ends.shape[0]
            one = self.charges.decode_step(event.clients) if steps == 1 else None
            if one is not None:  # one step: the same sums as below, without numpy per client
                t = float(event.step_ends[0])
                for c, inc in one:
                    value = float(self.credit[c]) - inc
                    self.credit[c] = value
                    self.log.add(t, c, -inc, value, DECODE)
                return
            for c, incs in self.charges.decode(event.rows, event.clients, steps, event.with_first):
                values = sequential_sum(float(self.credit[c]), -incs)
                self.credit[c] = values[-1]
                self.log.add_many(event.step_ends, c, -incs, values, DECODE)
