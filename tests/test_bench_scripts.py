"""benchmarks/cli_end_to_end.py's comparison with a baseline revision: both run from their own code,
and the temporary worktree is gone afterwards."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.integration  # servers, subprocesses, notebooks or clients

BENCH = [sys.executable, str(ROOT / "benchmarks" / "cli_end_to_end.py")]


def worktrees() -> list[str]:
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "list", "--porcelain"],
        capture_output=True,
        text=True,
    )
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout ({listed.stderr.strip()}): no revision to compare with")
    return [line for line in listed.stdout.splitlines() if line.startswith("worktree ")]


def test_the_cli_bench_runs_a_baseline_revision_beside_this_code_and_removes_its_worktree():
    before = worktrees()
    res = subprocess.run(
        [*BENCH, "--baseline", "HEAD", "--runs", "1"], capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.splitlines()[-1])
    base = out["baseline"]
    assert base["rev"] == "HEAD" and out["runs"] == 1
    for figures in (out, base):  # each side's own run, split into the CLI's phases
        assert figures["wall_s"] > figures["simulate_s"] > 0
        assert 0 < figures["peak_mb_after_simulate"] <= figures["peak_mb"]
    assert out["wall_ratio"] == round(out["wall_s"] / base["wall_s"], 3)
    assert worktrees() == before


def test_the_cli_bench_names_a_revision_it_cannot_check_out():
    before = worktrees()
    res = subprocess.run(
        [*BENCH, "--baseline", "no-such-revision"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode != 0
    assert "--baseline no-such-revision: no worktree" in res.stderr
    assert worktrees() == before
