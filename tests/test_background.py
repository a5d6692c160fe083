"""Work in a forked child while the parent goes on (simulator/report/background.py): the child
prepares first, runs each submitted work in order with its arrays intact through the shared
files, returns their results (a caller may wait for all but a few as it goes), reports a
failure as an error in the parent, is stopped at once when the parent fails, and leaves no
file behind; without fork the same calls run the works in the parent."""

from __future__ import annotations

import os
import tempfile
import time
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest

from simulator.report import background
from simulator.report.background import Worker

prepared: list[str] = []  # what `_prepare` did in this process
shutil_usage = namedtuple("shutil_usage", "total used free")  # as shutil.disk_usage gives


def _prepare() -> None:
    prepared.append("ready")


def _describe(arrays: dict[str, np.ndarray], note: str) -> dict[str, object]:
    """What the child saw: the arrays' digests, whether it could write to one, and whether
    `_prepare` ran before the work, in the process doing the work."""
    sums = {k: float(np.asarray(v, dtype=np.float64).sum()) for k, v in arrays.items()}
    if "big" in arrays:
        arrays["big"][0] = -1.0  # writable; in a child, a private copy: the parent's stays
    return {
        "sums": sums,
        "dtypes": {k: str(v.dtype) for k, v in arrays.items()},
        "shapes": {k: v.shape for k, v in arrays.items()},
        "prepared": list(prepared),
        "pid": os.getpid(),
        "note": note,
    }


def _fail() -> None:
    raise ValueError("boom in the work")


def _sleep_then_write(path: Path) -> None:
    time.sleep(30)
    path.write_text("late")


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    big = rng.random(300_001)  # odd sizes: the next array's data must still be aligned
    return {
        "big": big,
        "ints": np.arange(12_345, dtype=np.int32),
        "empty": np.empty(0),
        "strided": big[::3],  # not contiguous: pickled in-band
        "bools": rng.random(1001) > 0.5,
    }


@pytest.fixture
def shared_files(monkeypatch) -> list[str]:
    """The shared files this test's workers create (recorded as they are made: other processes,
    a parallel test run's included, may hold files of the same name pattern meanwhile)."""
    made: list[str] = []
    mkstemp = background.tempfile.mkstemp

    def recorded(*args, **kwargs):
        fd, path = mkstemp(*args, **kwargs)
        made.append(path)
        return fd, path

    monkeypatch.setattr(background.tempfile, "mkstemp", recorded)
    return made


@pytest.mark.parametrize("fork", [True, False], ids=["child", "inline"])
def test_the_work_gets_its_arrays_intact_after_prepare_and_returns_its_result(
    fork, monkeypatch, shared_files
):
    if not fork:
        monkeypatch.setattr(background, "can_fork", lambda: False)
    elif not background.can_fork():
        pytest.skip("fork is unavailable here")
    prepared.clear()
    arrays = _arrays()
    want = {k: float(np.asarray(v, dtype=np.float64).sum()) for k, v in arrays.items()}
    with Worker(_prepare) as worker:
        worker.submit(_describe, arrays, "first")
        meanwhile = sum(range(1000))  # the parent goes on
        worker.submit(_describe, {"ints": arrays["ints"]}, "second")
        got, second = worker.results()
    assert meanwhile == 499500
    assert got["note"] == "first"
    assert second["note"] == "second"
    assert second["sums"] == {"ints": want["ints"]}
    assert got["prepared"] == ["ready"]
    assert got["dtypes"] == {k: str(v.dtype) for k, v in arrays.items()}
    assert got["shapes"] == {k: v.shape for k, v in arrays.items()}
    assert got["sums"] == want
    if fork:
        assert got["pid"] != os.getpid()
        assert arrays["big"][0] != -1.0, "the child's write reached the parent's array"
        assert prepared == []  # prepared in the child, not here
        assert len(shared_files) == 2  # one per submitted work
    assert not [f for f in shared_files if os.path.exists(f)]


def _write_and_return(path: Path, text: str) -> str:
    path.write_text(text)
    return text


