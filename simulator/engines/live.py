"""A run whose requests arrive while it runs: the engine side of live mode.

The runner knows every request's row before a run starts; a live run knows none. A
`LiveSession` gives the runner a trace of `capacity` empty rows, fills row n when the n-th
request arrives (`submit`: client, prompt and output lengths, arrival time) and pushes it.
Simulated time moves only with `advance(t)`, which promises that every arrival before t has been
submitted, so the timeline is exactly that of an offline run of the same arrivals
(`arrivals()` gives them as a trace). `emitted()` reports, per request, the simulated times of
the tokens it produced since the last call, and whether it has ended.

A request may name its interaction (any key), its call index in it and its system-prompt
length; clients may belong to apps (`client_apps`). The trace's source is `LIVE_SOURCE`, which
tells a policy that derives per-row data at bind (FairServe's prices) to derive it on arrival.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from cost_models.base import StepCostModel
from simulator.core.errors import ConfigError
from simulator.core.requests import IN_FLIGHT, STATUSES
from simulator.core.seam import Policy
from simulator.core.timeline import Timeline
from simulator.engines.dispatch import ClusterConfig
from simulator.engines.online import OnlineRunner
from simulator.engines.step_model import EngineConfig
from traces.schema import LIVE_SOURCE, Trace


# policies that read per-row data only through views of the trace, or on arrival
class CapacityError(RuntimeError):
    """The session has taken as many requests as it was made for."""


@dataclass(frozen=True)
class Emitted:
    """What one request did since the last `LiveSession.emitted()` call."""

    row: int
    times: list[float]  # simulated times of its new tokens, in order
    ended: bool  # completed (its last token is in `times` or was before), rejected or refused
    status: str  # one of STATUSES
    reason: str | None  # why it was rejected or refused


class LiveSession:
    def __init__(
        self,
        policy: Policy,
        cost: StepCostModel,
        engine: EngineConfig,
        cluster: ClusterConfig | None = None,
        clients: tuple[str, ...] = ("default",),
        weights: tuple[float, ...] | None = None,
        capacity: int = 100_000,
        client_apps: tuple[str, ...] | None = None,
    ) -> None:
        """`client_apps`: each client's app (FairServe's app limits), or None: no apps."""
        if not policy.runs_live:
            raise ConfigError(
                f"policy {policy.name!r} is not supported in live mode (it does not declare "
                "runs_live); the built-in ones that do: fcfs, rpm, priority, lcf, drr, the vtc "
                "family, the fairserve family, rpm_interaction"
            )
        if capacity < 1:
            raise ConfigError(f"capacity must be an integer >= 1, got {capacity}")
        if engine.horizon is not None:
            raise ConfigError("engine.horizon must be null in live mode (the clients end it)")
        w = np.ones(len(clients)) if weights is None else np.asarray(weights, dtype=np.float64)
        apps: dict[str, object] = {}
        if client_apps is not None:
            if len(client_apps) != len(clients):
                raise ValueError("client_apps needs one app per client")
            names = tuple(dict.fromkeys(client_apps))
            self._app_of = np.array([names.index(a) for a in client_apps], dtype=np.int64)
            apps = {"app": np.zeros(capacity, dtype=np.int64), "app_names": names}
        rows = np.arange(capacity, dtype=np.int64)
        empty = Trace(
            request_id=rows,
            client=np.zeros(capacity, dtype=np.int64),
            arrival=np.full(capacity, np.inf),  # rows not yet arrived
            prompt_len=np.ones(capacity, dtype=np.int64),
            output_len=np.ones(capacity, dtype=np.int64),
            client_names=tuple(clients),
            client_weight=w,
            interaction_id=-1 - rows,  # each request its own interaction unless it names one
            call_index=np.zeros(capacity, dtype=np.int64),
            system_prompt_len=np.zeros(capacity, dtype=np.int64),
            source=LIVE_SOURCE,
            **apps,  # type: ignore[arg-type]
        )
        self.runner = OnlineRunner(empty, policy, cost, engine, cluster)
        self.cost, self.engine = cost, engine  # what the run folder's QoE scoring needs
        self.capacity, self.count = capacity, 0
        self._sent: dict[int, int] = {}  # active row -> tokens reported
        self._stamp = (-1, -1)  # (steps applied, requests ended) at the last emitted()

    @property
    def now(self) -> float:
        """Every arrival before this simulated time has been submitted."""
        return float(self.runner.frontier)

    def submit(
        self,
        client: int,
        prompt_len: int,
        output_len: int,
        arrival: float,
        interaction: int | None = None,
        call_index: int = 0,
        system_prompt_len: int = 0,
    ) -> int:
        """A request arrives at `arrival` (>= `now`); its row. `interaction`: a key >= 0 shared
        by the calls of one interaction (None: its own), `call_index` its place in it."""
        if self.count >= self.capacity:
            raise CapacityError(f"the live session is full ({self.capacity} requests)")
        if not 0 <= client < len(self.runner.trace.client_names):
            raise ValueError(f"client {client} is not one of the session's clients")
        if prompt_len < 1 or output_len < 1:
            raise ValueError("prompt_len and output_len must be >= 1")
        if not arrival >= self.now:
            raise ValueError(f"arrival {arrival} s is before the session's time {self.now} s")
        if (interaction is not None and interaction < 0) or call_index < 0:
            raise ValueError("interaction keys and call indices are integers >= 0")
        if not 0 <= system_prompt_len <= prompt_len:
            raise ValueError("system_prompt_len must be in 0 .. prompt_len")
        row = self.count
        trace = self.runner.trace
        trace.arrival[row] = arrival
        if interaction is not None:
            trace.interaction_id[row] = interaction  # type: ignore[index]
        trace.call_index[row] = call_index  # type: ignore[index]
        trace.system_prompt_len[row] = system_prompt_len  # type: ignore[index]
        if trace.app is not None:
            trace.app[row] = self._app_of[client]
        self.runner.fill_row(row, client, prompt_len, output_len)
        self.runner.push([row], [arrival])
        self.count += 1
        self._sent[row] = 0
        return row

    def abort(self, row: int) -> None:
        """The client of `row` went away: it leaves the queue, or its replica frees its memory
        at the next step; it ends as rejected, reason `aborted`."""
        self.runner.abort(row, self.now)

    def advance(self, t: float, form: bool = True) -> None:
        """Run the simulation up to `t`: no arrival before `t` remains to be submitted. `form`
        False: apply the steps that end before `t` but form the next ones only at `form()` (or
        the next call): a server hands out the tokens first (OnlineRunner.form)."""
        self.runner.run_until(t, form)

    def form(self) -> bool:
        """Form the steps `advance(t, form=False)` left unformed; forming may apply more that
        end before `now` (a late caller), whose tokens `emitted()` then gives. False: nothing
        was left to form."""
        return self.runner.form()

    def next_event(self) -> float:
        """The earliest simulated time at which a step may end (inf: none until a request is
        submitted): a caller can sleep until then unless a request arrives first."""
        return self.runner.next_event()

    def emitted(self) -> list[Emitted]:
        """Per active request with news: the tokens it emitted since the last call."""
        state, replicas = self.runner.state, self.runner.replicas
        # news comes only with a step applied or a request ended: otherwise skip the scan (an
        # arrival wakes a live server's driver; 200 streams made this scan its main cost)
        stamp = (sum(len(rep.steps) for rep in replicas), state.ended)
        if stamp == self._stamp:
            return []
        self._stamp = stamp
        out: list[Emitted] = []
        for row, sent in list(self._sent.items()):
            status = int(state.status[row])
            replica = int(state.replica[row])
            times = replicas[replica].token_times(row, sent) if replica >= 0 else []
            ended = status != IN_FLIGHT
            if not times and not ended:
                continue
            if ended:
                del self._sent[row]
            else:
                self._sent[row] = sent + len(times)
            reason = state.reason[row] if ended and status else None
            out.append(Emitted(row, times, ended, STATUSES[status], reason))
        return out

    def close(self) -> Timeline:
        """No more requests: run every one to its end; the timeline of the requests that
        arrived (rows 0 .. count - 1)."""
        timeline = self.runner.close()
        n = self.count
        rows = np.arange(n)
        return dataclasses.replace(
            timeline,
            trace=self.arrivals(),
            arrival=timeline.arrival[:n],
            status=timeline.status[:n],
            reason=timeline.reason[:n],
            admitted_at=timeline.admitted_at[:n],
            first_token_at=timeline.first_token_at[:n],
            finished_at=timeline.finished_at[:n],
            generated=timeline.generated[:n],
            request_columns={k: v[rows] for k, v in timeline.request_columns.items()},
        )

    def arrivals(self) -> Trace:
        """The requests submitted so far as a trace: an offline run of it (same configuration)
        gives this session's timeline."""
        trace = self.runner.trace.take(np.arange(self.count))
        return dataclasses.replace(trace, source="<live session arrivals>")
