"""Multirun sweeps (simulator/sweep.py): folder naming, failures recorded without losing the
other jobs, re-runs skip completed jobs, and the joblib and Ray launchers."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.integration  # servers, subprocesses, notebooks or clients

FAIRSIM = [sys.executable, "-c", "from simulator.apps.run.cli import main; main()"]
SMALL = ["workload.duration=8", "progress=false"]  # progress is left out of folder names


def sweep(sweep_dir: Path, *overrides: str, env: dict[str, str] | None = None):
    return subprocess.run(
        [*FAIRSIM, "-m", *overrides, *SMALL, f"hydra.sweep.dir={sweep_dir}"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def jobs(sweep_dir: Path) -> dict[str, str]:
    return {
        str(p.parent.relative_to(sweep_dir)): json.loads(p.read_text())["status"]
        for p in sweep_dir.glob("**/job.json")
    }


def test_jobs_are_named_by_overrides_with_the_seed_as_its_own_level(tmp_path):
    r = sweep(tmp_path, "policy=fcfs,vtc", "seed=0,1")
    assert r.returncode == 0, r.stderr
    assert jobs(tmp_path) == {
        f"policy={p},workload.duration=8/seed={s}": "completed"
        for p in ("fcfs", "vtc")
        for s in (0, 1)
    }
    config = json.loads(
        (tmp_path / "policy=vtc,workload.duration=8/seed=1/summary.json").read_text()
    )["config"]
    assert config["seed"] == 1 and config["policy"]["_target_"].endswith("VTC")
    # only the seed varies: the setting's folder is "default"
    only_seed = tmp_path / "seeds"
    assert sweep(only_seed, "seed=3").returncode == 0
    assert set(jobs(only_seed)) == {"workload.duration=8/seed=3"}


def test_a_failed_job_is_recorded_and_the_others_complete_and_reruns_skip_them(tmp_path):
    r = sweep(tmp_path, "engine.pool_tokens=-1,10000")
    assert r.returncode == 1  # the sweep says something failed ...
    status = jobs(tmp_path)
    bad, good = (
        "engine.pool_tokens=-1,workload.duration=8/seed=0",
        ("engine.pool_tokens=10000,workload.duration=8/seed=0"),
    )
    assert status == {bad: "failed", good: "completed"}  # ... and the other job still ran
    failure = json.loads((tmp_path / bad / "job.json").read_text())
    assert "engine.pool_tokens must be an integer >= 1" in failure["error"]
    assert (tmp_path / bad / ".hydra" / "config.yaml").exists()  # its config is kept
    table = pd.read_csv(tmp_path / "jobs.csv")
    assert sorted(table["status"]) == ["completed", "failed"]
    # a re-run skips the completed job (its outputs untouched) and retries the failed one
    done = tmp_path / good / "requests.parquet"
    before = done.stat().st_mtime_ns
    again = sweep(tmp_path, "engine.pool_tokens=-1,10000")
    assert again.returncode == 1
    assert f"skipped, already completed: {tmp_path / good}" in again.stdout
    assert done.stat().st_mtime_ns == before
    assert jobs(tmp_path)[bad] == "failed"


def test_a_changed_config_is_not_skipped(tmp_path):
    assert sweep(tmp_path, "policy=fcfs").returncode == 0
    folder = tmp_path / "policy=fcfs,workload.duration=8/seed=0"
    job = json.loads((folder / "job.json").read_text())
    job["config_digest"] = "0" * 16  # as if the job had run with another configuration
    (folder / "job.json").write_text(json.dumps(job))
    r = sweep(tmp_path, "policy=fcfs")
    assert "skipped" not in r.stdout
    assert json.loads((folder / "job.json").read_text())["config_digest"] != "0" * 16


def test_sweeps_run_in_parallel_processes_with_joblib_by_default(tmp_path):
    r = sweep(tmp_path, "hydra.launcher.n_jobs=2", "policy=fcfs,lcf")  # joblib: the default
    assert r.returncode == 0, r.stderr
    assert "Joblib.Parallel(n_jobs=2" in r.stdout + r.stderr
    assert set(jobs(tmp_path).values()) == {"completed"} and len(jobs(tmp_path)) == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_sweep_sent_to_a_ray_address_nothing_answers_fails_at_once(tmp_path):
    """Ray itself retries such an address for minutes, printing its own warnings only."""
    pytest.importorskip(
        "hydra_plugins.hydra_ray_launcher", reason="the ray extra: pip install -e '.[ray]'"
    )
    port = _free_port()  # nothing listens there once the probe socket is closed
    r = sweep(
        tmp_path / "sweep",
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.ray.init.address=127.0.0.1:{port}",
        "policy=fcfs,vtc",
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip() == (
        f"fairsim: error: hydra.launcher.ray.init.address=127.0.0.1:{port}: no Ray cluster "
        "answers there (Connection refused); start one (ray start --head) or use "
        "hydra/launcher=ray_local"
    )
    assert not (tmp_path / "sweep").exists()


@pytest.mark.slow
def test_ray_local_launcher_starts_its_own_ray(tmp_path):
    pytest.importorskip(
        "hydra_plugins.hydra_ray_launcher", reason="the ray extra: pip install -e '.[ray]'"
    )
    env = {**os.environ, "RAY_ADDRESS": ""}  # never attach to a cluster the machine has
    r = sweep(tmp_path, "hydra/launcher=ray_local", "policy=fcfs,vtc", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Started a local Ray instance" in r.stderr
    assert set(jobs(tmp_path).values()) == {"completed"} and len(jobs(tmp_path)) == 2


@pytest.mark.slow
def test_ray_launcher_attaches_to_a_running_cluster(tmp_path):
    """CI starts a Ray head on loopback (token authentication, a fresh token) and sweeps
    through it with hydra/launcher=ray_cluster."""
    pytest.importorskip(
        "hydra_plugins.hydra_ray_launcher", reason="the ray extra: pip install -e '.[ray]'"
    )
    port = _free_port()
    ray_dir = tempfile.mkdtemp(prefix="ray")  # short: Ray's socket paths must fit 107 bytes
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    head = subprocess.Popen(
        [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block"]
        + ["--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2"]
        + ["--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={ray_dir}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:  # wait for the head's GCS port
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert head.poll() is None and time.monotonic() < deadline, "Ray head did not start"
            time.sleep(0.5)
        out = tmp_path / "sweep"
        r = sweep(
            out,
            "hydra/launcher=ray_cluster",
            f"hydra.launcher.ray.init.address=127.0.0.1:{port}",
            "policy=fcfs,vtc",
            env=env,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        assert "Connected to Ray cluster" in r.stderr
        assert jobs(out) == {
            f"policy={p},workload.duration=8/seed=0": "completed" for p in ("fcfs", "vtc")
        }
    finally:
        head.terminate()
        head.wait(60)
        shutil.rmtree(ray_dir, ignore_errors=True)


def test_aggregate_makes_one_tidy_row_per_job_and_client(tmp_path):
    from simulator.apps.sweeps.aggregate import aggregate, load_column, main

    r = sweep(tmp_path, "policy=fcfs,vtc", "workload.rate_scale=0.5,1", "seed=0,1")
    assert r.returncode == 0, r.stderr
    assert sweep(tmp_path, "engine.pool_tokens=-1").returncode == 1  # one failed job too
    table = aggregate(tmp_path)
    done = table[table.status == "completed"]
    assert len(done) == 8 * 3  # 8 jobs x (client0, client1, all)
    assert set(done.client) == {"client0", "client1", "all"}
    assert set(done.policy) == {"fcfs", "vtc"} and set(done.seed) == {0, 1}
    assert set(done["workload.rate_scale"]) == {0.5, 1.0}
    failed = table[table.status == "failed"]
    assert len(failed) == 1 and "pool_tokens" in failed.error.iloc[0]
    # figures are the run's own summary.json values
    row = done[(done.policy == "vtc") & (done.seed == 1) & (done["workload.rate_scale"] == 1)]
    job = row.job.iloc[0]
    summary = json.loads((tmp_path / job / "summary.json").read_text())
    by_client = row.set_index("client")
    assert by_client.loc["all", "throughput_tokens_per_s"] == summary["throughput_tokens_per_s"]
    assert by_client.loc["client1", "ttft_p90"] == summary["latency"]["client1"]["ttft"]["p90"]
    service = summary["fairness"]["service_per_client"]
    assert by_client.loc["all", "service"] == pytest.approx(sum(service.values()))
    assert by_client.loc["all", "jain_index"] == summary["fairness"]["jain_index"]
    assert load_column(table) == "workload.rate_scale"

    main([str(tmp_path)])
    stored = pd.read_parquet(tmp_path / "sweep.parquet")
    assert len(stored) == len(table) == len(pd.read_csv(tmp_path / "sweep.csv"))
    for name in ("sweep_metrics.png", "sweep_service.png", "sweep_fluidity.png"):
        assert (tmp_path / name).stat().st_size > 0
    intervals = pd.read_csv(tmp_path / "sweep_intervals.csv")
    assert len(intervals.setting.unique()) == 4 and (intervals.seeds == 2).all()
    thr = intervals[intervals.metric == "throughput_tokens_per_s"].set_index("setting")
    setting = job.rsplit("/seed=", 1)[0]
    runs = done[(done.client == "all") & done.job.str.startswith(setting + "/")]
    assert thr.loc[setting, "mean"] == pytest.approx(runs.throughput_tokens_per_s.mean())
    assert (thr.ci_low <= thr["mean"] + 1e-9).all() and (thr["mean"] <= thr.ci_high + 1e-9).all()


def test_aggregate_names_an_empty_folder(tmp_path):
    from simulator.apps.sweeps.aggregate import main

    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path)])
    assert exit_info.value.code == 2


def test_fluidity_without_veeksha_files_matches_them(tmp_path):
    """The fluidity CDF reads the Veeksha per-request file, or recomputes the same values from
    the tokens when a sweep switched those files off."""
    import shutil

    from simulator.apps.sweeps.aggregate import request_fluidity

    assert sweep(tmp_path / "s", "policy=vtc").returncode == 0
    folder = next((tmp_path / "s").glob("**/seed=0"))
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare)
    shutil.rmtree(bare / "metrics")
    with_files, recomputed = request_fluidity(folder), request_fluidity(bare)
    assert with_files is not None and recomputed is not None and len(with_files) > 10
    assert sorted(recomputed) == pytest.approx(sorted(with_files), abs=1e-12)


def test_seed_intervals_are_bootstrap_intervals_of_the_mean():
    from simulator.apps.sweeps.aggregate import seed_intervals

    rng = np.random.default_rng(0)
    rows = []
    for setting, spread in (("calm", 1.0), ("noisy", 20.0)):
        for seed, value in enumerate(100 + spread * rng.standard_normal(8)):
            rows.append({"job": f"{setting}/seed={seed}", "policy": setting, "client": "all",
                         "status": "completed", "thr": value})  # fmt: skip
    rows.append({"job": "lone/seed=0", "policy": "lone", "client": "all", "status": "completed",
                 "thr": 5.0})  # fmt: skip
    table = pd.DataFrame(rows)
    got = seed_intervals(table, ["thr"]).set_index("setting")
    again = seed_intervals(table, ["thr"]).set_index("setting")
    pd.testing.assert_frame_equal(got, again)  # a fixed random state: reproducible
    for name in ("calm", "noisy"):
        values = table[table.policy == name].thr
        assert got.loc[name, "mean"] == pytest.approx(values.mean())
        assert got.loc[name, "ci_low"] < values.mean() < got.loc[name, "ci_high"]
    width = got.ci_high - got.ci_low
    assert width["noisy"] > 10 * width["calm"], "the interval widens with the spread"
    assert np.isnan(got.loc["lone", "ci_low"]) and got.loc["lone", "seeds"] == 1


def test_a_display_setting_does_not_make_a_resumed_sweep_run_again(tmp_path):
    """`console_rows` (like `progress`) changes what is printed, not what runs: the job folder
    and the configuration digest leave it out."""
    assert sweep(tmp_path, "policy=fcfs").returncode == 0
    again = sweep(tmp_path, "policy=fcfs", "console_rows=3")
    assert again.returncode == 0, again.stderr
    assert "skipped, already completed" in again.stdout
    assert set(jobs(tmp_path)) == {"policy=fcfs,workload.duration=8/seed=0"}


def test_a_sweep_job_prints_one_line_and_runs_no_comparison_unless_asked(tmp_path):
    plain = sweep(tmp_path / "plain", "policy=vtc")
    assert plain.returncode == 0, plain.stderr
    lines = [line for line in plain.stdout.splitlines() if line.startswith("fairsim: job done")]
    assert len(lines) == 1 and "requests completed" in lines[0] and "per client" not in plain.stdout
    job = tmp_path / "plain" / "policy=vtc,workload.duration=8/seed=0"
    assert "comparison" not in json.loads((job / "summary.json").read_text())
    assert sweep(tmp_path / "asked", "policy=vtc", "compare_with=fcfs").returncode == 0
    job = tmp_path / "asked" / "compare_with=fcfs,policy=vtc,workload.duration=8/seed=0"
    assert json.loads((job / "summary.json").read_text())["comparison"]["policy"] == "fcfs"
