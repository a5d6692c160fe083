"""How a run ends and what its folder says: empty runs finish, a bug is reported as one (exit 3,
traceback kept in job.json), SIGINT/SIGTERM stop the run with 130/143 and mark the folder, and
`load_run` / `fairsim-aggregate` take only folders marked completed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import a10g_cost, random_trace
from policies import FCFS
from simulator.apps.sweeps.aggregate import aggregate
from simulator.engines import SLoRAConfig, simulate
from simulator.report.run_folder import (
    IncompleteRunError,
    load_run,
    mark_orphaned_jobs,
    mark_status,
    write_run,
)

pytestmark = pytest.mark.integration  # servers, subprocesses, notebooks or clients

CLI = "from simulator.apps.run.cli import main; main()"
# a bug planted in a metric: the run folder's summary raises ZeroDivisionError
BUGGY_CLI = (
    "import simulator.report.run_folder as f; f.fairness_summary = lambda *a, **k: 1 / 0; " + CLI
)
QUICK = ["workload.duration=20", "progress=false", "compare_with=null", "veeksha_metrics=false"]


def fairsim(*args: str, code: str = CLI, env: dict[str, str] | None = None, cwd: Path):
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def small_timeline():
    return simulate(random_trace(1, 100, 3, 300, 100, 5.0), FCFS(), a10g_cost(), SLoRAConfig())


def start(
    args: list[str], cwd: Path, own_group: bool = False, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CLI, *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=own_group,
    )


def status(folder: Path) -> dict:
    return json.loads((folder / "job.json").read_text())


@pytest.mark.parametrize("override", ["engine.pool_tokens=100", "engine.horizon=0.01"])
def test_a_run_where_nothing_completes_finishes_with_empty_metrics(tmp_path, override):
    res = fairsim(override, "progress=false", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "no completed requests" in res.stdout
    back = load_run(tmp_path / "run")
    s = back.summary
    assert s["status_counts"]["completed"] == 0
    assert sum(s["status_counts"].values()) == s["requests"] == len(back.requests)
    assert s["fairness"]["max_diff"] is None and s["fairness"]["avg_diff"] is None  # NaN
    assert s["qoe"]["fluidity"]["mean"] is None
    assert len(back.tokens) == 0


def test_an_internal_error_exits_3_with_one_line_and_keeps_the_traceback(tmp_path):
    run = tmp_path / "run"
    res = fairsim(*QUICK, f"hydra.run.dir={run}", code=BUGGY_CLI, cwd=tmp_path)
    assert res.returncode == 3, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fairsim: internal error (a bug")
    assert "ZeroDivisionError" in lines[0] and str(run / "job.json") in lines[0]
    failed = status(run)
    assert failed["status"] == "failed" and failed["kind"] == "internal error"
    assert "ZeroDivisionError" in failed["traceback"] and "fairness_summary" in failed["traceback"]
    with pytest.raises(IncompleteRunError, match="is failed"):
        load_run(run)


def test_the_traceback_switch_prints_the_whole_traceback(tmp_path):
    res = fairsim(
        *QUICK,
        f"hydra.run.dir={tmp_path}/run",
        code=BUGGY_CLI,
        env={"FAIRSIM_TRACEBACK": "1"},
        cwd=tmp_path,
    )
    assert res.returncode == 3
    assert "Traceback (most recent call last)" in res.stderr
    assert res.stderr.rstrip().splitlines()[-1].startswith("fairsim: internal error")


def test_an_input_error_leaves_no_folder_behind(tmp_path):
    """A mistyped command is refused before anything is written: the console line is the
    record, and neither the run folder nor the `outputs/<date>/` it made is left behind (a
    sweep keeps its failed jobs' folders: tests/test_sweep.py)."""
    res = fairsim("engine.pool_tokens=-5", cwd=tmp_path)  # the default run folder, outputs/...
    assert res.returncode == 2
    assert "engine.pool_tokens must be an integer >= 1" in res.stderr
    assert list(tmp_path.iterdir()) == []
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("kept")
    res = fairsim("engine.pool_tokens=-5", f"hydra.run.dir={mine}/run", cwd=tmp_path)
    assert res.returncode == 2 and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize(("signum", "exit_status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_the_run_with_one_line_and_marks_the_folder(tmp_path, signum, exit_status):
    run = tmp_path / "run"
    # about 6 s of simulation on a 2-core VM: long enough to be stopped in the middle
    args = ["workload.duration=3000", "progress=false", "compare_with=null", f"hydra.run.dir={run}"]
    proc = start(args, tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not (run / "job.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status(run)["status"] == "running"
        time.sleep(0.5)  # into the simulation
        sent = time.monotonic()
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
        stopped_after = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == exit_status, err
    assert err.splitlines() == [f"fairsim: interrupted ({signal.Signals(signum).name})"]
    assert stopped_after < 5, "stops promptly instead of finishing the run"
    marked = status(run)
    assert marked == {**marked, "status": "interrupted", "signal": signal.Signals(signum).name}
    with pytest.raises(IncompleteRunError, match="is interrupted"):
        load_run(run)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_a_run_whose_replicas_are_simulated_in_forked_processes(tmp_path, signum):
    run = tmp_path / "run"
    args = ["workload.duration=3000", "cluster.replicas=2", "cluster.processes=2"]
    args += ["progress=false", "compare_with=null", f"hydra.run.dir={run}"]
    proc = start(args, tmp_path, own_group=True)
    try:
        deadline = time.monotonic() + 60
        while not (run / "job.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # into the simulation
        sent = time.monotonic()
        os.killpg(proc.pid, signum)  # the forked process gets it too, as from a terminal
        _, err = proc.communicate(timeout=30)
        stopped_after = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, err
    assert err.splitlines() == [f"fairsim: interrupted ({signal.Signals(signum).name})"]
    assert stopped_after < 5, "stops promptly instead of finishing the run"
    assert status(run)["status"] == "interrupted"


def test_load_run_takes_only_a_folder_marked_completed(tmp_path):
    timeline = small_timeline()
    write_run(timeline, tmp_path / "half", {"seed": 1}, complete=False)
    assert (tmp_path / "half" / "summary.json").exists()
    with pytest.raises(IncompleteRunError, match="is running"):
        load_run(tmp_path / "half")
    write_run(timeline, tmp_path / "whole", {"seed": 1})
    assert len(load_run(tmp_path / "whole").requests) == len(timeline.requests_frame())
    assert not list((tmp_path / "whole").glob("*.tmp")), "temporary names are renamed"
    with pytest.raises(IncompleteRunError, match="not a fairsim run folder"):
        load_run(tmp_path)


def test_aggregate_skips_a_folder_with_a_summary_but_no_completion_mark(tmp_path):
    timeline = small_timeline()
    for name, complete in (("done", True), ("broken", False)):
        folder = tmp_path / name / "seed=0"
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "hydra.yaml").write_text("hydra: {runtime: {choices: {}}}\n")
        (folder / ".hydra" / "overrides.yaml").write_text(f"- workload.name={name}\n")
        (folder / ".hydra" / "config.yaml").write_text("seed: 0\n")
        write_run(timeline, folder, {"seed": 0}, complete=complete)
    table = aggregate(tmp_path).drop_duplicates("job").set_index("job")["status"]
    assert table.to_dict() == {"broken/seed=0": "running", "done/seed=0": "completed"}


# On PYTHONPATH as sitecustomize: in every process but the first (the sweep's own), a SIGTERM
# handler waits 30 s before it runs, as a worker busy in a long C call would. The launcher then
# ends the workers before they can mark their folders, the race CI once lost.
SLOW_WORKERS = """
import os, signal, time
if os.environ.setdefault("SLOW_SIGTERM_PARENT", str(os.getpid())) != str(os.getpid()):
    _install = signal.signal

    def _slow_install(signum, handler):
        if signum == signal.SIGTERM and callable(handler):
            fast = handler

            def handler(*args):
                time.sleep(30)
                fast(*args)

        return _install(signum, handler)

    signal.signal = _slow_install
"""


@pytest.mark.parametrize("workers", ["prompt", "slow to react"])
def test_sigterm_stops_a_sweep_and_marks_every_running_job_interrupted(tmp_path, workers):
    sweep = tmp_path / "sweep"
    args = ["-m", "policy=fcfs,vtc", "workload.duration=3000", "progress=false"]
    args += ["compare_with=null", f"hydra.sweep.dir={sweep}"]
    env = None
    if workers == "slow to react":
        (tmp_path / "sitecustomize.py").write_text(SLOW_WORKERS)
        env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = start(args, tmp_path, own_group=True, env=env)  # a process group, as a terminal gives
    try:
        deadline = time.monotonic() + 120
        while len(list(sweep.glob("**/job.json"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGTERM)  # what a terminal's job control or a scheduler does
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    # joblib's resource tracker, a helper process that outlives the sweep, may still warn on the
    # same stderr about the semaphores and folders of the workers it ended; fairsim's own last
    # word is the interrupt, and nothing raised a traceback
    ours = [line for line in err.splitlines() if line.startswith("fairsim")]
    assert ours[-1] == "fairsim: interrupted (SIGTERM)", err
    assert "Traceback" not in err, err
    marks = [json.loads(p.read_text()) for p in sorted(sweep.glob("**/job.json"))]
    # a worker marks its own job as it stops; the sweep marks those the launcher ended first
    assert [m["status"] for m in marks] == ["interrupted", "interrupted"], marks
    assert all(m["signal"] == "SIGTERM" for m in marks), marks
    if workers == "slow to react":
        assert all("worker_pid" in m for m in marks), "marked by the sweep, not the worker"


def test_orphaned_jobs_are_the_running_ones_whose_process_on_this_host_has_ended(tmp_path):
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    ended_pid = int(ended.stdout)  # reaped by subprocess.run: no such process any more
    host = socket.gethostname()
    jobs = {
        "orphan": {"status": "running", "pid": ended_pid, "host": host},
        "alive": {"status": "running", "pid": os.getpid(), "host": host},
        "elsewhere": {"status": "running", "pid": ended_pid, "host": host + "-other"},
        "done": {"status": "completed", "pid": ended_pid, "host": host},
        "older": {"status": "running"},  # written before job.json recorded the process
    }
    for name, job in jobs.items():
        mark_status(tmp_path / name / "seed=0", **{**job, "config_digest": name})
    marked = mark_orphaned_jobs(tmp_path, "SIGINT")
    assert marked == [tmp_path / "orphan" / "seed=0"]
    after = {name: status(tmp_path / name / "seed=0") for name in jobs}
    assert after["orphan"] == {
        "status": "interrupted",
        "config_digest": "orphan",
        "signal": "SIGINT",
        "worker_pid": ended_pid,
    }
    assert all(after[n]["status"] == jobs[n]["status"] for n in jobs if n != "orphan")


def test_a_stopped_run_leaves_no_spilled_records_or_half_written_files(tmp_path):
    """A run too large for memory spills its step records to `.spill/` as it goes (here a
    1 MB budget forces it); stopped, it removes them and any `*.tmp` not yet renamed."""
    run = tmp_path / "run"
    args = ["workload.duration=3000", "memory_budget_mb=1", "progress=false",
            "compare_with=null", f"hydra.run.dir={run}"]  # fmt: skip
    proc = start(args, tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not (run / ".spill").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (run / ".spill").exists(), "the run spills"
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert status(run)["status"] == "interrupted"
    assert not (run / ".spill").exists() and not list(run.rglob("*.tmp"))
