"""Arrival processes: each turns (duration, its own seeded Generator) into sorted arrival times.

Times are in seconds on [0, duration). Every process can be rescaled to a higher or lower request
rate (`scaled`) without changing its time structure (ON/OFF periods and phase lengths stay put).
Poisson and Gamma gaps are drawn until the horizon is passed; nothing is clipped, so the
processes keep their distributions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from traces.schema import TraceError


class ArrivalProcess(Protocol):
    def times(self, duration: float, rng: np.random.Generator) -> np.ndarray: ...

    def scaled(self, factor: float) -> ArrivalProcess: ...

    def mean_rate(self, duration: float) -> float:
        """The configured mean arrivals per second over [0, duration) (health checks)."""
        ...


def _positive(name: str, value: float) -> None:
    if not (np.isfinite(value) and value > 0):
        raise TraceError(f"{name} must be a finite number > 0, got {value!r}")


def _renewal(
    gap_sampler: Callable[[int], np.ndarray], mean_gap: float, duration: float
) -> np.ndarray:
    """Cumulate i.i.d. gaps (drawn in chunks) until the time passes `duration`."""
    chunks: list[np.ndarray] = []
    t = 0.0
    chunk = max(16, int(duration / mean_gap * 1.1) + 16)
    while t < duration:
        gaps = gap_sampler(chunk)
        times = t + np.cumsum(gaps)
        chunks.append(times)
        t = float(times[-1])
    out = np.concatenate(chunks) if chunks else np.empty(0)
    return out[out < duration]


@dataclass(frozen=True)
class Uniform:
    """Deterministic, evenly spaced arrivals with a random start phase in [0, 1/rate)."""

    rate: float

    def __post_init__(self) -> None:
        _positive("Uniform.rate", self.rate)

    def times(self, duration: float, rng: np.random.Generator) -> np.ndarray:
        n = int(self.rate * duration)
        phase = rng.random() / self.rate
        return phase + np.arange(n) / self.rate

    def scaled(self, factor: float) -> Uniform:
        return replace(self, rate=self.rate * factor)

    def mean_rate(self, duration: float) -> float:
        return self.rate


@dataclass(frozen=True)
class Poisson:
    """Exponential inter-arrival gaps with mean 1/rate."""

    rate: float

    def __post_init__(self) -> None:
        _positive("Poisson.rate", self.rate)

    def times(self, duration: float, rng: np.random.Generator) -> np.ndarray:
        return _renewal(lambda k: rng.exponential(1.0 / self.rate, k), 1.0 / self.rate, duration)

    def scaled(self, factor: float) -> Poisson:
        return replace(self, rate=self.rate * factor)

    def mean_rate(self, duration: float) -> float:
        return self.rate


@dataclass(frozen=True)
class Gamma:
    """Gamma inter-arrival gaps: mean 1/rate, coefficient of variation `cv` (cv=1: Poisson)."""

    rate: float
    cv: float

    def __post_init__(self) -> None:
        _positive("Gamma.rate", self.rate)
        _positive("Gamma.cv", self.cv)

    def times(self, duration: float, rng: np.random.Generator) -> np.ndarray:
        shape = 1.0 / self.cv**2
        scale = self.cv**2 / self.rate
        return _renewal(lambda k: rng.gamma(shape, scale, k), 1.0 / self.rate, duration)

    def scaled(self, factor: float) -> Gamma:
        return replace(self, rate=self.rate * factor)

    def mean_rate(self, duration: float) -> float:
        return self.rate


@dataclass(frozen=True)
class OnOff:
    """Keep the inner process's arrivals in ON periods: ON [0, on), OFF [on, on + off), ..."""

    inner: ArrivalProcess
    on: float = 60.0
    off: float = 60.0

    def __post_init__(self) -> None:
        _positive("OnOff.on", self.on)
        _positive("OnOff.off", self.off)

    def times(self, duration: float, rng: np.random.Generator) -> np.ndarray:
        t = self.inner.times(duration, rng)
        return t[np.mod(t, self.on + self.off) < self.on]

    def scaled(self, factor: float) -> OnOff:
        return replace(self, inner=self.inner.scaled(factor))

    def mean_rate(self, duration: float) -> float:
        cycle = self.on + self.off
        full, rest = divmod(duration, cycle)
        on_time = full * self.on + min(rest, self.on)
        return self.inner.mean_rate(duration) * on_time / duration


