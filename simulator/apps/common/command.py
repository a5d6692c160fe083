"""How every fairsim command ends: one line on stderr and an exit status that says why.

| exit | meaning |
|---|---|
| 0 | done |
| 2 | an input error: the line names the key, file, row or field and what is accepted |
| 3 | an internal error (a bug): the line says so; the traceback is in the run folder's job.json |
| 4 | a measurement failed: its folder is written, but too many requests failed (fairsim-bench) |
| 130 / 143 | interrupted by SIGINT (Ctrl-C) / SIGTERM; the run folder is marked interrupted |
| 141 | the output's reader went away (`... | head`) |

`FAIRSIM_TRACEBACK=1` (or Hydra's `HYDRA_FULL_ERROR=1`) also prints the full traceback.
"""

from __future__ import annotations

import atexit
import gc
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

import pyarrow
from hydra.errors import (
    ConfigCompositionException,
    InstantiationException,
    MissingConfigException,
    OverrideParseException,
)
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from cost_models.base import CostModelError
from simulator.core.errors import ConfigError
from traces.schema import TraceError

EXIT_INPUT_ERROR = 2
EXIT_INTERNAL_ERROR = 3
EXIT_MEASUREMENT_FAILED = 4
TRACEBACK_SWITCHES = ("FAIRSIM_TRACEBACK", "HYDRA_FULL_ERROR")
INPUT_ERRORS = (ConfigError, TraceError, CostModelError)
# an example value for each mandatory (`???`) key of conf/
MANDATORY_EXAMPLES = {
    "cost_model.path": "my_profile.csv",
    "workload.path": "my_trace.jsonl",
}


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived: stop the run (a BaseException, like KeyboardInterrupt, so no
    `except Exception` swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)  # args stay (signum,), so a copy is made the same way
        self.signum = signum

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name


class RunFailed(BaseException):
    """A run failed after its folder was marked failed. A BaseException so that Hydra, which
    reports any Exception from a job in lines of its own, passes it through to `run_command`."""

    def __init__(self, folder: str, error: BaseException) -> None:
        super().__init__(str(error))
        self.folder = folder
        self.error = error


def input_error_message(err: BaseException) -> str | None:
    """The one line to print for an input error, or None when `err` is not one (a bug)."""
    if isinstance(err, InstantiationException):
        if err.__cause__ is None:  # e.g. a _target_ that cannot be imported
            return _first_line(str(err))
        return input_error_message(err.__cause__)
    if isinstance(err, INPUT_ERRORS):
        return str(err)
    if isinstance(err, MissingMandatoryValue):
        key = err.full_key or "a key"
        return f"{key} has no value; give one, e.g. {key}={MANDATORY_EXAMPLES.get(key, '...')}"
    if isinstance(err, MissingConfigException):
        return _missing_config(err)
    if isinstance(err, ConfigCompositionException | OverrideParseException):
        cause = err.__cause__
        detail = (
            f" ({_first_line(str(cause))})" if isinstance(cause, OmegaConfBaseException) else ""
        )
        return " ".join(str(err).split()) + detail
    if isinstance(err, OmegaConfBaseException):
        return _first_line(str(err)) + (f" (key {err.full_key})" if err.full_key else "")
    if isinstance(err, OSError) and err.filename is not None:
        return f"{err.filename}: {err.strerror or err}"
    return None


def _missing_config(err: MissingConfigException) -> str:
    group, _, name = (err.missing_cfg_file or "").rpartition("/")
    if group and err.options:
        return f"{group}={name}: no such config; accepted: {', '.join(sorted(err.options))}"
    return _first_line(str(err))


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def traceback_requested() -> bool:
    return any(os.environ.get(name) == "1" for name in TRACEBACK_SWITCHES)


def run_command(prog: str, entry: Callable[[], object]) -> None:
    """Run a command's entry point (Hydra's or argparse's main) and end it as the table in the
    module docstring says."""
    # Arrow's default allocator (mimalloc) keeps the pages of the tables it builds to write
    # Parquet files; the system allocator gives them back: the Azure run's peak is 492 MB
    # instead of 514 MB (benchmarks/cli_end_to_end.py, whole process), at the same speed
    pyarrow.set_memory_pool(pyarrow.system_memory_pool())
    # the interpreter's last collections at exit walk every object the imports and the run
    # made, only to free memory the OS takes back anyway; frozen objects are skipped
    atexit.register(gc.freeze)
    show_traceback = traceback_requested()
    try:
        with signals_interrupt(), hydra_reraises():
            entry()
    except (KeyboardInterrupt, Interrupted) as err:
        signum = err.signum if isinstance(err, Interrupted) else signal.SIGINT
        print(f"{prog}: interrupted ({signal.Signals(signum).name})", file=sys.stderr)
        sys.exit(128 + signum)
    except BrokenPipeError:  # the reader went away (`... | head`): stop quietly, as SIGPIPE would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)
    except (Exception, RunFailed) as err:
        _fail(prog, err, show_traceback)


def _fail(prog: str, err: BaseException, show_traceback: bool) -> NoReturn:
    folder = err.folder if isinstance(err, RunFailed) else None
    cause = err.error if isinstance(err, RunFailed) else err
    if show_traceback:
        traceback.print_exception(cause)
    message = input_error_message(cause)
    if message is not None:
        print(f"{prog}: error: {message}", file=sys.stderr)
        sys.exit(EXIT_INPUT_ERROR)
    where = f"; traceback in {folder}/job.json" if folder else ""
    print(
        f"{prog}: internal error (a bug, not your input): {type(cause).__name__}: {cause}{where}"
        f" (FAIRSIM_TRACEBACK=1 prints it)",
        file=sys.stderr,
    )
    sys.exit(EXIT_INTERNAL_ERROR)


@contextmanager
def hydra_reraises() -> Iterator[None]:
    """Hydra prints an error in lines of its own and exits 1 unless HYDRA_FULL_ERROR=1; with it,
    Hydra re-raises and `run_command` reports. The caller's environment is restored after."""
    before = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["HYDRA_FULL_ERROR"]
        else:
            os.environ["HYDRA_FULL_ERROR"] = before


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGTERM raises `Interrupted` like SIGINT raises KeyboardInterrupt, so a run unwinds, marks
    its folder and exits within moments instead of dying mid-write."""

    def handler(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may handle signals
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
