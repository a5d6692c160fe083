"""Work in a forked child process while this one goes on (`Worker`).

A run's Veeksha rows, plots and deadline-miss curve need only arrays this process holds, and
take about 2 s of the Azure conversation run, a fifth of it importing matplotlib; on a machine
with a second core they cost little while this process computes and writes the other files. The
child is forked when the run starts, so that it imports what its work needs while this process
simulates (a core is idle then), and gets each work's arrays when they exist: pickled, with
their data written once to a temporary file that the child maps instead of reading through a
pipe (65 MB of gaps take 0.2 s through a pipe, 0.03 s this way). Where fork is unavailable or
unsafe (Windows, macOS) the works run here, when their results are asked for.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import pickle
import shutil
import signal
import tempfile
import traceback
from collections.abc import Callable
from contextlib import suppress
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any

from simulator.engines.forked import can_fork

ALIGN = 64  # each array's data starts at a multiple of this many bytes in the shared file
SHARED_MEMORY = "/dev/shm"


class Worker:
    """A child process that runs `prepare()` at once (e.g. imports), then each piece of work
    submitted later (`submit`), in order, and gives back their results (`results`). As a
    context manager it stops the child at the end unless the results were taken."""

    def __init__(self, prepare: Callable[[], None] | None = None) -> None:
        self._prepare = prepare
        self._inline: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self._files: list[str] = []  # the shared files of the submitted arrays
        self._done: list[Any] = []  # the results of the finished works, in order
        self._child: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None
        if can_fork():
            ours, theirs = multiprocessing.Pipe()
            self._child = multiprocessing.get_context("fork").Process(
                target=_serve,
                args=(theirs, prepare),
                daemon=True,  # never outlives this one
            )
            self._child.start()
            theirs.close()
            self._conn = ours

    def submit(self, work: Callable[..., Any], *args: Any) -> None:
        """Queue `work(*args)` in the child (`work` must be a module-level function)."""
        if self._conn is None:
            self._inline.append((work, args))
            return
        buffers: list[pickle.PickleBuffer] = []
        payload = pickle.dumps((work, args), protocol=5, buffer_callback=buffers.append)
        size = sum(buf.raw().nbytes + ALIGN for buf in buffers)
        fd, path = tempfile.mkstemp(prefix="fairsim-", dir=_shared_folder(size))
        self._files.append(path)
        spans = []
        with os.fdopen(fd, "wb") as f:
            for buf in buffers:
                raw = buf.raw()
                start = -f.tell() % ALIGN + f.tell()
                f.seek(start)
                f.write(raw)
                spans.append((start, raw.nbytes))
        self._conn.send((payload, path, spans))

    def catch_up(self, behind: int) -> None:
        """Wait until at most `behind` submitted works are unfinished (where the works run
        here, run the oldest now): a caller submitting one large piece of work after another
        keeps at most that many waiting in memory."""
        try:
            while self._unfinished() > behind:
                self._done.append(self._next_result())
        except BaseException:
            self.stop()
            raise

    def results(self) -> list[Any]:
        """Wait for every submitted work and return what each returned, in order; raise
        RuntimeError if one failed."""
        if self._conn is not None:
            self._conn.send(None)  # no more work
        try:
            while self._unfinished():
                self._done.append(self._next_result())
        finally:
            self._close()
        done, self._done = self._done, []
        return done

    def _unfinished(self) -> int:
        if self._conn is None:
            return len(self._inline)
        return len(self._files) - len(self._done)

    def _next_result(self) -> Any:
        """The oldest unfinished work's result: run here, or received from the child."""
        if self._conn is None:
            if self._prepare is not None:
                self._prepare()
                self._prepare = None
            work, args = self._inline.pop(0)
            return work(*args)
        try:
            status, value = self._conn.recv()
        except EOFError:
            raise RuntimeError("the child process ended before its work") from None
        if status != "ok":
            raise RuntimeError(f"a work failed in its child process: {value}")
        return value

    def stop(self) -> None:
        """End the child now, whatever it is doing."""
        if self._child is not None and self._child.is_alive():
            self._child.terminate()
        self._close()

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._child is not None:
            self._child.join()
        for path in self._files:  # the child removes each once it has mapped it
            with suppress(FileNotFoundError):
                os.unlink(path)
        self._conn, self._child, self._files = None, None, []

    def __enter__(self) -> Worker:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _shared_folder(size: int) -> str | None:
    """/dev/shm (memory, not disk) where it has room for `size` bytes twice over, else the
    temporary folder: a container's /dev/shm may hold 64 MB, less than one work's arrays."""
    try:
        room = shutil.disk_usage(SHARED_MEMORY).free
    except OSError:  # no /dev/shm here
        return None
    return SHARED_MEMORY if room > 2 * size else None


def _serve(conn: Connection, prepare: Callable[[], None] | None) -> None:
    # the parent's handlers mark the run folder interrupted: the child must only stop
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        if prepare is not None:
            prepare()
        while (message := conn.recv()) is not None:
            payload, path, spans = message
            conn.send(("ok", _run(payload, path, spans)))
    except EOFError:  # the parent went away, or ended without results
        return
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        conn.send(("error", traceback.format_exc()))


def _run(payload: bytes, path: str, spans: list[tuple[int, int]]) -> Any:
    buffers = [memoryview(b"")] * len(spans)  # every array empty: the file is too
    if os.path.getsize(path):
        with open(path, "rb") as f:
            # private: the work may write to its arrays without touching the file
            shared = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY))
        buffers = [shared[a : a + n] for a, n in spans]
    os.unlink(path)  # mapped: nothing is left behind even if the parent is killed
    work, args = pickle.loads(payload, buffers=buffers)
    return work(*args)
