"""`BasePolicy`: the seam's answers when a policy has nothing to say (simulator/core/seam.py
defines the seam), so a policy writes only what it needs."""

from __future__ import annotations

from simulator.core.queue import WaitingQueue
from simulator.core.seam import ADMIT, NO_CHARGES, WAIT, Admission, Charge
from traces.schema import Trace


class BasePolicy:
    name = "base"
    charged: frozenset[type] = NO_CHARGES
    runs_live = False  # a policy that can serve fairsim-serve says so

    def bind(self, trace: Trace) -> None:
        self.trace = trace

    def on_arrival(self, req: int, now: float, queue: WaitingQueue) -> str | None:
        return None

    def pick(self, queue: WaitingQueue, now: float) -> int | None:
        raise NotImplementedError

    def admit(self, req: int, now: float, fits: bool) -> Admission:
        """Admit what fits; keep the rest waiting."""
        return ADMIT if fits else WAIT

    def charge(self, event: Charge) -> None:
        return None

    def victim(self, running: list[int]) -> int:
        """vLLM's FCFS rule: the most recently admitted request."""
        return running[-1]
