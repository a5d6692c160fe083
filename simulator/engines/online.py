"""The runner online: arrivals pushed while the run goes, as live mode (simulator/engines/live.py)
learns them.

Nothing arrives from the trace by itself. `push(rows, times)` makes rows arrive (a live run
first writes a row with `fill_row`, since it learns a request only when it comes), and
`run_until(t)` advances the simulation to `t`, promising that every arrival before `t` has been
pushed: the frontier. Replicas never apply a step that ends at or after it, so the timeline is
exactly the one an offline run of the same arrivals gives. A client that goes away `abort`s its
request.

`run_until(t, form=False)` applies the steps that end before `t`, and a standalone replica
that applied one leaves the next unformed until `form()`: a live server hands the ended steps'
tokens to their clients first, as vLLM's engine sends a step's output before it schedules the
next one (forming a step with a prefill takes a millisecond of Python on a busy machine, which
would otherwise delay the tokens of the step before it). The next step depends only on the
state at its start, which nothing that comes meanwhile can change (an arrival then comes at or
after the frontier; an abort forms it first), so the timeline is the same. Coupled replicas
decide at their steps' instants and form at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from simulator.core.requests import IN_FLIGHT, REJECTED
from simulator.engines.runner import ABORTED, Runner


class OnlineRunner(Runner):
    """A `Runner` whose arrivals are pushed (live mode)."""

    pushed = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pushed: set[int] = set()
        self._aborted: set[int] = set()  # requests whose client went away
        self._chained = {row for row, _ in self.successor.values()}

    def accept(self, replica: int, req: int, now: float) -> None:
        if req in self._aborted:  # its client left before it arrived here
            self.state.arrival[req] = now - self.frontend
            self._end(req, now, REJECTED, ABORTED)
            return
        super().accept(replica, req, now)

    def push(self, rows: Sequence[int], times: Sequence[float] | None = None) -> None:
        """Make trace rows arrive at `times` (default: their trace times), each at or after
        the frontier. Chained calls are still released by the runner when their predecessor
        ends. A static dispatcher assigns pushed rows in the order they are pushed."""
        rows = [int(r) for r in rows]
        for req in rows:
            if not 0 <= req < len(self.trace) or req in self._chained:
                raise ValueError(f"push: row {req} is not a first arrival of the trace")
        at = self.trace.arrival[rows] if times is None else np.asarray(times, float)
        for req, t in zip(rows, at.tolist(), strict=True):
            if not t >= self.frontier:
                raise ValueError(f"push: arrival at {t} s is before the frontier {self.frontier} s")
            if req in self._pushed:
                raise ValueError(f"push: row {req} was pushed before")
            self._pushed.add(req)
            self._release(req, t)

    def fill_row(self, req: int, client: int, prompt_len: int, output_len: int) -> None:
        """A live run learns row `req` of its trace only when that request arrives: write it
        into the trace and the request state, and decide whether the engine can ever run it.
        Push it next."""
        trace, state = self.trace, self.state
        trace.client[req], trace.prompt_len[req], trace.output_len[req] = (
            client,
            prompt_len,
            output_len,
        )
        state.client_of[req], state.prompt[req], state.output[req] = client, prompt_len, output_len
        self._refusal[req] = self.engine.refusals(trace.take(np.array([req])), self._cost)[0]

    def abort(self, req: int, now: float) -> None:
        """The client of `req` went away. Waiting, it leaves its queue; running, its
        replica drops it at its next step and frees its memory; not yet delivered, it never
        arrives. It ends as rejected, reason `aborted`."""
        if self.state.status[req] != IN_FLIGHT:
            return
        self.form()  # a step due before the abort is formed without knowing of it
        self._aborted.add(req)
        for queue in {id(q): q for q in self.queues}.values():
            if req in queue:
                queue.remove(req)
                next(rep for rep in self.replicas if rep.queue is queue).forget_waiting(req)
                self._end(req, now, REJECTED, ABORTED)
                return
        if self.state.reason[req] != "not_arrived":  # running, or in a step being formed:
            for rep in self.replicas:  # the replica running it drops it at its next step
                rep.abort(req)

    def run_until(self, t: float, form: bool = True) -> None:
        """Advance to time `t`: every arrival before `t` has been pushed. `form` False: the
        standalone replicas' next steps are formed only by `form()` (or the next call)."""
        if t < self.frontier:
            raise ValueError(f"run_until: {t} s is before the frontier {self.frontier} s")
        self.form()
        self.frontier, self.forming = t, form
        self.advance(t)

    def form(self) -> bool:
        """Form the steps `run_until(t, form=False)` left unformed (and apply those that end
        before the frontier, forming the next): the replicas waiting for the frontier to move
        go on at the present instant. False: nothing was left to form."""
        if self.forming:
            return False
        self.forming = True
        env = self.env
        moved, self._frontier_moved = self._frontier_moved, env.event()
        moved.succeed()
        while env.peek() <= env.now:  # what follows at this instant (the frontier stays)
            env.step()
        return True

    def next_event(self) -> float:
        """The earliest simulated time at which a step may end or a known arrival
        come (inf: nothing until something is pushed). Forms the steps not yet formed."""
        self.form()
        ends = [plan.end for plan in self._held if plan is not None]
        ends += [t for t in self._stepping if t is not None]
        # an arrival before the frontier waits only for the step under way to end
        ends += [t for t in (feed.next_time() for feed in self._feeds) if t >= self.frontier]
        return float(min(ends, default=np.inf))
