"""Virtual token counters: VTC and its variants, and LCF (the VTC paper's Algorithms 2-4).

One counter per client. Selection: the waiting client with the smallest counter (ties: the client
that appeared first), its earliest request; batch forming stops at the first that does not fit.
Charges (policies/charging.py): h(n_p, 0) for the prompt as it is computed (at admission on the
S-LoRA engine), then each output token after the first; each divided by the client's weight.
h is linear (w_p = 1, w_q = 2) or the paper's profiled one.
Counter lift on an arrival whose client has nothing waiting:
- "paper" (default): empty queue -> max(c_u, c_last_left); else max(c_u, min of waiting counters);
- "artifact": only the min over other waiting clients, nothing when none waits;
- "none": LCF, least counter first, which lets a returning idle client starve the others.
Length prediction (Algorithm 3): "oracle" charges the output up front, exact or (predict_range r
> 0) drawn uniformly from [L(1 - r), L(1 + r)] (rounded) with the policy's own seeded stream;
"moving_average" predicts each client's recent mean output; tokens past the prediction are charged
as they come and an over-prediction is refunded at finish.
Counting: "paper" (default) charges each output token as it comes, h(n_p, n_q) - h(n_p, n_q - 1)
for the n_q-th; "artifact" does what the VTC artifact's router does (update_counter in its
manager.py, twice in some steps): a decode step is charged with the lengths before it (the token
it makes costs h(n_p, n_q - 1) - h(n_p, n_q - 2)), and a step in which a request finishes
(a decode, or the prefill of a request with one output token) charges its whole batch, the
finished ones included, once more for their latest token; with a prediction, both only past it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from policies.base import BasePolicy
from policies.charging import TokenCharges, client_weights, sequential_sum
from simulator.core.counters import ADMIT, DECODE, FINISH_EXTRA, LIFT, PROMPT, REFUND, CounterLog
from simulator.core.errors import ConfigError
from simulator.core.queue import WaitingQueue
from simulator.core.seam import (
    ALL_CHARGES,
    Admission,
    Charge,
    Left,
    OutputTokens,
    PromptTokens,
    Verdict,
)
from simulator.core.service import make_service
from traces.schema import Trace

LIFTS = ("paper", "artifact", "none")
VICTIMS = ("fcfs", "max_counter")
PREDICTIONS = ("none", "oracle", "moving_average")
COUNTINGS = ("paper", "artifact")
NEVER = np.iinfo(np.int64).max


def lift_floor(counter: np.ndarray, queue: WaitingQueue, client: int, lift: str) -> float:
    """The counter `client` is lifted to on an arrival (-inf: no lift): only when it has nothing
    waiting; "paper": min over waiting clients, else the last client to leave the queue;
    "artifact": min over waiting clients only; "none": never."""
    if lift == "none" or queue.has_waiting(client):
        return -np.inf
    waiting = queue.waiting_clients()
    if waiting:
        return float(min(counter[c] for c in waiting))
    if lift == "paper" and queue.last_left_client is not None:
        return float(counter[queue.last_left_client])
    return -np.inf


class LeastServed(BasePolicy):
    """Per-client counters with VTC's lift and least-counter-first selection (ties: the client
    that appeared first): what VTC, LCF and FairServe's WSC share. Subclasses say what to
    charge; every change goes to the counter log."""

    runs_live = True

    lift = "paper"
    victim_rule = "fcfs"

    def bind(self, trace: Trace) -> None:
        super().bind(trace)
        self.counter = np.zeros(trace.num_clients)
        self.first_seen = np.full(trace.num_clients, NEVER)
        self._seen = 0
        self.log = CounterLog()

    def counter_events(self) -> pd.DataFrame:
        return self.log.frame(list(self.trace.client_names))

    def counter_log(self) -> CounterLog:
        return self.log

    def _charge(self, client: int, delta: float, now: float, cause: int) -> None:
        self.counter[client] += delta
        self.log.add(now, client, delta, float(self.counter[client]), cause)

    def _appears(self, client: int) -> None:
        """Note the client's first appearance (the selection's tie-break)."""
        if self.first_seen[client] == NEVER:
            self.first_seen[client] = self._seen
            self._seen += 1

    def _lift(self, client: int, now: float, queue: WaitingQueue) -> None:
        """VTC's counter lift (self.lift) for an arrival of `client`."""
        floor = lift_floor(self.counter, queue, client, self.lift)
        if floor > self.counter[client]:
            self._charge(client, floor - self.counter[client], now, LIFT)

    def least_served(self, clients: list[int]) -> int:
        return min(clients, key=lambda c: (self.counter[c], self.first_seen[c]))

    def victim(self, running: list[int]) -> int:
        """ "fcfs": the most recently admitted request; "max_counter": the most recently
        admitted request of the running client with the largest counter (ties: the client that
        appeared last)."""
        if self.victim_rule == "fcfs":
            return running[-1]
        client = self.trace.client
        clients = {int(client[r]) for r in running}
        top = max(clients, key=lambda c: (self.counter[c], self.first_seen[c]))
        return next(r for r in reversed(running) if client[r] == top)

    @staticmethod
    def _check_victim(victim: str) -> str:
        if victim not in VICTIMS:
            raise ConfigError(f"policy.victim must be one of {VICTIMS}, got {victim!r}")
        return victim


