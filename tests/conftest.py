"""Shared helpers: the A10G cost model from conf/, random workloads, and the shared data folder."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from traces import Trace
from traces.files import resolve_path
from traces.schema import TraceError

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the console scripts of the environment running the tests
SHARED_DATA = ROOT.parent / "shared" / "data"
if SHARED_DATA.exists():  # data: paths of data fairsim does not ship resolve to ../shared/data
    os.environ.setdefault("FAIRSIM_DATA_DIR", str(SHARED_DATA))
# A shell script's background job starts with SIGINT ignored, and every command the tests start
# would inherit that (Python then never raises KeyboardInterrupt): the tests that stop a command
# with SIGINT, as Ctrl-C does, need the default a terminal gives (a handler, unlike "ignored",
# is not inherited across exec)
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def wait_until_loading(pid: int, library: str = "_multiarray_umath", timeout: float = 60.0) -> None:
    """Until process `pid` has mapped `library` (read from Linux's /proc): numpy's core, which
    Python's own start-up never loads, so the process is in the command's imports. A SIGINT sent
    earlier, while the interpreter starts (slow on a loaded machine), ends it otherwise."""
    maps = Path(f"/proc/{pid}/maps")
    if not maps.exists():  # not Linux: the interpreter's start takes well under this
        time.sleep(0.15)
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if library in maps.read_text():
            return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} never loaded {library}")


def shared_file(relative: str) -> Path:
    """A file under ../shared/data, or skip the test with a clear message when it is absent."""
    path = SHARED_DATA / relative
    if not path.exists():
        pytest.skip(f"shared data file {path} is absent (tests that read real data need ../shared)")
    return path


def installed_data(path: str) -> Path:
    """A trace path (`data:<dataset>/<file>` or a file) resolved as fairsim resolves it, or skip
    the test, saying which data is missing: fairsim ships part of its data; the rest comes from
    `fairsim-data get` or ../shared beside the checkout."""
    try:
        return resolve_path(path)
    except TraceError as err:
        pytest.skip(f"data not installed here: {err}")


def a10g_cost():  # type: ignore[no-untyped-def]
    return instantiate(OmegaConf.load(ROOT / "conf" / "cost_model" / "a10g_llama7b.yaml"))


def random_trace(seed: int, n: int, clients: int, max_prompt: int, max_output: int, rate: float):
    """A small multi-client Poisson trace with uniform lengths (for invariants and equality)."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    return Trace.from_columns(
        client=[f"c{i}" for i in rng.integers(0, clients, n)],
        arrival=arrival,
        prompt_len=rng.integers(1, max_prompt + 1, n),
        output_len=rng.integers(1, max_output + 1, n),
    )


def with_shared_prefixes(tr: Trace, seed: int, prompts: int = 4, hash_block: int = 64) -> Trace:
    """`tr` with prompt block ids: each request's first half shares one of `prompts` system
    prompts, the rest is its own (so prefix caches and a CPU tier see reuse)."""
    shared = np.random.default_rng(seed).integers(0, prompts, len(tr))
    hashes = [
        np.concatenate(
            [s * 1000 + np.arange(p // hash_block // 2 + 1), r * 10**6 + np.arange(p // hash_block)]
        )[: p // hash_block]
        for r, (s, p) in enumerate(zip(shared, tr.prompt_len, strict=True))
    ]
    return Trace.from_columns(
        client=[tr.client_names[c] for c in tr.client],
        arrival=tr.arrival,
        prompt_len=tr.prompt_len,
        output_len=tr.output_len,
        block_hashes=hashes,
        hash_block_tokens=hash_block,
    )


def check_accounting(tl):  # type: ignore[no-untyped-def]
    """What every engine's timeline must satisfy: each request has a status (and a reason
    unless completed), completed ones emitted exactly their output, token times strictly
    increase within a request, start after its arrival, and the last is the finish time.
    Returns (rows, index, times) of the token table for further checks."""
    from simulator.core.requests import COMPLETED, STATUSES

    t = tl.trace
    assert set(np.unique(tl.status)) <= set(range(len(STATUSES)))
    done = tl.status == COMPLETED
    assert (tl.generated[done] == t.output_len[done]).all()
    assert (tl.generated <= t.output_len).all()
    assert (tl.reason[~done] != None).all()  # noqa: E711 (object array)
    rows, index, times = tl.token_times()
    assert rows.shape[0] == tl.generated.sum()
    same = rows[1:] == rows[:-1]
    assert (np.diff(times)[same] > 0).all(), "token times must strictly increase"
    first = index == 0
    assert (times[first] > tl.arrival[rows[first]]).all()
    assert (tl.finished_at[done] == times[np.cumsum(tl.generated)[done] - 1]).all()
    return rows, index, times


class Server:
    """`fairsim-serve` in a subprocess on a free loopback port; `stop()` sends SIGINT, which
    makes it write its run folder."""

    def __init__(self, folder: Path, *overrides: str) -> None:
        self.folder = folder
        self.proc = subprocess.Popen(
            [str(BIN / "fairsim-serve"), "serve.port=0", f"hydra.run.dir={folder}", *overrides],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the first line says where it listens
        match = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        assert match, line
        self.url = f"http://127.0.0.1:{match.group(1)}/v1"

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGINT)
        out, _ = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, out
        return out


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """An integration test is slow too: `pytest -m "not slow"` leaves out both."""
    for item in items:
        if item.get_closest_marker("integration") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
