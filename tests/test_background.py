"""Work in a forked child while the parent goes on (simulator/report/background.py): the work
is done when the block ends, a child's failure is raised in the parent, and a failing block
stops the child instead of waiting for it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from simulator.report.background import in_background


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def _fail() -> None:
    raise ValueError("boom")


def _sleep_then_write(path: Path) -> None:
    time.sleep(30)
    path.write_text("late")


def test_the_childs_work_is_done_when_the_block_ends(tmp_path):
    target = tmp_path / "out.txt"
    with in_background(_write, target, "written by the child"):
        meanwhile = sum(range(1000))  # the parent goes on
    assert meanwhile == 499500
    assert target.read_text() == "written by the child"


def test_a_failing_child_is_an_error_in_the_parent():
    failed = pytest.raises(RuntimeError, match="_fail failed in its child process")
    with failed, in_background(_fail):
        pass


def test_a_failing_block_stops_the_child_at_once(tmp_path):
    target = tmp_path / "late.txt"
    start = time.monotonic()
    with pytest.raises(KeyError), in_background(_sleep_then_write, target):
        raise KeyError("the parent failed")
    assert time.monotonic() - start < 10  # not the child's 30 s
    assert not target.exists()
