"""Virtual token counters: VTC, weighted VTC and LCF (spec: policies.md, VTC paper Algorithm 2).

One counter per client. Selection: the waiting client with the smallest counter (ties: the client
that appeared first), its earliest request; batch forming stops at the first that does not fit.
Charges: w_p per prompt token at admission, w_q per output token after each decode step (the
first token, from the prefill step, is free), each divided by the client's weight.
Counter lift on an arrival whose client has nothing waiting:
- "paper" (default): empty queue -> max(c_u, c_last_left); else max(c_u, min of waiting counters);
- "artifact": only the min over other waiting clients, nothing when none waits;
- "none": LCF, least counter first, which lets a returning idle client starve the others.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from policies.base import BasePolicy
from simulator.queue import WaitingQueue
from traces.schema import Trace

LIFTS = ("paper", "artifact", "none")


def add_repeated(value: float, increment: float, times: int) -> float:
    """value + increment added `times` times, one addition at a time (so chunking never matters)."""
    if times == 1:
        return value + increment
    steps = np.full(times + 1, increment)
    steps[0] = value
    return float(np.cumsum(steps)[-1])


class VTC(BasePolicy):
    name = "vtc"

    def __init__(
        self,
        input_price: float = 1.0,
        output_price: float = 2.0,
        lift: str = "paper",
        weights: Mapping[str, float] | None = None,
        finish_extra_charge: bool = False,
    ) -> None:
        if lift not in LIFTS:
            raise ValueError(f"policy.lift must be one of {LIFTS}, got {lift!r}")
        for label, price in (("input_price", input_price), ("output_price", output_price)):
            if not (np.isfinite(price) and price >= 0):
                raise ValueError(f"policy.{label} must be a number >= 0, got {price!r}")
        self.input_price, self.output_price = float(input_price), float(output_price)
        self.lift = lift
        self.weights = dict(weights or {})
        self.finish_extra_charge = finish_extra_charge

    def bind(self, trace: Trace) -> None:
        super().bind(trace)
        weight = trace.client_weight.astype(np.float64)
        for name, w in self.weights.items():
            if name not in trace.client_names:
                raise ValueError(
                    f"policy.weights: unknown client {name!r}; clients are "
                    f"{list(trace.client_names)}"
                )
            if not (np.isfinite(w) and w > 0):
                raise ValueError(f"policy.weights[{name}] must be > 0, got {w!r}")
            weight[trace.client_names.index(name)] = float(w)
        self.weight = weight
        self.counter = np.zeros(trace.num_clients)
        self.first_seen = np.full(trace.num_clients, np.iinfo(np.int64).max)
        self._seen = 0
        self._charged_step = -1.0  # end time of the last step given the artifact's extra charge
        self._last_step: tuple[float, np.ndarray] | None = None

    def on_arrival(self, req: int, now: float, queue: WaitingQueue) -> str | None:
        u = int(self.trace.client[req])
        if self.first_seen[u] == np.iinfo(np.int64).max:
            self.first_seen[u] = self._seen
            self._seen += 1
        if self.lift == "none" or queue.has_waiting(u):
            return None
        waiting = queue.waiting_clients()
        if waiting:
            floor = min(self.counter[c] for c in waiting)
            self.counter[u] = max(self.counter[u], floor)
        elif self.lift == "paper" and queue.last_left_client is not None:
            self.counter[u] = max(self.counter[u], self.counter[queue.last_left_client])
        return None

    def pick(self, queue: WaitingQueue, now: float) -> int | None:
        waiting = queue.waiting_clients()
        if not waiting:
            return None
        best = min(waiting, key=lambda c: (self.counter[c], self.first_seen[c]))
        return queue.head(best)

    def on_admit(self, req: int, now: float) -> None:
        c = int(self.trace.client[req])
        self.counter[c] += self.input_price * float(self.trace.prompt_len[req]) / self.weight[c]

    def on_decode(self, running_clients: np.ndarray, step_ends: np.ndarray) -> None:
        counts = np.bincount(running_clients, minlength=self.counter.shape[0])
        for c in np.flatnonzero(counts).tolist():
            inc = self.output_price * float(counts[c]) / self.weight[c]
            self.counter[c] = add_repeated(float(self.counter[c]), inc, step_ends.shape[0])
        self._last_step = (float(step_ends[-1]), running_clients)

    def on_finish(self, req: int, now: float) -> None:
        if not self.finish_extra_charge or self._last_step is None:
            return
        end, clients = self._last_step
        if end == now and self._charged_step != now:
            self._charged_step = now  # once per step, for everyone in that step's batch
            counts = np.bincount(clients, minlength=self.counter.shape[0])
            self.counter += self.output_price * counts / self.weight


class LCF(VTC):
    """Least counter first: VTC's counters without the lift."""

    name = "lcf"

    def __init__(
        self,
        input_price: float = 1.0,
        output_price: float = 2.0,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__(input_price, output_price, lift="none", weights=weights)
