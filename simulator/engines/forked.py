"""Work split over forked processes: the replicas of a static dispatcher simulated at once.

A static dispatcher assigns an open-loop trace to replicas up front and no replica reads
another's state, so each group of replicas can be simulated in a process of its own and the
results merged. Forking (not spawning) makes a child start with everything the parent has built
(trace, policies, cost model) and costs milliseconds; each child sends back only its result.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, TypeVar

T = TypeVar("T")


def can_fork() -> bool:
    """Whether a child process can be forked safely (not on Windows, and not on macOS, where
    system libraries may not survive a fork)."""
    return sys.platform not in ("win32", "darwin") and (
        "fork" in multiprocessing.get_all_start_methods()
    )


def run_forked(task: Callable[[int], T], count: int) -> list[T]:
    """[task(0), ..., task(count - 1)]: task(0) in this process, the others at the same time in
    forked children. A child's exception is raised here (with its traceback as a note)."""
    context = multiprocessing.get_context("fork")
    children: list[tuple[Any, Connection]] = []  # (process, the end its result comes from)
    try:
        for k in range(1, count):
            receive, send = context.Pipe(duplex=False)
            child = context.Process(target=_child, args=(task, k, send), daemon=True)
            child.start()
            send.close()  # the child holds the only writer: its end is an EOF here
            children.append((child, receive))
        results = [task(0)]
        for child, receive in children:
            results.append(_result(child, receive))
        return results
    finally:
        for child, receive in children:
            receive.close()
            if child.is_alive():
                child.terminate()
            child.join()


def _child(task: Callable[[int], T], k: int, send: Connection) -> None:
    # a signal stops the child at once; the parent's own handlers unwind the run
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        outcome: tuple[bool, object] = (True, task(k))
    except BaseException as err:  # sent to the parent, which raises it
        outcome = (False, (err, "".join(traceback.format_exception(err))))
    send.send(outcome)
    send.close()


def _result(child: Any, receive: Connection) -> Any:
    try:
        ok, value = receive.recv()
    except EOFError:
        child.join()
        raise RuntimeError(
            f"a forked simulation process ended without a result (exit code {child.exitcode})"
        ) from None
    if ok:
        return value
    err, text = value
    if hasattr(err, "add_note"):  # Python 3.11+
        err.add_note(f"in a forked simulation process:\n{text}")
    raise err
