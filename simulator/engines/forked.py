"""Work split over forked processes: the replicas of a static dispatcher simulated at once.

A static dispatcher assigns an open-loop trace to replicas up front and no replica reads
another's state, so each group of replicas can be simulated in a process of its own and the
results merged. Forking (not spawning) makes a child start with everything the parent has built
(trace, policies, cost model) and costs milliseconds; each child sends back only its result, and
while it runs, the messages it posts (progress).
"""

from __future__ import annotations

import mmap
import multiprocessing
import signal
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Generic, TypeVar

import numpy as np

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
