"""Multi-app, multi-call workloads built from the FairServe paper's published trace facts.

Users belong to apps. A user starts interactions as a Poisson process; per-user rates are
log-normal around the app's median (a heavy tail: a few users far above the rest). An interaction
is a chain of calls (count drawn from the app's `calls` table); each call has the app's system
prompt plus input and output tokens drawn from the app's distributions. Abusive users start
interactions at a high rate during a burst.

Arrival modes: "open_loop" sends call k at start + k * call_gap (as the FairServe artifact
replayed its trace); "chained" sends call k `think_time` seconds after call k - 1 ends (what real
agents do; the trace's `think_time` column, see Trace.predecessor).

Seeding: SeedSequence(seed) spawns one stream per app and one per abusive group, each of which
spawns one per user, so adding users, apps or abusers never changes anyone else's requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from traces.lengths import Empirical, LengthDistribution
from traces.schema import Trace, TraceError

MODES = ("open_loop", "chained")
# calls per interaction: most 1, some 2-4, rare long chains (26.8% have more than one call)
DEFAULT_CALLS = Empirical(values=(1, 2, 3, 4, 12, 24), weights=(732, 140, 70, 45, 10, 3))


@dataclass(frozen=True)
class AppSpec:
    name: str
    users: int
    user_rate: float  # median interactions per second per user
    prompt: LengthDistribution  # input tokens per call, without the system prompt
    output: LengthDistribution
    system_prompt: int = 0  # tokens per call
    rate_sigma: float = 1.0  # log-normal spread of per-user rates
    calls: LengthDistribution = DEFAULT_CALLS

    def __post_init__(self) -> None:
        if int(self.users) != self.users or self.users < 0:
            raise TraceError(f"app '{self.name}': users must be an integer >= 0")
        if not (np.isfinite(self.user_rate) and self.user_rate > 0):
            raise TraceError(f"app '{self.name}': user_rate must be > 0, got {self.user_rate}")
        if not (self.rate_sigma >= 0):
            raise TraceError(f"app '{self.name}': rate_sigma must be >= 0")
        if int(self.system_prompt) != self.system_prompt or self.system_prompt < 0:
            raise TraceError(f"app '{self.name}': system_prompt must be an integer >= 0")


@dataclass(frozen=True)
class AbusiveUsers:
    """`users` users of `app` each starting `rate` interactions per second in [start, end)."""

    app: str
    users: int
    rate: float
    start: float = 0.0
    end: float = float("inf")

    def __post_init__(self) -> None:
        if int(self.users) != self.users or self.users < 1:
            raise TraceError("AbusiveUsers.users must be an integer >= 1")
        if not (np.isfinite(self.rate) and self.rate > 0):
            raise TraceError(f"AbusiveUsers.rate must be > 0, got {self.rate}")
        if not (0 <= self.start < self.end):
            raise TraceError(f"AbusiveUsers needs 0 <= start < end, got [{self.start}, {self.end})")


@dataclass
class _Calls:
    """Columns being collected, one row per call."""

    user: list[str] = field(default_factory=list)
    app: list[str] = field(default_factory=list)
    arrival: list[np.ndarray] = field(default_factory=list)
    cols: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def add(self, user: str, app: str, arrival: np.ndarray, **cols: np.ndarray) -> None:
        self.user += [user] * arrival.shape[0]
        self.app += [app] * arrival.shape[0]
        self.arrival.append(arrival)
        for k, v in cols.items():
            self.cols.setdefault(k, []).append(v)


@dataclass(frozen=True)
class MultiAppWorkload:
    apps: Sequence[AppSpec]
    duration: float
    abusive: Sequence[AbusiveUsers] = ()
    mode: str = "open_loop"
    call_gap: float = 2.0  # open loop: seconds between the calls of an interaction
    think_time: float = 1.0  # chained: seconds from a call's end to the next call
    rate_scale: float = 1.0  # multiplies every benign user's rate (abusers keep theirs)
    name: str = "multi_app"

    def __post_init__(self) -> None:
        if not self.apps:
            raise TraceError(f"workload '{self.name}': 'apps' is empty")
        names = [a.name for a in self.apps]
        if len(set(names)) != len(names):
            raise TraceError(f"workload '{self.name}': app names repeat: {names}")
        if self.mode not in MODES:
            raise TraceError(f"workload.mode must be one of {MODES}, got {self.mode!r}")
        if not (np.isfinite(self.duration) and self.duration > 0):
            raise TraceError(f"workload '{self.name}': duration must be > 0")
        if not (np.isfinite(self.rate_scale) and self.rate_scale > 0):
            raise TraceError(f"workload.rate_scale must be > 0, got {self.rate_scale}")
        if self.call_gap < 0 or self.think_time < 0:
            raise TraceError("workload.call_gap and workload.think_time must be >= 0")
        for a in self.abusive:
            if a.app not in names:
                raise TraceError(f"abusive users: unknown app {a.app!r}; apps are {names}")

    def build(self, seed: int) -> Trace:
        root = np.random.SeedSequence(seed)
        app_ss, abuse_ss = root.spawn(2)
        calls = _Calls()
        specs = {a.name: a for a in self.apps}
        for app, ss in zip(self.apps, app_ss.spawn(len(self.apps)), strict=True):
            rate_rng = np.random.default_rng(ss.spawn(1)[0])
            spread = rate_rng.lognormal(0.0, app.rate_sigma, app.users)
            rates = self.rate_scale * app.user_rate * spread
            for k, (rate, user_ss) in enumerate(zip(rates, ss.spawn(app.users), strict=True)):
                self._user(calls, f"{app.name}/user{k}", app, float(rate), 0.0, user_ss)
        for g, (abuse, ss) in enumerate(zip(self.abusive, abuse_ss.spawn(len(self.abusive)))):
            end = min(abuse.end, self.duration)
            for k, user_ss in enumerate(ss.spawn(abuse.users)):
                name = f"{abuse.app}/abuser{g}.{k}"
                self._user(calls, name, specs[abuse.app], abuse.rate, abuse.start, user_ss, end)
        if not calls.arrival:
            raise TraceError(f"workload '{self.name}' produced no requests; raise rates/duration")
        cols = {k: np.concatenate(v) for k, v in calls.cols.items()}
        arrival = np.concatenate(calls.arrival)
        # interactions numbered in the order their first calls arrive
        firsts = np.flatnonzero(cols["call_index"] == 0)
        firsts = firsts[np.lexsort((cols["interaction_id"][firsts], arrival[firsts]))]
        number = dict(zip(cols["interaction_id"][firsts].tolist(), range(firsts.shape[0])))
        ids = np.array([number[k] for k in cols["interaction_id"].tolist()], dtype=np.int64)
        return Trace.from_columns(
            client=np.asarray(calls.user, dtype=object),
            app=np.asarray(calls.app, dtype=object),
            arrival=arrival,
            prompt_len=cols["prompt"] + cols["system"],
            output_len=cols["output"],
            optional={
                "interaction_id": ids,
                "call_index": cols["call_index"],
                "num_calls": cols["num_calls"],
                "system_prompt_len": cols["system"],
            },
            think_time=(
                np.where(cols["call_index"] > 0, self.think_time, 0.0)
                if self.mode == "chained"
                else None
            ),
            source=f"workload '{self.name}' (seed {seed})",
            sort=True,
        )

    def _user(
        self,
        calls: _Calls,
        user: str,
        app: AppSpec,
        rate: float,
        start: float,
        ss: np.random.SeedSequence,
        end: float | None = None,
    ) -> None:
        arr_ss, n_ss, p_ss, o_ss = ss.spawn(4)
        end = self.duration if end is None else end
        rng = np.random.default_rng(arr_ss)
        gaps = rng.exponential(1.0 / rate, int(rate * (end - start) * 1.5) + 16)
        t = start + np.cumsum(gaps)
        while t[-1] < end:  # rare: draw more
            t = np.concatenate((t, t[-1] + np.cumsum(rng.exponential(1.0 / rate, t.shape[0]))))
        t = t[t < end]
        if t.size == 0:
            return
        n_calls = app.calls.sample(t.shape[0], np.random.default_rng(n_ss))
        total = int(n_calls.sum())
        # a key unique per interaction: the calls collected so far outnumber past interactions
        inter = np.repeat(np.arange(t.shape[0]) + len(calls.user), n_calls)
        call = np.arange(total) - np.repeat(np.cumsum(n_calls) - n_calls, n_calls)
        calls.add(
            user,
            app.name,
            np.repeat(t, n_calls) + call * self.call_gap,
            interaction_id=inter,
            call_index=call,
            num_calls=np.repeat(n_calls, n_calls),
            prompt=app.prompt.sample(total, np.random.default_rng(p_ss)),
            output=app.output.sample(total, np.random.default_rng(o_ss)),
            system=np.full(total, app.system_prompt, dtype=np.int64),
        )
