"""Fair queuing across clients' flows, the classic way a gateway picks between tenants' queues
(the inference extension's flow control runs round robin across a priority band's flows); both
also run as an engine's policy.

- `RoundRobin` (`round_robin`): one request per waiting client in turn, clients in code order
  (the trace's order of first appearance), the turn passing on only when a request is admitted.
- `WFQ` (`wfq`): weighted fair queuing on tokens, self-clocked (Golestani's SCFQ): a request
  arriving gets the finish tag max(V, F_c) + cost / w_c, where F_c is the tag of its client's
  previous arrival, cost = input_price x prompt + output_price x output (a gateway knows a
  request's max_tokens; the output length stands in for it) and w_c the client's weight; the
  lane head with the smallest tag is admitted (ties: the lower client code) and V becomes its
  tag. A preempted request keeps its tag (it is not charged again).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from policies.base import BasePolicy
from policies.charging import client_weights
from simulator.core.errors import ConfigError
from simulator.core.queue import WaitingQueue
from simulator.core.seam import ADMIT, WAIT, Admission
from traces.schema import Trace


class RoundRobin(BasePolicy):
    runs_live = True
    name = "round_robin"

    def bind(self, trace: Trace) -> None:
        super().bind(trace)
        self.last = -1  # the client whose request was admitted last
        self.picked: int | None = None

    def pick(self, queue: WaitingQueue, now: float) -> int | None:
        clients = sorted(queue.waiting_clients())
        if not clients:
            return None
        after = [c for c in clients if c > self.last]
        client = after[0] if after else clients[0]
        self.picked = queue.head(client)
        return self.picked

    def admit(self, req: int, now: float, fits: bool) -> Admission:
        if not fits:
            return WAIT
        self.last = int(self.trace.client[req])
        return ADMIT


class WFQ(BasePolicy):
    runs_live = True
    name = "wfq"

    def __init__(
        self,
        input_price: float = 1.0,
        output_price: float = 2.0,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        for key, v in (("input_price", input_price), ("output_price", output_price)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0:
                raise ConfigError(f"policy.{key} must be a number >= 0, got {v!r}")
        if input_price == 0 and output_price == 0:
            raise ConfigError("policy.input_price and policy.output_price are both 0: give one > 0")
        self.input_price, self.output_price = float(input_price), float(output_price)
        self.weights = dict(weights or {})

    def bind(self, trace: Trace) -> None:
        super().bind(trace)
        self.weight = client_weights(trace, self.weights)
        self.last_tag = np.zeros(trace.num_clients)  # F_c: the tag of c's latest arrival
        self.virtual = 0.0  # V: the tag of the request admitted last
        self.tag: dict[int, float] = {}  # each waiting (or preempted) request's finish tag

    def on_arrival(self, req: int, now: float, queue: WaitingQueue) -> str | None:
        t, c = self.trace, int(self.trace.client[req])
        cost = self.input_price * float(t.prompt_len[req]) + self.output_price * float(
            t.output_len[req]
        )
        tag = max(self.virtual, float(self.last_tag[c])) + cost / float(self.weight[c])
        self.last_tag[c] = self.tag[req] = tag
        return None

    def pick(self, queue: WaitingQueue, now: float) -> int | None:
        """The lane head with the smallest tag (ties: the lower client code)."""
        heads = [
            (self.tag[h], c, h) for c in queue.waiting_clients() if (h := queue.head(c)) is not None
        ]
        return min(heads)[2] if heads else None

    def admit(self, req: int, now: float, fits: bool) -> Admission:
        if not fits:
            return WAIT
        self.virtual = max(self.virtual, self.tag[req])
        return ADMIT
