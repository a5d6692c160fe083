"""Workloads built from files: a trace file replayed through transforms, length-only files
given arrivals, and several workloads merged as tenants. Each has `build(seed) -> Trace` like the
synthetic workloads, so every `workload=` config works the same way.

Seeding: `SeedSequence(seed)` spawns one stream per transform (or per part, or arrivals and
lengths), so adding a transform at the end never changes what the earlier ones drew.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from traces.arrivals import ArrivalProcess
from traces.loaders import load, load_lengths
from traces.schema import Trace, TraceError
from traces.transforms import merge


class Transform(Protocol):
    def apply(self, trace: Trace, rng: np.random.Generator | None = None) -> Trace: ...


class Workload(Protocol):
    def build(self, seed: int) -> Trace: ...


def apply_all(
    trace: Trace, transforms: Sequence[Transform], seed: int, last: Transform | None = None
) -> Trace:
    """Apply `transforms` in order, then `last` (a workload's `filter`) when given."""
    steps = [*transforms, *([last] if last is not None else [])]
    streams = np.random.SeedSequence(seed).spawn(len(steps))
    for transform, ss in zip(steps, streams, strict=True):
        trace = transform.apply(trace, np.random.default_rng(ss))
    return trace


@dataclass(frozen=True)
class TraceWorkload:
    """A trace file (`format`: a name in traces.loaders.LOADERS, with its `options`) replayed
    after `transforms` (traces/transforms.py) and then `filter`, applied in order."""

    path: str
    format: str = "table"
    options: Mapping[str, Any] = field(default_factory=dict)
    transforms: Sequence[Transform] = ()
    filter: Transform | None = None
    name: str = "trace"

    def build(self, seed: int) -> Trace:
        trace = load(self.path, self.format, **dict(self.options))
        return apply_all(trace, self.transforms, seed, self.filter)


@dataclass(frozen=True)
class LengthsWorkload:
    """Etalon's way with length-only files: arrival times from any arrival process over
    `duration` seconds, each request's (prompt, output) pair drawn uniformly with replacement
    from the file's rows; then `transforms` and `filter` (e.g. Etalon's recommended filter)."""

    path: str
    arrival: ArrivalProcess
    duration: float
    client: str = "client0"
    transforms: Sequence[Transform] = ()
    filter: Transform | None = None
    name: str = "lengths"

    def configured_rate(self) -> float:
        return self.arrival.mean_rate(self.duration)

    def build(self, seed: int) -> Trace:
        prompts, outputs = load_lengths(self.path)
        arr_ss, len_ss, tf_ss = np.random.SeedSequence(seed).spawn(3)
        times = np.sort(self.arrival.times(self.duration, np.random.default_rng(arr_ss)))
        if times.size == 0:
            raise TraceError(f"workload '{self.name}': no arrivals in {self.duration} s")
        rows = np.random.default_rng(len_ss).integers(0, prompts.size, size=times.size)
        trace = Trace.from_columns(
            client=np.full(times.size, self.client, dtype=object),
            arrival=times,
            prompt_len=prompts[rows],
            output_len=outputs[rows],
            source=f"{self.path} lengths with {type(self.arrival).__name__} arrivals",
        )
        return apply_all(trace, self.transforms, int(tf_ss.generate_state(1)[0]), self.filter)


@dataclass(frozen=True)
class Tenants:
    """Several workloads merged as tenants of one engine (traces.transforms.merge): a part with
    one client becomes the tenant `name`, others `name/client`."""

    parts: Mapping[str, Workload]
    name: str = "tenants"

    def build(self, seed: int) -> Trace:
        if not self.parts:
            raise TraceError(f"workload '{self.name}': parts is empty; give at least one")
        streams = np.random.SeedSequence(seed).spawn(len(self.parts))
        traces = {
            name: part.build(int(ss.generate_state(1)[0]))
            for (name, part), ss in zip(self.parts.items(), streams, strict=True)
        }
        return merge(traces)