@dataclass(frozen=True)
class LinearRamp:
    """A rate changing linearly from `start_rate` to `end_rate` over the duration.

    Deterministic by default (each gap is 1/rate at the previous arrival, the VTC artifact's rule,
    first arrival at 0); `poisson=True` draws a non-homogeneous Poisson process instead (exact, by
    inverting the cumulative intensity).
    """

    start_rate: float
    end_rate: float
    poisson: bool = False

    def __post_init__(self) -> None:
        _positive("LinearRamp.start_rate", self.start_rate)
        _positive("LinearRamp.end_rate", self.end_rate)

    def _rate(self, t: float, duration: float) -> float:
        return self.start_rate + (self.end_rate - self.start_rate) * t / duration

    def times(self, duration: float, rng: np.random.Generator) -> np.ndarray:
        if not self.poisson:
            out: list[float] = []
            t = 0.0
            while t < duration:
                out.append(t)
                t += 1.0 / self._rate(t, duration)
            return np.asarray(out)
        # Lambda(t) = r0 t + (r1 - r0) t^2 / (2 D); unit-rate arrivals mapped through Lambda^-1.
        total = 0.5 * (self.start_rate + self.end_rate) * duration
        unit = _renewal(lambda k: rng.exponential(1.0, k), 1.0, total)
        a = (self.end_rate - self.start_rate) / (2.0 * duration)
        if a == 0:
            return unit / self.start_rate
        return (-self.start_rate + np.sqrt(self.start_rate**2 + 4.0 * a * unit)) / (2.0 * a)

    def scaled(self, factor: float) -> LinearRamp:
        return replace(self, start_rate=self.start_rate * factor, end_rate=self.end_rate * factor)

    def mean_rate(self, duration: float) -> float:
        return 0.5 * (self.start_rate + self.end_rate)


@dataclass(frozen=True)
class Diurnal:
    """A day's rhythm: Poisson arrivals at rate(t) = rate x (1 + amplitude x cos(2 pi (t -
    peak_at) / period)), i.e. `rate` on average, (1 + amplitude) x rate at `peak_at` (and every
    `period` later), (1 - amplitude) x rate half a period away. A day compressed into
    `period` seconds keeps its shape. Drawn exactly by thinning a Poisson process at the peak
    rate."""

    rate: float
    period: float = 86400.0
    amplitude: float = 0.5
    peak_at: float = 50400.0  # 14:00 on a day of 86,400 s

    def __post_init__(self) -> None:
        _positive("Diurnal.rate", self.rate)
        _positive("Diurnal.period", self.period)
        if not (0 <= self.amplitude <= 1):
            raise TraceError(f"Diurnal.amplitude must be within [0, 1], got {self.amplitude!r}")
        if not np.isfinite(self.peak_at):
            raise TraceError(f"Diurnal.peak_at must be a number of seconds, got {self.peak_at!r}")

    def rate_at(self, t: np.ndarray | float) -> np.ndarray:
        angle = 2 * np.pi * (np.asarray(t, dtype=float) - self.peak_at) / self.period
        return self.rate * (1 + self.amplitude * np.cos(angle))

    def times(self, duration: float, rng: np.random.Generator) -> np.ndarray:
        peak = self.rate * (1 + self.amplitude)
        candidates = _renewal(lambda k: rng.exponential(1.0 / peak, k), 1.0 / peak, duration)
        keep = rng.random(candidates.shape[0]) * peak < self.rate_at(candidates)
        return candidates[keep]

    def scaled(self, factor: float) -> Diurnal:
        return replace(self, rate=self.rate * factor)

    def mean_rate(self, duration: float) -> float:
        """The integral of rate(t) over [0, duration), divided by duration."""
        w = 2 * np.pi / self.period
        swing = np.sin(w * (duration - self.peak_at)) - np.sin(w * -self.peak_at)
        return float(self.rate * (1 + self.amplitude * swing / (w * duration)))


@dataclass(frozen=True)
class Phase:
    duration: float
    process: ArrivalProcess | None  # None: silent phase


@dataclass(frozen=True)
class Piecewise:
    """Consecutive phases, each with its own process (or silence), offset to its start time."""

    phases: Sequence[Phase]

    def __post_init__(self) -> None:
        if not self.phases:
            raise TraceError("Piecewise needs at least one phase")
        for i, p in enumerate(self.phases):
            _positive(f"Piecewise.phases[{i}].duration", p.duration)

    def times(self, duration: float, rng: np.random.Generator) -> np.ndarray:
        out: list[np.ndarray] = []
        start = 0.0
        for p in self.phases:
            if start >= duration:
                break
            length = min(p.duration, duration - start)
            if p.process is not None:
                out.append(start + p.process.times(length, rng))
            start += p.duration
        return np.concatenate(out) if out else np.empty(0)

    def mean_rate(self, duration: float) -> float:
        expected, start = 0.0, 0.0
        for p in self.phases:
            length = min(p.duration, max(duration - start, 0.0))
            if p.process is not None and length > 0:
                expected += p.process.mean_rate(length) * length
            start += p.duration
        return expected / duration

    def scaled(self, factor: float) -> Piecewise:
        return replace(
            self,
            phases=tuple(
                Phase(p.duration, None if p.process is None else p.process.scaled(factor))
                for p in self.phases
            ),
        )
