"""Work split over forked processes: the replicas of a static dispatcher simulated at once.

A static dispatcher assigns an open-loop trace to replicas up front and no replica reads
another's state, so each group of replicas can be simulated in a process of its own and the
results merged (`process_groups`, `run_in_processes`). Forking (not spawning) makes a child
start with everything the parent has built (trace, policies, cost model) and costs
milliseconds; each child sends back only its result, and while it runs, the messages it posts
(progress).
"""

from __future__ import annotations

import mmap
import multiprocessing
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Generic, TypeVar

import numpy as np
import pandas as pd

from simulator.core.seam import CounterPolicy
from simulator.core.timeline import Timeline, TokenRuns
from simulator.engines.assemble import ReplicaPart, counter_frame
from simulator.engines.runner import Runner

T = TypeVar("T")
Post = Callable[[Any], None]  # a child's way to send the parent a message while it runs


def shared_copy(values: np.ndarray) -> np.ndarray:
    """A copy of `values` in memory that processes forked later share with this one: what one
    writes there, the others see at once."""
    memory = mmap.mmap(-1, max(values.nbytes, 1))  # anonymous and shared
    copy = np.frombuffer(memory, dtype=values.dtype, count=values.size).reshape(values.shape)
    copy[...] = values
    return copy


def can_fork() -> bool:
    """Whether a child process can be forked safely (not on Windows, and not on macOS, where
    system libraries may not survive a fork)."""
    return sys.platform not in ("win32", "darwin") and (
        "fork" in multiprocessing.get_all_start_methods()
    )


class ForkedTasks(Generic[T]):
    """task(0, ...) in this process and task(1, ...) ... task(count - 1, ...) at the same time in
    forked children. A child's posts reach `on_message(k, message)` here whenever this process
    calls `drain` (task 0 may, as it runs) and while it waits for the children's results."""

    def __init__(
        self,
        task: Callable[[int, Post | None], T],
        count: int,
        on_message: Callable[[int, Any], None],
    ) -> None:
        self.task, self.count, self.on_message = task, count, on_message
        self._children: list[tuple[Any, Connection]] = []  # (process, its end of the pipe)
        self._results: dict[int, T] = {}

    def run(self, wait_tick: Callable[[], None], interval: float = 1.0) -> list[T]:
        """All the tasks' results, in order; `wait_tick()` is called every `interval` seconds
        while this process waits for a child. A child's exception is raised here (with its
        traceback as a note)."""
        context = multiprocessing.get_context("fork")
        try:
            for k in range(1, self.count):
                receive, send = context.Pipe(duplex=False)
                child = context.Process(target=_child, args=(self.task, k, send), daemon=True)
                child.start()
                send.close()  # the child holds the only writer: its end is an EOF here
                self._children.append((child, receive))
            mine = self.task(0, None)
            for k, (_, receive) in enumerate(self._children, start=1):
                while k not in self._results:
                    receive.poll(interval)
                    self.drain()
                    wait_tick()
            return [mine] + [self._results[k] for k in range(1, self.count)]
        finally:
            for child, receive in self._children:
                receive.close()
                if child.is_alive():
                    child.terminate()
                child.join()

    def drain(self) -> None:
        """Take every message the children have sent so far, without waiting."""
        for k, (child, receive) in enumerate(self._children, start=1):
            while k not in self._results and receive.poll():
                try:
                    kind, value = receive.recv()
                except EOFError:
                    child.join()
                    raise RuntimeError(
                        "a forked simulation process ended without a result "
                        f"(exit code {child.exitcode})"
                    ) from None
                if kind == "message":
                    self.on_message(k, value)
                elif kind == "result":
                    self._results[k] = value
                else:
                    err, text = value
                    if hasattr(err, "add_note"):  # Python 3.11+
                        err.add_note(f"in a forked simulation process:\n{text}")
                    raise err


def _child(task: Callable[[int, Post | None], T], k: int, send: Connection) -> None:
    # a signal stops the child at once; the parent's own handlers unwind the run
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        outcome: tuple[str, object] = ("result", task(k, lambda m: send.send(("message", m))))
    except BaseException as err:  # sent to the parent, which raises it
        outcome = ("error", (err, "".join(traceback.format_exception(err))))
    send.send(outcome)
    send.close()


# ---- a run's replicas over processes -----------------------------------------------------


