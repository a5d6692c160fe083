import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from conftest import ROOT, installed_data
from simulator.api import check_config, compose_config, run_config

GROUPS = ("engine", "cost_model", "policy", "workload", "experiment", "qoe")


def options(group):
    return sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))


@pytest.mark.parametrize(("group", "name"), [(g, n) for g in GROUPS for n in options(g)])
def test_every_config_composes_passes_the_check_and_instantiates(group, name, tmp_path):
    overrides = [f"{group}={name}"]
    if (group, name) == ("cost_model", "table"):
        profile = tmp_path / "p.csv"
        profile.write_text(
            "phase,batch_size,tokens,seconds\nprefill,1,100,0.01\n"
            "decode,1,100,0.01\ndecode,8,800,0.012\ndecode,4,4000,0.02\n"
        )
        overrides.append(f"cost_model.path={profile}")
    cfg = compose_config(overrides)
    workload = cfg.workload
    if OmegaConf.is_missing(workload, "path"):
        if name == "mooncake":  # a file the user must give: write a small one
            sample = tmp_path / "t.jsonl"
            sample.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2}\n')
        elif name == "inference_perf":
            sample = tmp_path / "profile.yaml"
            sample.write_text(
                "data: {type: random, input_distribution: {type: fixed, mean: 50},"
                " output_distribution: {type: fixed, mean: 5}}\n"
                "load: {type: constant, stages: [{rate: 2, duration: 3}]}\n"
                "server: {ignore_eos: true}\n"
            )
        else:
            sample = tmp_path / "t.csv"
            sample.write_text("arrival,prompt_len,output_len\n0,5,2\n1.5,6,3\n")
        workload.path = str(sample)
    check_config(cfg)  # the check by key passes every config fairsim ships
    for g in ("engine", "cost_model", "policy"):
        assert instantiate(cfg[g], _convert_="all") is not None
    if workload.get("path"):
        installed_data(workload.path)  # skips, saying so, where the data is not installed
    trace = instantiate(workload, _convert_="all").build(0)
    assert len(trace) > 0


@pytest.mark.slow
def test_default_run_through_the_python_api(tmp_path):
    cfg = compose_config(["workload.duration=20"])
    timeline, out = run_config(cfg, tmp_path)
    assert out.summary["requests"] == 30 + 60
    assert cfg.policy._target_ == "policies.VTC"  # VTC is the default policy
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["comparison"]["policy"] == "fcfs"  # ... shown beside FCFS on the same trace
    assert saved["fairness"]["avg_diff"] < saved["comparison"]["avg_diff"]
    assert (tmp_path / "counters.parquet").exists() and out.counters is not None


