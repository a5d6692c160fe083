"""Writing files in a forked child process while this one goes on.

A run's Veeksha plots and deadline-miss curve need only arrays this process already holds, and
take about 1.5 s of the Azure conversation run (matplotlib's import and six histograms, and the
miss rate at 40 deadlines); on a machine with a second core they cost nothing while this
process writes the other files. A forked child inherits those arrays without copying or
pickling them. Where fork is unavailable or unsafe (Windows, macOS) the work runs first, here.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def _child(work: Callable[..., None], args: tuple[Any, ...]) -> None:
    # the parent's handlers mark the run folder interrupted: the child must only stop
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    work(*args)


@contextmanager
def in_background(work: Callable[..., None], *args: Any) -> Iterator[None]:
    """Run `work(*args)` in a forked child while the with-block runs; wait for it at the end and
    raise if it failed. If the block fails, the child is stopped."""
    if sys.platform in ("win32", "darwin") or "fork" not in multiprocessing.get_all_start_methods():
        work(*args)
        yield
        return
    child = multiprocessing.get_context("fork").Process(target=_child, args=(work, args))
    child.daemon = True  # never outlives this process
    child.start()
    try:
        yield
    except BaseException:
        child.terminate()
        child.join()
        raise
    child.join()
    if child.exitcode != 0:
        raise RuntimeError(f"{work.__name__} failed in its child process (exit {child.exitcode})")
