"""Trace transforms: each maps a `Trace` (and its own seeded Generator) to a new `Trace`.

They compose in a workload's `transforms:` list (traces/replay.py) and are plain objects in
Python: `ScaleToRate(2.0).apply(trace)`. Transforms that drop requests say how many in the
trace's `source`, so nothing disappears unnoticed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from traces.schema import Trace, TraceError


def mean_rate(trace: Trace) -> float:
    """Requests per second as the inverse of the mean inter-arrival time: (n - 1) / span."""
    span = float(trace.arrival[-1] - trace.arrival[0])
    if len(trace) < 2 or span <= 0:
        raise TraceError(f"{trace.source}: a rate needs at least two distinct arrival times")
    return (len(trace) - 1) / span


def _noted(trace: Trace, note: str) -> Trace:
    return dataclasses.replace(trace, source=f"{trace.source} | {note}")


def _kept(trace: Trace, keep: np.ndarray, what: str) -> Trace:
    rows = np.flatnonzero(keep)
    if rows.size == 0:
        raise TraceError(f"{trace.source}: {what} leaves no requests")
    out = trace.take(rows)
    dropped = len(trace) - rows.size
    return _noted(out, f"{what}: dropped {dropped} of {len(trace)}") if dropped else out


@dataclass(frozen=True)
class Window:
    """Keep arrivals in [start, end) seconds; `shift` moves `start` to time 0."""

    start: float = 0.0
    end: float = float("inf")
    shift: bool = True

    def apply(self, trace: Trace, rng: np.random.Generator | None = None) -> Trace:
        if not self.start < self.end:
            raise TraceError(f"Window needs start < end, got [{self.start}, {self.end})")
        t = trace.arrival
        out = _kept(trace, (t >= self.start) & (t < self.end), f"window [{self.start}, {self.end})")
        if not self.shift:
            return out
        return out.take(np.arange(len(out)), arrival=out.arrival - self.start)


@dataclass(frozen=True)
class ScaleToRate:
    """Stretch or squeeze time about the first arrival so that `mean_rate` becomes `rate`."""

    rate: float

    def apply(self, trace: Trace, rng: np.random.Generator | None = None) -> Trace:
        if not (np.isfinite(self.rate) and self.rate > 0):
            raise TraceError(f"ScaleToRate.rate must be > 0, got {self.rate!r}")
        factor = mean_rate(trace) / self.rate
        t0 = trace.arrival[0]
        scaled = t0 + (trace.arrival - t0) * factor
        return trace.take(np.arange(len(trace)), arrival=scaled)


@dataclass(frozen=True)
class SampleRescale:
    """The VTC paper's method: sample round(rate * duration) requests uniformly without
    replacement and map their times linearly onto [0, duration] (first at 0, last at duration)."""

    rate: float
    duration: float

    def apply(self, trace: Trace, rng: np.random.Generator | None = None) -> Trace:
        k = int(round(self.rate * self.duration))
        if not 2 <= k <= len(trace):
            raise TraceError(
                f"{trace.source}: SampleRescale needs 2 <= rate * duration <= {len(trace)} "
                f"requests, got {self.rate} * {self.duration} = {k}"
            )
        rng = rng or np.random.default_rng(0)
        rows = np.sort(rng.choice(len(trace), size=k, replace=False))
        t = trace.arrival[rows]
        span = float(t[-1] - t[0])
        scaled = (t - t[0]) * (self.duration / span) if span > 0 else np.zeros(k)
        out = trace.take(rows, arrival=scaled)
        return _noted(out, f"sampled {k} of {len(trace)} onto [0, {self.duration}] s")


@dataclass(frozen=True)
class ScaleTokens:
    """Multiply prompt and output lengths (FairServe runs its traces at 1/8: 0.125), rounding
    to the nearest integer and keeping at least 1 token. A prompt's prefix-cache block ids keep
    covering the same share of it: the tokens each id covers scale too (64 to 8 at 1/8), rounded
    to an integer >= 1."""

    prompt: float = 1.0
    output: float = 1.0

    def apply(self, trace: Trace, rng: np.random.Generator | None = None) -> Trace:
        for name in ("prompt", "output"):
            v = getattr(self, name)
            if not (np.isfinite(v) and v > 0):
                raise TraceError(f"ScaleTokens.{name} must be > 0, got {v!r}")

        def scale(x: np.ndarray, f: float) -> np.ndarray:
            return np.maximum(1, np.floor(x * f + 0.5)).astype(np.int64)

        hash_block = trace.hash_block_tokens
        if trace.block_hashes is not None:
            hash_block = max(1, round(hash_block * self.prompt))
        return trace.take(
            np.arange(len(trace)),
            prompt_len=scale(trace.prompt_len, self.prompt),
            output_len=scale(trace.output_len, self.output),
            hash_block_tokens=hash_block,
        )


@dataclass(frozen=True)
class ClientTimeout:
    """Every request's client gives up `seconds` after sending it (a chat user who stops
    waiting, a client library's request timeout): the engine then drops the request, waiting
    or running (reason `client_timeout`)."""

    seconds: float

    def apply(self, trace: Trace, rng: np.random.Generator | None = None) -> Trace:
        if isinstance(self.seconds, bool) or not self.seconds > 0:
            raise TraceError(
                f"ClientTimeout.seconds must be > 0 (inf: never), got {self.seconds!r}"
            )
        timeout = np.full(len(trace), float(self.seconds))
        return dataclasses.replace(trace, client_timeout=timeout)


@dataclass(frozen=True)
class FilterLengths:
    """Drop (or, with `cap`, clip) requests whose prompt >= `prompt_below` or output >=
    `output_below`. Etalon's recommended filter: prompt_below=16384, output_below=1024."""

    prompt_below: int | None = None
    output_below: int | None = None
    cap: bool = False

    def apply(self, trace: Trace, rng: np.random.Generator | None = None) -> Trace:
        p_max = np.inf if self.prompt_below is None else self.prompt_below
        o_max = np.inf if self.output_below is None else self.output_below
        if not (p_max > 1 and o_max > 1):
            raise TraceError(f"FilterLengths bounds must be > 1, got {self}")
        if not self.cap:
            keep = (trace.prompt_len < p_max) & (trace.output_len < o_max)
            return _kept(trace, keep, f"lengths prompt < {p_max}, output < {o_max}")
        return trace.take(
            np.arange(len(trace)),
            prompt_len=np.minimum(trace.prompt_len, p_max - 1).astype(np.int64),
            output_len=np.minimum(trace.output_len, o_max - 1).astype(np.int64),
        )


