"""An elastic fleet (`cluster.autoscaler`): replicas added and removed over simulated time, as a
Kubernetes HorizontalPodAutoscaler does for an inference pool.

Every `interval` seconds the autoscaler reads one signal summed over the ready replicas —
`queue_depth` (requests waiting in their queues, and at the gateway), `kv_utilization` (the
share of each one's KV pool in use after its last step) or `in_flight_tokens` (tokens still to
process of the requests routed to them) — and recommends ceil(sum / `target`) replicas, the
replicas that would each carry `target`. As the HPA does, it scales up to the lowest
recommendation of the last `scale_up_window` seconds and down to the highest of the last
`scale_down_window` (stabilisation: a brief dip does not remove replicas), within
[`min_replicas`, `max_replicas`].

A replica added now serves only after loading: a delay drawn from `loading` (fixed, uniform or
lognormal seconds), from the autoscaler's own random stream (`seed`).
Removing one stops routing to it first (the replicas still loading go before the ready ones,
the newest first); it is freed once its queue and batch are empty. A replica still draining
when more are wanted is taken back before a new one loads (it holds the model already).
GPU-seconds count from the request to add a replica (or the run's start) to its release (or
the run's end).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulator.core.errors import ConfigError

METRICS = ("queue_depth", "kv_utilization", "in_flight_tokens")
DELAYS = ("fixed", "uniform", "lognormal")
OFF, LOADING, READY, DRAINING = "off", "loading", "ready", "draining"


@dataclass(frozen=True)
class LoadingDelay:
    """How long a new replica takes before it serves (seconds): `fixed` (`seconds`), `uniform`
    in [`low`, `high`], or `lognormal` with median `seconds` and log-space sigma `sigma`."""

    distribution: str = "fixed"
    seconds: float = 60.0
    low: float = 30.0
    high: float = 90.0
    sigma: float = 0.3

    def __post_init__(self) -> None:
        key = "cluster.autoscaler.loading"
        if self.distribution not in DELAYS:
            raise ConfigError(
                f"{key}.distribution must be one of {DELAYS}, got {self.distribution!r}"
            )
        for name in ("seconds", "low", "high", "sigma"):
            v = getattr(self, name)
            if (
                isinstance(v, bool)
                or not isinstance(v, int | float)
                or not (v >= 0 and v < math.inf)
            ):
                raise ConfigError(f"{key}.{name} must be a number >= 0, got {v!r}")
        if self.low > self.high:
            raise ConfigError(f"{key}.low ({self.low}) is above {key}.high ({self.high})")

    def draw(self, rng: np.random.Generator) -> float:
        if self.distribution == "fixed":
            return float(self.seconds)
        if self.distribution == "uniform":
            return float(rng.uniform(self.low, self.high))
        return float(self.seconds * math.exp(self.sigma * rng.standard_normal()))


@dataclass(frozen=True)
class AutoscalerConfig:
    """`cluster.autoscaler`; `enabled: false` (the default) keeps the fleet fixed."""

    enabled: bool = False
    metric: str = "queue_depth"
    target: float = 4.0  # the signal one replica should carry
    interval: float = 15.0  # seconds between decisions (the HPA's sync period)
    scale_up_window: float = 0.0  # seconds of recommendations a scale-up takes the lowest of
    scale_down_window: float = 300.0  # ... a scale-down the highest of
    min_replicas: int = 1
    max_replicas: int = 8
    loading: LoadingDelay | Mapping[str, Any] = field(default_factory=LoadingDelay)
    seed: int = 0  # the loading delays' random stream

    def __post_init__(self) -> None:
        key = "cluster.autoscaler"
        if not isinstance(self.enabled, bool):
            raise ConfigError(f"{key}.enabled must be true or false, got {self.enabled!r}")
        if self.metric not in METRICS:
            raise ConfigError(f"{key}.metric must be one of {METRICS}, got {self.metric!r}")
        for name, strict in (("target", True), ("interval", True), ("scale_up_window", False),
                             ("scale_down_window", False)):  # fmt: skip
            v = getattr(self, name)
            ok = not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)
            if not ok or not (v > 0 if strict else v >= 0):
                raise ConfigError(
                    f"{key}.{name} must be a number {'>' if strict else '>='} 0, got {v!r}"
                )
        for name in ("min_replicas", "max_replicas", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "seed" else 1):
                low = 0 if name == "seed" else 1
                raise ConfigError(f"{key}.{name} must be an integer >= {low}, got {v!r}")
        if self.min_replicas > self.max_replicas:
            raise ConfigError(
                f"{key}.min_replicas ({self.min_replicas}) is above {key}.max_replicas "
                f"({self.max_replicas})"
            )
        if isinstance(self.loading, Mapping):
            accepted = sorted(LoadingDelay.__dataclass_fields__)
            unknown = sorted(set(self.loading) - set(accepted))
            if unknown:
                raise ConfigError(f"{key}.loading: unknown key(s) {unknown}; accepted: {accepted}")
            object.__setattr__(self, "loading", LoadingDelay(**self.loading))


class Autoscaler:
    """The decisions: `recommend` each tick from the signal's sum over the ready replicas,
    stabilised over the windows and clamped to the bounds."""

    def __init__(self, cfg: AutoscalerConfig) -> None:
        self.cfg = cfg
        self.history: deque[tuple[float, int]] = deque()  # (time, raw recommendation)
        assert isinstance(cfg.loading, LoadingDelay)
        self.loading: LoadingDelay = cfg.loading
        self.rng = np.random.default_rng(cfg.seed)

    def recommend(self, now: float, load: float, provisioned: int) -> int:
        """The replicas to have from `now`, given the signal summed over the ready replicas
        and the replicas provisioned (ready or loading)."""
        cfg = self.cfg
        raw = max(cfg.min_replicas, min(cfg.max_replicas, math.ceil(load / cfg.target - 1e-9)))
        self.history.append((now, raw))
        keep = max(cfg.scale_up_window, cfg.scale_down_window)
        while self.history and self.history[0][0] < now - keep:
            self.history.popleft()
        if raw > provisioned:
            window = [r for t, r in self.history if t >= now - cfg.scale_up_window]
            return max(provisioned, min(window))
        if raw < provisioned:
            window = [r for t, r in self.history if t >= now - cfg.scale_down_window]
            return min(provisioned, max(window))
        return provisioned

    def delay(self) -> float:
        return self.loading.draw(self.rng)


class Fleet:
    """Each replica's state over the run (`OFF`, `LOADING`, `READY`, `DRAINING`), which ones
    take requests (`available`, the list the dispatcher reads), the changes in order, and the
    GPU-seconds they held."""

    def __init__(self, size: int, initial: int) -> None:
        self.state = [READY] * initial + [OFF] * (size - initial)
        self.available = [True] * initial + [False] * (size - initial)
        self.held_since = [0.0] * initial + [math.nan] * (size - initial)
        self.gpu_seconds = 0.0
        self.changes: list[tuple[float, int, str]] = [(0.0, i, READY) for i in range(initial)]
        self.wanted = initial  # the last decision: replicas to have

    def count(self, *states: str) -> int:
        return sum(s in states for s in self.state)

    def _set(self, i: int, state: str, now: float) -> None:
        self.state[i] = state
        self.available[i] = state == READY
        self.changes.append((now, i, state))

    def add(self, now: float) -> int | None:
        """Take a draining replica back (it is loaded: it serves at once; the one that started
        draining last), or start loading the lowest-numbered one that is off (it holds a GPU
        from now). Returns the one loading, or None."""
        draining = [i for i, s in enumerate(self.state) if s == DRAINING]
        if draining:
            last = {i: t for t, i, s in self.changes if s == DRAINING}
            self._set(max(draining, key=lambda k: (last[k], k)), READY, now)
            return None
        i = self.state.index(OFF)
        self.held_since[i] = now
        self._set(i, LOADING, now)
        return i

    def loaded(self, i: int, now: float) -> None:
        if self.state[i] == LOADING:  # (not cancelled meanwhile)
            self._set(i, READY, now)

    def remove(self, now: float) -> int:
        """Take one replica out: the newest still loading (it is released at once), else the
        highest-numbered ready one (it drains). Returns it."""
        loading = [i for i, s in enumerate(self.state) if s == LOADING]
        if loading:
            i = max(loading, key=lambda k: (self.held_since[k], k))
            self.release(i, now)
            return i
        i = max(i for i, s in enumerate(self.state) if s == READY)
        self._set(i, DRAINING, now)
        return i

    def release(self, i: int, now: float) -> None:
        self.gpu_seconds += now - self.held_since[i]
        self.held_since[i] = math.nan
        self._set(i, OFF, now)

    def close(self, now: float) -> None:
        """The run ended at `now`: every replica still held counts until then."""
        for i, s in enumerate(self.state):
            if s != OFF:
                self.gpu_seconds += now - self.held_since[i]
                self.held_since[i] = now

    def report(self) -> dict[str, Any]:
        """For the run's info (after `close`): GPU-seconds, and each change as [time, replica,
        state]."""
        return {
            "gpu_seconds": self.gpu_seconds,
            "changes": [[t, i, s] for t, i, s in self.changes],
        }
