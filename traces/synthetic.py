"""Synthetic multi-client workloads: per client an arrival process and two length distributions.

Seeding: `SeedSequence(seed)` spawns one child per client and each child spawns three streams
(arrivals, prompt lengths, output lengths), so adding a client never changes another client's
requests, and changing a length distribution never moves an arrival.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from traces.arrivals import ArrivalProcess
from traces.lengths import LengthDistribution
from traces.schema import Trace, TraceError


@dataclass(frozen=True)
class ClientSpec:
    name: str
    arrival: ArrivalProcess
    prompt: LengthDistribution
    output: LengthDistribution
    weight: float = 1.0


@dataclass(frozen=True)
class SyntheticWorkload:
    """A set of clients over `duration` seconds; `rate_scale` multiplies every client's rate."""

    clients: Sequence[ClientSpec]
    duration: float
    rate_scale: float = 1.0
    name: str = "synthetic"
    clients_by_name: dict[str, ClientSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.clients:
            raise TraceError(f"workload '{self.name}': 'clients' is empty; give at least one")
        if not (np.isfinite(self.duration) and self.duration > 0):
            raise TraceError(f"workload '{self.name}': duration must be > 0, got {self.duration}")
        if not (np.isfinite(self.rate_scale) and self.rate_scale > 0):
            raise TraceError(
                f"workload '{self.name}': rate_scale must be > 0, got {self.rate_scale}"
            )
        names = [c.name for c in self.clients]
        if len(set(names)) != len(names):
            raise TraceError(f"workload '{self.name}': client names repeat: {names}")
        object.__setattr__(self, "clients_by_name", {c.name: c for c in self.clients})

    def configured_rate(self) -> float:
        """Mean requests per second the configuration asks for (all clients, after rate_scale)."""
        return self.rate_scale * sum(c.arrival.mean_rate(self.duration) for c in self.clients)

    def build(self, seed: int) -> Trace:
        streams = np.random.SeedSequence(seed).spawn(len(self.clients))
        arrival, client, prompt, output = [], [], [], []
        for i, (spec, ss) in enumerate(zip(self.clients, streams)):
            arr_ss, p_ss, o_ss = ss.spawn(3)
            process = spec.arrival.scaled(self.rate_scale) if self.rate_scale != 1 else spec.arrival
            t = np.sort(process.times(self.duration, np.random.default_rng(arr_ss)))
            n = t.shape[0]
            arrival.append(t)
            client.append(np.full(n, i, dtype=np.int64))
            prompt.append(spec.prompt.sample(n, np.random.default_rng(p_ss)))
            output.append(spec.output.sample(n, np.random.default_rng(o_ss)))
        a = np.concatenate(arrival)
        c = np.concatenate(client)
        if a.size == 0:
            raise TraceError(
                f"workload '{self.name}' produced no requests in {self.duration} s; "
                "raise the rates or the duration"
            )
        order = np.lexsort((c, a))  # ties at equal times: lower client index first
        names = [s.name for s in self.clients]
        return Trace.from_columns(
            client=np.asarray(names, dtype=object)[c[order]],
            client_names=names,
            arrival=a[order],
            prompt_len=np.concatenate(prompt)[order],
            output_len=np.concatenate(output)[order],
            client_weights={s.name: s.weight for s in self.clients},
            source=f"workload '{self.name}' (seed {seed})",
        )