@dataclass
class GroupOutcome:
    """What a forked process that simulated some replicas sends back: their parts, and the
    request state, engine columns, token runs and counter events of the rows routed to them."""

    rows: np.ndarray
    state: dict[str, np.ndarray]  # RequestState's per-row arrays (MERGED_STATE) at `rows`
    generated: np.ndarray
    ended: int
    request_columns: dict[str, np.ndarray]  # at `rows`
    tokens: TokenRuns
    parts: dict[int, ReplicaPart]  # by replica
    counter_events: dict[int, pd.DataFrame]  # by replica (its policy), when it keeps counters


# RequestState's per-row arrays a process's outcome carries (its `generated` is a list)
MERGED_STATE = (
    "arrival",
    "status",
    "reason",
    "admitted_at",
    "first_token_at",
    "finished_at",
    "replica",
)


def process_groups(runner: Runner) -> list[list[int]]:
    """The replicas each process simulates: all in this one unless `cluster.processes` > 1
    and the replicas run standalone (static dispatch, offline, no spill)."""
    n = len(runner.replicas)
    k = min(runner.cluster.process_count, n)
    alone = not (runner.coupled or runner.pushed or runner.started)
    if k < 2 or not alone or runner.spill is not None or not can_fork():
        return [list(range(n))]
    return [list(range(j, n, k)) for j in range(k)]


def run_in_processes(runner: Runner, groups: list[list[int]]) -> Timeline:
    """Simulate each group of `runner`'s replicas in a process of its own (the first in this
    one) and merge what they return into the timeline one process would give."""
    if runner.progress is not None:  # the progress line sees every process's requests end
        state = runner.state
        state.status = shared_copy(state.status)
        state.first_token_at = shared_copy(state.first_token_at)
        state.finished_at = shared_copy(state.finished_at)
    reached: dict[int, float] = {}  # the simulated time each forked process has reached
    tasks = ForkedTasks(
        lambda k, post: simulate_group(runner, groups[k], post),
        len(groups),
        reached.__setitem__,
    )

    def others_reached() -> float:
        tasks.drain()
        return min(reached.values(), default=np.inf)

    runner.others_reached = others_reached
    outcomes = tasks.run(lambda: runner.tick(runner.env.now))
    runner.others_reached = None
    parts: dict[int, ReplicaPart] = {}
    events: dict[int, pd.DataFrame] = {}
    columns = runner.replicas[0].request_columns()  # this process's rows (group 0) are set
    for k, outcome in enumerate(outcomes):
        parts.update(outcome.parts)
        events.update(outcome.counter_events)
        if k > 0:
            merge(runner, outcome, columns)
    counters = counter_frame([events.get(i) for i in range(len(runner.policies))])
    ordered = [parts[i] for i in range(len(runner.replicas))]
    if runner.progress is not None:
        runner.report(max(part.now for part in ordered), done=True)
    return runner.assemble(ordered, counters, columns)


def simulate_group(runner: Runner, group: list[int], post: Post | None) -> GroupOutcome:
    """Simulate replicas `group` alone to the end: in this process (`post` None), or in a
    forked one, whose progress reports are posted to this one."""
    runner.simulated = group
    if post is not None:  # a forked process: its reports go to the parent
        runner.others_reached = None
        if runner.progress is not None:  # its statuses and times are in shared memory
            runner.progress = lambda snap: post(snap.now)
    runner.frontier = np.inf
    runner.advance(None)
    reps = [runner.replicas[i] for i in group]
    for rep in reps:
        rep.close()
        rep.steps.close()
    state = runner.state
    runner.tokens.close_all(state.generated)
    rows = np.array(sorted(r for i in group for r in runner.routed[i]), dtype=np.int64)
    columns = runner.replicas[0].request_columns()
    return GroupOutcome(
        rows=rows,
        state={name: getattr(state, name)[rows] for name in MERGED_STATE},
        generated=np.asarray(state.generated, dtype=np.int64)[rows],
        ended=state.ended,
        request_columns={name: col[rows] for name, col in columns.items()},
        tokens=runner.tokens,
        parts={rep.index: runner.replica_part(rep) for rep in reps},
        counter_events={
            i: p.counter_events()
            for i in group
            if isinstance(p := runner.policies[i], CounterPolicy)
        },
    )


def merge(runner: Runner, outcome: GroupOutcome, request_columns: dict[str, np.ndarray]) -> None:
    """Take what another process simulated: its rows' state, columns and token runs."""
    state, rows = runner.state, outcome.rows
    for name in MERGED_STATE:
        getattr(state, name)[rows] = outcome.state[name]
    for row, generated in zip(rows.tolist(), outcome.generated.tolist(), strict=True):
        state.generated[row] = generated
    state.ended += outcome.ended
    for name, col in request_columns.items():
        col[rows] = outcome.request_columns[name]
    runner.tokens.absorb(outcome.tokens)