def fairsim(*args, cwd):
    return subprocess.run(
        [sys.executable, "-c", "from simulator.apps.run.cli import main; main()", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.integration
def test_cli_runs_and_prints_a_per_client_table(tmp_path):
    res = fairsim(
        "workload.duration=30", "progress=false", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr
    assert "client0" in res.stdout and "client1" in res.stdout and "TTFT" in res.stdout
    assert "tokens/s" in res.stdout
    assert "Max Diff" in res.stdout and "VTC" in res.stdout and "FCFS" in res.stdout
    assert "fluidity-index (D_p 0.1 s, D_d 0.05 s" in res.stdout
    assert "fluid token generation rate" in res.stdout
    summary = json.loads(Path(tmp_path / "run" / "summary.json").read_text())
    assert summary["status_counts"]["completed"] == 45 + 90
    assert set(summary["qoe"]["fluidity_per_client"]) == {"client0", "client1"}
    assert summary["slo_results"] == {"all_slos_met": True, "results": []}
    rows_file = tmp_path / "run" / "metrics" / "request_level_metrics.jsonl.gz"
    rows = gzip.decompress(rows_file.read_bytes()).splitlines()
    assert len(rows) == 45 + 90


@pytest.mark.integration
@pytest.mark.parametrize(("replicas", "dispatcher"), [(2, "global_vtc"), (4, "least_tokens")])
def test_cli_runs_slora_replicas_behind_a_dispatcher(tmp_path, replicas, dispatcher):
    import pandas as pd

    res = fairsim(
        "engine=slora",
        f"cluster.replicas={replicas}",
        f"cluster.dispatcher={dispatcher}",
        "workload.duration=30",
        "workload.rate_scale=3",
        "progress=false",
        "veeksha_metrics=false",
        f"hydra.run.dir={tmp_path}/run",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert [r["replica"] for r in summary["replicas"]] == list(range(replicas))
    counts = summary["status_counts"]
    assert sum(counts.values()) == summary["requests"] == 3 * (45 + 90)
    assert counts["completed"] == summary["requests"], "no horizon: every request completes"
    steps = pd.read_parquet(run / "steps.parquet")
    assert steps.groupby("replica").kv_used.max().max() <= summary["pool_tokens"]
    requests = pd.read_parquet(run / "requests.parquet")
    assert requests.replica.between(0, replicas - 1).all()
    assert "replica" in res.stdout and "TTFT p99" in res.stdout
    if dispatcher == "global_vtc":  # FCFS has no counters: compared on one shared queue
        assert summary["comparison"]["dispatcher"] == "central"
        assert "FCFS (central)" in res.stdout


@pytest.mark.integration
def test_cli_slos_and_the_prefill_curve_deadline(tmp_path):
    res = fairsim(
        "workload.duration=30",
        "compare_with=null",
        "veeksha_metrics=false",
        "qoe.ttft_deadline=null",
        "slos=[{metric: ttfc, percentile: 0.5, value: 1000}, {metric: fluidity, percentile: 0.9,"
        " value: 1.01}]",
        f"hydra.run.dir={tmp_path}/run",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads(Path(tmp_path / "run" / "summary.json").read_text())
    assert [r["met"] for r in summary["slo_results"]["results"]] == [True, False]
    curve = summary["qoe"]["deadlines"]["ttft"]["prefill_curve"]
    assert curve["min_prompt"] == 256 and curve["max_prompt"] == 16384
    assert not (tmp_path / "run" / "metrics").exists()


@pytest.mark.integration
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["policy=nope"], "policy=nope: no such config; accepted: andes, dlpm, drr, fairserve"),
        (
            ["no_such_key=1"],
            "no_such_key: not a setting of fairsim; accepted: ['client_timeout', 'cluster', ",
        ),
        (
            ["engine.pool_token=1000"],
            "engine.pool_token: not a setting of engine (did you mean engine.pool_tokens?); "
            "accepted: ['batch_max_tokens', ",
        ),
        (
            ["policy=vtc", "policy.limit=20"],
            "; limit is a setting of policy=rpm, policy=rpm_interaction",
        ),
        (
            ["workload.clients.0.rat=3"],
            "workload.clients.0.rat: not a setting of workload.clients.0; accepted: ['arrival', ",
        ),
        (["qoe=null"], "qoe=null: qoe is a config group; accepted: one of its configs (etalon)"),
        (["compare_with=vtcc"], "compare_with=vtcc: no such policy; accepted: andes, dlpm, "),
        (["engine.pool_tokens=-5"], "engine.pool_tokens must be an integer >= 1"),
        (["engine.pool_tokens=10k"], "engine.pool_tokens='10k': expected an integer"),
        (["seed=abc"], "seed='abc': expected an integer"),
        (["+policy.speed=2"], "policy.speed: not a setting of policies.VTC; accepted: ["),
        (
            ["+seeed=3"],
            "seeed: not a setting of this command; accepted: ['client_timeout', 'cluster', ",
        ),
        (["cost_model=table"], "cost_model.path has no value; give one, e.g. cost_model.path="),
        (["workload=mooncake"], "workload.path has no value; give one, e.g. workload.path="),
        (["workload.duration=0"], "duration must be > 0"),
        (["slos=[{metric: latency, percentile: 0.9, value: 1}]"], "slos[0], field 'metric'"),
        (["seed=[1"], "no viable alternative at input '[1'"),
        (
            ["cluster.prefill_replicas=1", "cluster.decode_replicas=1"],
            "cluster.prefill_replicas > 0 (disaggregated pools) needs engine=vllm, got "
            "engine=slora",
        ),
        (["cluster.prefill_replicas=1"], "cluster.prefill_replicas > 0 needs cluster.decode_"),
        (["cluster.disaggregation.decider=coin"], "cluster.disaggregation.decider must be one of"),
        (
            ["cluster.disaggregation.prefill_engine={pool_tokens: 3}"],
            "cluster.disaggregation.prefill_engine: a mapping; add its entries one at a time with "
            "+, e.g. +cluster.disaggregation.prefill_engine.NAME=VALUE",
        ),
        (
            ["hydra.run.dir=/proc/nope"],
            "hydra.run.dir=/proc/nope: cannot make the run folder there",
        ),
    ],
)
def test_cli_input_errors_are_one_line_naming_the_key_with_exit_status_2(tmp_path, args, message):
    run_dir = (
        []
        if any(a.startswith("hydra.run.dir") for a in args)
        else [f"hydra.run.dir={tmp_path}/run"]
    )
    res = fairsim(*args, *run_dir, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fairsim: error: "), res.stderr
    assert message in lines[0]


def test_the_python_api_keeps_its_old_import_path():
    """Notebooks and scripts written against `simulator.apps.run` keep working: it re-exports
    the API that now lives in `simulator.api`."""
    import simulator.api as api
    import simulator.apps.run as old

    for name in old.__all__:
        assert getattr(old, name) is getattr(api, name), name
    assert old.__all__ == api.__all__


@pytest.mark.integration
def test_the_first_line_says_what_runs(tmp_path):
    res = fairsim("policy=fcfs", "seed=4", "workload.duration=2", f"hydra.run.dir={tmp_path}/run",
                  cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    first = res.stdout.splitlines()[0]
    assert first.startswith("fairsim: policy=fcfs workload=") and first.endswith(" seed=4")
    assert " engine=slora cost_model=" in first


@pytest.mark.integration
def test_stdout_holds_the_commands_output_and_no_library_notes(tmp_path):
    """With no font cache yet (a fresh machine), matplotlib logs that it built one at INFO
    level, which Hydra printed on stdout before the summary."""
    res = subprocess.run(
        [sys.executable, "-c", "from simulator.apps.run.cli import main; main()",
         "workload.duration=20", "compare_with=null", f"hydra.run.dir={tmp_path}/run"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "MPLCONFIGDIR": str(tmp_path / "matplotlib")},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "matplotlib").exists()  # matplotlib ran with an empty cache
    assert "matplotlib" not in res.stdout
    assert res.stdout.startswith("fairsim: policy=vtc workload=vtc_overload")