ASSIGN_MODES = ("zipf", "shares", "heavy_tail")


@dataclass(frozen=True)
class AssignClients:
    """Give each request a client drawn independently with fixed shares, for traces without
    clients:
    - `zipf`: `num_clients` clients, share of the i-th proportional to 1 / i^alpha;
    - `shares`: explicit {name: share} (normalised);
    - `heavy_tail`: `num_clients` shares drawn once from a Pareto(alpha) law (a few clients
      carry most requests, as in ServeGen's client populations), sorted largest first.
    Clients are named client0, client1, ... except with explicit shares."""

    mode: str = "zipf"
    num_clients: int = 10
    alpha: float = 1.0
    shares: Mapping[str, float] | None = None

    def probabilities(self, rng: np.random.Generator) -> tuple[list[str], np.ndarray]:
        if self.mode not in ASSIGN_MODES:
            raise TraceError(f"AssignClients.mode: got {self.mode!r}; accepted: {ASSIGN_MODES}")
        if self.mode == "shares":
            if not self.shares:
                raise TraceError("AssignClients(mode=shares) needs shares: {name: share, ...}")
            w = np.array(list(self.shares.values()), dtype=float)
            if not (np.isfinite(w).all() and (w >= 0).all() and w.sum() > 0):
                raise TraceError(f"AssignClients.shares must be >= 0 with a positive sum: {w}")
            return [str(k) for k in self.shares], w / w.sum()
        if int(self.num_clients) != self.num_clients or self.num_clients < 1:
            raise TraceError(f"AssignClients.num_clients must be >= 1, got {self.num_clients}")
        if not self.alpha > 0:
            raise TraceError(f"AssignClients.alpha must be > 0, got {self.alpha}")
        names = [f"client{i}" for i in range(self.num_clients)]
        if self.mode == "zipf":
            w = 1.0 / np.arange(1, self.num_clients + 1) ** self.alpha
        else:
            w = np.sort(rng.pareto(self.alpha, self.num_clients) + 1.0)[::-1]
        return names, w / w.sum()

    def apply(self, trace: Trace, rng: np.random.Generator | None = None) -> Trace:
        rng = rng or np.random.default_rng(0)
        names, p = self.probabilities(rng)
        codes = rng.choice(len(names), size=len(trace), p=p)
        return trace.take(
            np.arange(len(trace)),
            client=codes.astype(np.int64),
            client_names=tuple(names),
            client_weight=np.ones(len(names)),
        )


def merge(parts: Mapping[str, Trace]) -> Trace:
    """Several traces as tenants of one: a part's clients become `name` (a one-client part) or
    `name/client`; requests interleave by time (ties: the earlier part first) and are renumbered
    0, 1, ... in that order. Client timeouts stay each request's (none in a part: inf)."""
    if not parts:
        raise TraceError("merge needs at least one trace")
    names: list[str] = []
    weights: dict[str, float] = {}
    clients, arrival, prompt, output, part_of, timeout = [], [], [], [], [], []
    for k, (name, t) in enumerate(parts.items()):
        own = [name] if t.num_clients == 1 else [f"{name}/{c}" for c in t.client_names]
        clients.append(t.client + len(names))
        names += own
        weights.update(zip(own, t.client_weight.tolist(), strict=True))
        arrival.append(t.arrival)
        prompt.append(t.prompt_len)
        output.append(t.output_len)
        part_of.append(np.full(len(t), k))
        own_timeout = t.client_timeout
        timeout.append(np.full(len(t), np.inf) if own_timeout is None else own_timeout)
    a, part = np.concatenate(arrival), np.concatenate(part_of)
    order = np.lexsort((part, a))
    any_timeout = any(t.client_timeout is not None for t in parts.values())
    return Trace.from_columns(
        client=np.asarray(names, dtype=object)[np.concatenate(clients)[order]],
        client_names=names,
        client_weights=weights,
        arrival=a[order],
        prompt_len=np.concatenate(prompt)[order],
        output_len=np.concatenate(output)[order],
        client_timeout=np.concatenate(timeout)[order] if any_timeout else None,
        source=f"merged({', '.join(parts)})",
    )
