"""Replications (simulator/apps/sweeps/replications.py): each differs only in its jitter seed
(and, if asked, its workload seed), the statistics are the textbook ones, a deterministic engine
gives zero spread, and running them in parallel changes nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from simulator.api import compose_config
from simulator.apps.sweeps.replications import interval_cell, replication_config, spread
from simulator.report.run_folder import load_run


def test_a_replication_moves_its_jitter_and_policy_streams_and_the_workload_only_if_asked():
    base = compose_config(["policy=vtc_oracle", "engine.step_jitter_seed=5", "seed=3"])
    rep = replication_config(base, 2)
    assert rep.engine.step_jitter_seed == 7 and rep.policy.seed == base.policy.seed + 2
    assert rep.seed == 3 and rep.workload == base.workload
    assert rep.replications == 1 and rep.progress is False
    varied = replication_config(compose_config(["seed=3", "replicate_workload=true"]), 2)
    assert varied.seed == 5 and varied.engine.step_jitter_seed == 2
    drawless = replication_config(compose_config(["policy=fcfs"]), 2)
    assert "seed" not in drawless.policy  # a policy that draws nothing gets no seed


def test_spread_is_the_t_interval_and_numpys_percentiles():
    x = [3.0, 1.0, 4.0, 1.5, 5.0]
    s = spread([*x, None, float("nan")])  # missing values are left out
    assert s["n"] == 5 and s["mean"] == pytest.approx(np.mean(x))
    assert s["std"] == pytest.approx(np.std(x, ddof=1))
    low, high = stats.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=stats.sem(x))
    assert s["ci95"] == pytest.approx([low, high])
    assert [s["p5"], s["p50"], s["p95"]] == pytest.approx(np.percentile(x, [5, 50, 95]))
    one = spread([2.0])
    assert one["mean"] == 2.0 and np.isnan(one["std"]) and np.isnan(one["ci95"][0])


def replicate(tmp_path, name, *overrides):
    run = tmp_path / name
    res = subprocess.run(
        [sys.executable, "-c", "from simulator.apps.run.cli import main; main()", "replications=3",
         "workload.duration=40", "compare_with=null", "veeksha_metrics=false", *overrides,
         f"hydra.run.dir={run}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "95% CI of the mean" in res.stdout
    return run, json.loads((run / "replications.json").read_text())


@pytest.mark.integration
def test_replications_write_their_folders_and_statistics_and_parallel_changes_nothing(tmp_path):
    run, noisy = replicate(tmp_path, "noisy", "engine.step_jitter_cv=0.2", "replication_jobs=2")
    _, serial = replicate(tmp_path, "serial", "engine.step_jitter_cv=0.2", "replication_jobs=1")
    assert noisy["metrics"] == serial["metrics"]
    thr = noisy["metrics"]["throughput_tokens_per_s"]
    assert thr["n"] == 3 and thr["std"] > 0 and thr["ci95"][0] < thr["mean"] < thr["ci95"][1]
    for i in range(3):
        back = load_run(run / f"replication={i}")
        assert back.summary["config"]["engine"]["step_jitter_seed"] == i
        assert back.summary["throughput_tokens_per_s"] == thr["values"][i]


@pytest.mark.integration
def test_a_deterministic_engine_gives_identical_replications(tmp_path):
    _, exact = replicate(tmp_path, "exact", "replication_jobs=1")
    assert exact["step_jitter_cv"] == exact["run_speed_cv"] == 0.0
    assert all(len(set(m["values"])) == 1 for m in exact["metrics"].values() if m["n"] > 1)
    assert exact["metrics"]["throughput_tokens_per_s"]["std"] == pytest.approx(0.0, abs=1e-9)


def test_a_paper_replication_takes_the_suites_jitter_and_run_speed_and_moves_its_seeds():
    from simulator.api import compose_config
    from simulator.apps.sweeps.replications import PAPER_SUITE_JITTER_CV, paper_replication

    cfg = compose_config(["experiment=vtc_overload", "policy=vtc_oracle"])
    assert paper_replication(cfg, 3).engine.run_speed_cv == 0.0  # a testbed without logs
    rep = paper_replication(cfg, 3, run_speed_cv=0.013)
    assert rep.engine.step_jitter_cv == PAPER_SUITE_JITTER_CV == 0.02
    assert rep.engine.run_speed_cv == 0.013
    assert rep.engine.step_jitter_seed == cfg.engine.step_jitter_seed + 3
    assert rep.policy.seed == cfg.policy.seed + 3
    assert rep.seed == cfg.seed  # the workload never changes


def test_an_interval_cell_says_whether_the_papers_value_lies_within_p5_p95():
    values = [10.0, 12.0, 11.0, 13.0, 9.0]
    p5, p50, p95 = np.percentile(values, [5, 50, 95])
    inside = interval_cell(values, 11.5)
    assert inside.split()[-1] == "in" and f"{p50:.1f} [{p5:.1f}, {p95:.1f}]" in inside
    assert interval_cell(values, 20.0).split()[-1] == "out"
    tight = [10.0, 10.1, 10.2, 10.05, 10.15]  # median 10.1: 11.5 is outside, but within 15%
    assert interval_cell(tight, 11.5).split()[-1] == "15%"
    assert interval_cell(values, None).split()[-1] == f"{p95:.1f}]"


@pytest.mark.slow
def test_vtc_tables_print_intervals_beside_the_paper(capsys):
    from simulator.apps.papers.vtc_tables import ROWS, main

    main(["--table", "5", "--replications", "2"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("2 replications per row, step-time jitter CV 0.02, run speed CV 0.013")
    rows = [line.split() for line in out[2:] if line.startswith("5 ")]
    papers = [r for r in ROWS if r.table == "5"]
    assert len(rows) == len(papers)
    for words, row in zip(rows, papers, strict=True):
        published = sum(v is not None for v in (row.max_diff, row.avg_diff, row.throughput))
        verdicts = [w for w in words if w in ("in", "15%", "out")]
        assert len(verdicts) == published, words
