"""A closed-loop user population: each user sends its next request when the previous one ends.

This is how load generators measure concurrency (EvalScope's `parallel`, Veeksha's and vLLM's
`max-concurrency`): `users` requests are in the system at once (minus the ones in think time),
whatever the engine's speed. Users belong to the clients of a synthetic workload, which also gives
their length distributions; the trace is chained (see `Trace.predecessor`), so the engine sets each
follow-up's arrival time when its predecessor completes or is rejected.

Seeding: `SeedSequence(seed)` spawns one child per user and each spawns three streams (prompt
lengths, output lengths, think times), so adding users never changes an existing user's requests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from traces.schema import Trace, TraceError
from traces.synthetic import SyntheticWorkload

THINK_DISTRIBUTIONS = ("fixed", "exponential")


@dataclass(frozen=True)
class ClosedLoop:
    """`users` users share `num_requests` requests (the first `num_requests % users` users send
    one more). They start together at time 0, or evenly spread over [0, start_spread).

    Users are shared out among `base`'s clients in proportion to the clients' configured rates
    (largest remainders; ties go to the earlier client). A user waits `think_time` seconds
    (`think=fixed`) or an exponential time with that mean (`think=exponential`) between the end
    of one request and the next.
    """

    base: SyntheticWorkload
    users: int
    num_requests: int
    think_time: float = 0.0
    think: str = "fixed"
    start_spread: float = 0.0
    name: str = "closed_loop"

    def __post_init__(self) -> None:
        where = f"workload '{self.name}'"
        for field_name in ("users", "num_requests"):
            v = getattr(self, field_name)
            if isinstance(v, bool) or int(v) != v or v < 1:
                raise TraceError(f"{where}: {field_name} must be an integer >= 1, got {v!r}")
        if self.num_requests < self.users:
            raise TraceError(
                f"{where}: num_requests ({self.num_requests}) must be >= users ({self.users}), "
                "so that every user sends at least one request"
            )
        for field_name in ("think_time", "start_spread"):
            v = getattr(self, field_name)
            if not (np.isfinite(v) and v >= 0):
                raise TraceError(f"{where}: {field_name} must be a number >= 0, got {v!r}")
        if self.think not in THINK_DISTRIBUTIONS:
            raise TraceError(f"{where}: think: got {self.think!r}; accepted: {THINK_DISTRIBUTIONS}")

    def configured_rate(self) -> None:
        """A closed loop has no configured arrival rate (the engine's speed sets it)."""
        return None

    def users_per_client(self) -> np.ndarray:
        rates = np.array([c.arrival.mean_rate(self.base.duration) for c in self.base.clients])
        quota = self.users * rates / rates.sum()
        counts = np.floor(quota).astype(np.int64)
        left = self.users - int(counts.sum())
        order = np.lexsort((np.arange(rates.size), -(quota - counts)))  # largest remainder first
        counts[order[:left]] += 1
        return counts

    def build(self, seed: int) -> Trace:
        users = int(self.users)
        client_of_user = np.repeat(np.arange(len(self.base.clients)), self.users_per_client())
        calls = np.full(users, self.num_requests // users, dtype=np.int64)
        calls[: self.num_requests % users] += 1
        start = np.arange(users) * (self.start_spread / users)
        prompt, output, think = [], [], []
        for u, ss in enumerate(np.random.SeedSequence(seed).spawn(users)):
            p_ss, o_ss, t_ss = ss.spawn(3)
            spec, n = self.base.clients[client_of_user[u]], int(calls[u])
            prompt.append(spec.prompt.sample(n, np.random.default_rng(p_ss)))
            output.append(spec.output.sample(n, np.random.default_rng(o_ss)))
            if self.think == "exponential" and self.think_time > 0:
                gaps = np.random.default_rng(t_ss).exponential(self.think_time, n)
            else:
                gaps = np.full(n, float(self.think_time))
            gaps[0] = 0.0  # a user's first request is sent at its start time
            think.append(gaps)
        user = np.repeat(np.arange(users), calls)
        names = [c.name for c in self.base.clients]
        return Trace.from_columns(
            client=np.asarray(names, dtype=object)[client_of_user[user]],
            client_names=names,
            arrival=start[user],  # used for first calls; follow-ups arrive when chained
            prompt_len=np.concatenate(prompt),
            output_len=np.concatenate(output),
            client_weights={c.name: c.weight for c in self.base.clients},
            optional={
                "interaction_id": user,
                "call_index": np.arange(user.size) - np.repeat(np.cumsum(calls) - calls, calls),
                "num_calls": calls[user],
            },
            think_time=np.concatenate(think),
            source=f"workload '{self.name}' ({users} users, seed {seed})",
        )
