"""Assembling a run's `Timeline` from what its replicas recorded: their step columns and token
clocks (one `ReplicaPart` each), the request state, the token runs and the policies' counter
events. The runner does this at the end of a run; a run split over forked processes
(simulator/engines/forked.py) does it once the parts have come back."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.core.counters import CounterLog
from simulator.core.requests import RequestState
from simulator.core.seam import CounterPolicy, Policy
from simulator.core.timeline import Timeline, TokenRuns
from simulator.engines.dispatch import ClusterConfig
from simulator.engines.step_model import EngineConfig
from traces.schema import Trace


@dataclass
class ReplicaPart:
    """What the timeline takes of one replica after the run."""

    steps: dict[str, np.ndarray]  # its step columns (empty when spilled)
    clock: np.ndarray  # its token clock
    now: float  # the end of its last step
    kv_used: int
    counts: dict[str, int]  # StepModel.counts


def counter_frame(events: list[pd.DataFrame | None]) -> pd.DataFrame | None:
    """The counter events of every policy (by index; None: it keeps no counters), with the
    replica of each when there are several policies."""
    frames = []
    for i, f in enumerate(events):
        if f is not None:
            frames.append(f.assign(replica=i) if len(events) > 1 else f)
    if not frames:
        return None
    return pd.concat(frames, ignore_index=True)


def counter_logs(policies: list[Policy]) -> list[CounterLog] | None:
    """The counter logs of the policies that keep counters (a spilled run reads them back)."""
    logs = [p.counter_log() for p in policies if isinstance(p, CounterPolicy)]
    return logs or None


CLOCK_CHUNK = 1 << 20  # ticks copied at a time into a joined clock on disk


def join_clocks(parts: list[ReplicaPart], folder: Path | None = None) -> np.ndarray:
    """The replicas' token clocks end to end. Copied one replica at a time, each part then
    pointing into the joined clock, so that the memory of a replica's own clock goes as soon as
    it is copied: the peak holds one copy of the run's clock and one replica's, not two of the
    run's (benchmarks/fleet_day.py at 8 replicas: peak 672 -> 582 MB). With `folder` (a run
    whose steps went to disk), the joined clock is a file there, mapped read only."""
    if len(parts) == 1 and folder is None:
        return parts[0].clock
    total, dtype = sum(part.clock.shape[0] for part in parts), parts[0].clock.dtype
    if folder is not None:
        path = folder / "token_clock.raw"
        with path.open("wb") as f:
            for part in parts:
                source = whole_file(part.clock)
                if source is not None:  # copied file to file: its pages never mapped here
                    with source.open("rb") as data:
                        shutil.copyfileobj(data, f, CLOCK_CHUNK)
                    continue
                for at in range(0, part.clock.shape[0], CLOCK_CHUNK):
                    np.asarray(part.clock[at : at + CLOCK_CHUNK]).tofile(f)
        if not total:
            return np.empty(0, dtype=dtype)
        mapped = np.memmap(path, dtype=dtype, mode="r", shape=(total,))
        at = 0
        for part in parts:
            n = part.clock.shape[0]
            part.clock = mapped[at : at + n]
            at += n
        return mapped
    joined = np.empty(total, dtype=dtype)
    at = 0
    for part in parts:
        n = part.clock.shape[0]
        joined[at : at + n] = part.clock
        part.clock = joined[at : at + n]
        at += n
    return joined


def whole_file(array: np.ndarray) -> Path | None:
    """The file `array` maps the whole of (a spilled replica's step ends), if it is one."""
    if not isinstance(array, np.memmap) or array.filename is None or array.offset:
        return None
    path = Path(array.filename)
    return path if path.stat().st_size == array.nbytes else None


def assemble_timeline(
    trace: Trace,
    state: RequestState,
    tokens: TokenRuns,
    parts: list[ReplicaPart],
    counters: pd.DataFrame | None,
    engine_columns: dict[str, np.ndarray],
    engine: EngineConfig,
    cluster: ClusterConfig,
    pool_tokens: int,
    spilled: tuple[list[CounterLog] | None, list[Path]] | None = None,
) -> Timeline:
    """The run's timeline: the replicas' steps and token clocks in replica order, the request
    state, and the run's facts in `info`. `spilled`: for a run whose step records went to disk,
    the counter logs and the step files (its `parts` then carry no step columns)."""
    if spilled is not None:
        steps: dict[str, np.ndarray] = {}
    else:
        cols = [part.steps for part in parts]
        # one replica's columns are the run's: no copy of 57 bytes a step (a 100,000-request
        # overload run records 1.6M steps; its simulation peaks at 518 MB instead of 593 MB)
        steps = (
            cols[0]
            if len(cols) == 1
            else {k: np.concatenate([c[k] for c in cols]) for k in cols[0]}
        )
        steps["replica"] = np.repeat(np.arange(len(parts)), [c["end"].shape[0] for c in cols])
    token_clock = join_clocks(parts, None if spilled is None else spilled[1][0].parent)
    offsets = np.cumsum([0] + [part.clock.shape[0] for part in parts])
    counts: dict[str, int] = {}
    for part in parts:
        for name, value in part.counts.items():
            counts[name] = counts.get(name, 0) + value
    return Timeline(
        trace=trace,
        arrival=state.arrival,
        status=state.status,
        reason=state.reason,
        admitted_at=state.admitted_at,
        first_token_at=state.first_token_at,
        finished_at=state.finished_at,
        generated=np.asarray(state.generated, dtype=np.int64),
        steps=steps,
        token_runs=tokens.columns(offsets[:-1]),
        token_clock=token_clock,
        pool_tokens=pool_tokens,
        counters=counters,
        counter_logs=None if spilled is None else spilled[0],
        info={
            "engine": engine.name,
            "end_time": max(part.now for part in parts),
            "replicas": len(parts),
            "dispatcher": cluster.dispatcher,
            "kv_used_at_end": sum(part.kv_used for part in parts),
            **engine.info(),
            **counts,
        },
        request_columns={"replica": state.replica, **engine_columns},
        step_files=None if spilled is None else spilled[1],
    )