@pytest.mark.parametrize("fork", [True, False], ids=["child", "inline"])
def test_catching_up_leaves_at_most_that_many_works_unfinished_and_keeps_their_results(
    fork, monkeypatch, tmp_path
):
    """A caller submitting one block's work after another bounds what waits: after
    catch_up(1), every work but the last has run, and `results` still gives all in order."""
    if not fork:
        monkeypatch.setattr(background, "can_fork", lambda: False)
    elif not background.can_fork():
        pytest.skip("fork is unavailable here")
    paths = [tmp_path / f"{i}.txt" for i in range(3)]
    with Worker(_prepare) as worker:
        for i, path in enumerate(paths):
            worker.submit(_write_and_return, path, f"work {i}")
        worker.catch_up(1)
        assert paths[0].read_text() == "work 0" and paths[1].read_text() == "work 1"
        if not fork:  # run here, in order, and only as far as asked
            assert not paths[2].exists()
        worker.catch_up(5)  # nothing more to wait for
        assert worker.results() == ["work 0", "work 1", "work 2"]
    assert paths[2].read_text() == "work 2"


def test_arrays_go_to_the_temporary_folder_where_shared_memory_has_no_room(
    monkeypatch, shared_files
):
    """A container's /dev/shm may hold 64 MB, less than one work's arrays: such a work's file
    is made in the temporary folder instead, and the work still gets its arrays."""
    if not background.can_fork():
        pytest.skip("fork is unavailable here")
    free = {"bytes": 10**12}
    monkeypatch.setattr(
        background.shutil, "disk_usage", lambda path: shutil_usage(0, 0, free["bytes"])
    )
    arrays = _arrays()
    with Worker() as worker:
        worker.submit(_describe, arrays, "room")
        free["bytes"] = arrays["big"].nbytes  # less than twice the arrays
        worker.submit(_describe, arrays, "no room")
        roomy, cramped = worker.results()
    assert roomy["sums"] == cramped["sums"]
    assert [Path(f).parent for f in shared_files] == [
        Path(background.SHARED_MEMORY),
        Path(tempfile.gettempdir()),
    ]


def test_a_failing_work_is_an_error_in_the_parent_with_its_traceback():
    with Worker() as worker:
        worker.submit(_fail)
        worker.submit(_describe, {}, "after the failure")
        with pytest.raises(RuntimeError, match="(?s)failed in its child process.*boom in the work"):
            worker.results()


def test_a_failing_parent_stops_the_child_at_once(tmp_path, shared_files):
    target = tmp_path / "late.txt"
    start = time.monotonic()
    with pytest.raises(KeyError), Worker() as worker:
        worker.submit(_sleep_then_write, target)
        raise KeyError("the parent failed")
    assert time.monotonic() - start < 10  # not the child's 30 s
    assert not target.exists()
    assert len(shared_files) == (1 if background.can_fork() else 0)
    assert not [f for f in shared_files if os.path.exists(f)]


def test_a_worker_given_no_work_ends_without_waiting():
    start = time.monotonic()
    with Worker(_prepare):
        pass
    with Worker(_prepare) as worker:
        assert worker.results() == []
    assert time.monotonic() - start < 10


@pytest.mark.slow
def test_a_run_writes_the_same_veeksha_files_with_its_child_and_without_fork(tmp_path, monkeypatch):
    """The run folder's metrics/ from the child (the default here) and from the run's own
    process (where fork is unavailable) are the same bytes, plots included."""
    from simulator.api import compose_config, run_config

    if not background.can_fork():
        pytest.skip("fork is unavailable here: every run writes in-process")
    overrides = [
        "engine=vllm",
        "engine.pool_tokens=20000",
        "cluster.replicas=2",
        "workload.duration=30",
    ]
    run_config(compose_config(overrides), tmp_path / "child")
    monkeypatch.setattr(background, "can_fork", lambda: False)
    run_config(compose_config(overrides), tmp_path / "inline")
    child = sorted(p.name for p in (tmp_path / "child" / "metrics").iterdir())
    assert child == sorted(p.name for p in (tmp_path / "inline" / "metrics").iterdir())
    assert {
        "request_level_metrics.jsonl.gz",
        "tbc.png",
        "deadline_miss_rate_at_tbt_targets.csv",
    } <= set(child)
    for name in child:
        same = (tmp_path / "child" / "metrics" / name).read_bytes() == (
            tmp_path / "inline" / "metrics" / name
        ).read_bytes()
        assert same, name