class VTC(LeastServed):
    name = "vtc"
    charged = ALL_CHARGES

    def __init__(
        self,
        input_price: float = 1.0,
        output_price: float = 2.0,
        lift: str = "paper",
        weights: Mapping[str, float] | None = None,
        counting: str = "paper",
        service: str = "linear",
        prediction: str = "none",
        predict_range: float = 0.0,
        seed: int = 0,
        victim: str = "fcfs",
    ) -> None:
        if lift not in LIFTS:
            raise ConfigError(f"policy.lift must be one of {LIFTS}, got {lift!r}")
        if counting not in COUNTINGS:
            raise ConfigError(f"policy.counting must be one of {COUNTINGS}, got {counting!r}")
        if prediction not in PREDICTIONS:
            raise ConfigError(f"policy.prediction must be one of {PREDICTIONS}, got {prediction!r}")
        if not (0.0 <= predict_range <= 1.0):
            raise ConfigError(f"policy.predict_range must be in [0, 1], got {predict_range!r}")
        if predict_range and prediction != "oracle":
            raise ConfigError("policy.predict_range applies only to prediction=oracle (VTC(±r))")
        self.service = make_service(service, input_price, output_price)
        self.lift, self.prediction = lift, prediction
        self.predict_range, self.seed = float(predict_range), int(seed)
        self.weights = dict(weights or {})
        self.counting = counting
        self.victim_rule = self._check_victim(victim)

    def bind(self, trace: Trace) -> None:
        super().bind(trace)
        self.weight = client_weights(trace, self.weights)
        predicted = None
        if self.prediction == "oracle":
            predicted = trace.output_len  # a view: a live run fills rows as requests arrive
            if self.predict_range:
                rng = np.random.default_rng(self.seed)
                r = self.predict_range
                # a predictor names a token count: rounding keeps the final charge exactly h(p, L)
                predicted = np.round(predicted * rng.uniform(1.0 - r, 1.0 + r, len(trace)))
        elif self.prediction == "moving_average":
            predicted = np.zeros(len(trace))  # filled in at admission from the client's mean
            self.mean_output = np.zeros(trace.num_clients)
        artifact = self.counting == "artifact"
        self.charges = TokenCharges(trace, self.service, self.weight, predicted, artifact)
        self._charged_step = -1.0  # end time of the last step given the artifact's extra charge
        self._last_step: tuple[float, np.ndarray] | None = None  # its end and its batch's rows
        # artifact counting: the requests admitted together (one prefill), by request
        self._admitted_with: dict[int, list[int]] = {}
        self._admitting: tuple[float, list[int]] = (-1.0, [])
        self._settled: set[int] = set()  # requests that left, their charges settled (`Left`)

    def on_arrival(self, req: int, now: float, queue: WaitingQueue) -> str | None:
        c = int(self.trace.client[req])
        self._appears(c)
        self._lift(c, now, queue)
        return None

    def pick(self, queue: WaitingQueue, now: float) -> int | None:
        waiting = queue.waiting_clients()
        return queue.head(self.least_served(waiting)) if waiting else None

    def admit(self, req: int, now: float, fits: bool) -> Admission:
        if not fits:
            return Verdict.WAIT
        if not self.charges.admitted(req):  # a preempted request resumes without a charge
            c = int(self.trace.client[req])
            if self.prediction == "moving_average":
                self.charges.predicted[req] = self.mean_output[c]  # type: ignore[index]
            predicted = self.charges.admit(req)
            if predicted:
                self._charge(c, predicted, now, ADMIT)
            if self.counting == "artifact":
                if self._admitting[0] != now:
                    self._admitting = (now, [])
                self._admitting[1].append(req)
                self._admitted_with[req] = self._admitting[1]
        return Verdict.ADMIT

    def charge(self, event: Charge) -> None:
        if isinstance(event, OutputTokens):
            self._output_tokens(event.rows, event.clients, event.step_ends, event.with_first)
        elif isinstance(event, PromptTokens):
            c = int(self.trace.client[event.req])
            self._charge(c, self.charges.prompt_tokens(event.req, event.tokens), event.now, PROMPT)
        elif isinstance(event, Left):
            self._left(event.req, event.now, event.served)
        else:
            self._finished(event.req, event.now)

    def _output_tokens(
        self, rows: np.ndarray, clients: np.ndarray, step_ends: np.ndarray, with_first: bool
    ) -> None:
        one = self.charges.decode_step(clients) if step_ends.shape[0] == 1 else None
        if one is not None:  # one step: the same sums as below, without numpy per client
            t = float(step_ends[0])
            for c, inc in one:
                value = float(self.counter[c]) + inc
                self.counter[c] = value
                self.log.add(t, c, inc, value, DECODE)
            self._last_step = (t, rows)
            return
        for c, incs in self.charges.decode(rows, clients, step_ends.shape[0], with_first):
            values = sequential_sum(float(self.counter[c]), incs)
            self.counter[c] = values[-1]
            self.log.add_many(step_ends, c, incs, values, DECODE)
        self._last_step = (float(step_ends[-1]), rows)

    def _finished(self, req: int, now: float) -> None:
        c = int(self.trace.client[req])
        refund = self.charges.refund(req)
        if refund:
            self._charge(c, refund, now, REFUND)
        if self.prediction == "moving_average":
            actual, old = float(self.trace.output_len[req]), self.mean_output[c]
            self.mean_output[c] = actual if old == 0 else (4.0 * old + actual) / 5.0
        if self.counting == "artifact":
            self._charge_batch_again(req, now)

    def _left(self, req: int, now: float, served: int) -> None:
        """A request that left early gives back the predicted output not served here (its
        true length stays unknown: the moving average does not learn from it)."""
        self._admitted_with.pop(req, None)
        if not self.charges.admitted(req) or req in self._settled:
            return
        self._settled.add(req)  # (a handed-off request whose client then gives up)
        refund = self.charges.refund(req, served)
        if refund:
            self._charge(int(self.trace.client[req]), refund, now, REFUND)

    def _charge_batch_again(self, req: int, now: float) -> None:
        """The artifact router updates the counters again after a step in which a request
        finished, for the whole batch of that step (the finished ones included): a decode
        step's, or the requests prefilled together when one ends at its first token."""
        batch = self._admitted_with.pop(req, None)
        if self.trace.output_len[req] == 1 and batch is not None:  # it ended at its prefill
            rows = list(batch)
            batch.clear()  # once per prefill, however many of its requests ended there
        elif self._last_step is not None and self._last_step[0] == now:
            if self._charged_step == now:
                return  # once per step, however many of its requests finished
            self._charged_step = now
            rows = self._last_step[1].tolist()
        else:
            return
        for c, inc in self.charges.again(rows):
            self._charge(c, inc, now, FINISH_EXTRA)


class LCF(VTC):
    """Least counter first: VTC's counters without the lift."""

    name = "lcf"

    def __init__(
        self,
        input_price: float = 1.0,
        output_price: float = 2.0,
        weights: Mapping[str, float] | None = None,
        service: str = "linear",
        victim: str = "fcfs",
        counting: str = "paper",
    ) -> None:
        super().__init__(
            input_price,
            output_price,
            lift="none",
            weights=weights,
            counting=counting,
            service=service,
            victim=victim,
        )
