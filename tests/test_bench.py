"""`fairsim-bench`, `fairsim-compare` and `fairsim-calibrate` against `fairsim-serve` on
loopback, bounded in time: a 16-second replay whose every token the server also recorded, the
same arrivals simulated offline, and a cost model recovered from client-side timings alone."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from hydra.utils import instantiate
from omegaconf import OmegaConf

pytest.importorskip("openai")

from test_calibrate import TRUE_COST  # noqa: E402

from conftest import BIN, ROOT, Server  # noqa: E402

pytestmark = pytest.mark.integration  # servers, subprocesses, notebooks or clients

# the server's cost model: the A10G fit with a per-request prefill term a short run identifies
ENGINE = [f"cost_model.{k}={v}" for k, v in TRUE_COST.items()] + ["policy=fcfs"]
# one client, short outputs, about 60 requests in 6-8 s; the run ends in about 15 s
SHORT_CHATS = [
    "workload=poisson_chat",
    "workload.clients.0.output.median=60",
    "workload.clients.0.output.max_value=200",
    "seed=3",
]
# loaded enough that requests queue (TTFT spreads over seconds) and steps vary as a GPU's do
# (2% step-time jitter, as in docs/validation.md)
# Run at a quarter of real speed: the loopback's write and read jitter (about 1 ms of wall time
# on a quiet machine, a 10 ms median and a 37 ms p99 with both cores of a 2-core machine kept
# busy by other work) is then a quarter of that in simulated time.
REALISTIC = [
    *SHORT_CHATS,
    "workload.duration=6",
    "workload.clients.0.arrival.rate=10",
    "engine.step_jitter_cv=0.02",
    "serve.time_scale=0.25",
    "target.time_scale=0.25",
]
# shaped for calibration: bursty arrivals (prefills of 1 to several requests) and a prefill
# chance every 2 decode steps (many prefill steps, which alone tell the overhead apart). At half
# speed (REALISTIC runs slower still): at full speed the loopback's jitter on a busy machine
# moved the 3 ms per-request prefill term by up to 12.6% (CI), the step overhead by up to 7.9%.
CALIBRATION = [
    *SHORT_CHATS,
    "workload.duration=12",
    "workload.clients.0.arrival._target_=traces.Gamma",
    "workload.clients.0.arrival.rate=8",
    "+workload.clients.0.arrival.cv=3",
    "engine.max_wait_tokens=2",
    "serve.time_scale=0.5",
    "target.time_scale=0.5",
]


TYPICAL_DECODES = ((4, 1200), (8, 2500), (16, 5000))
TYPICAL_PREFILLS = (np.array([200]), np.array([150, 400]))


def run(command: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        [str(BIN / command), *args], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    if check:
        assert res.returncode == 0, res.stdout + res.stderr
    return res


@dataclass
class Runs:
    bench: Path  # what fairsim-bench measured
    server: Path  # what fairsim-serve simulated while it was measured
    offline: Path  # the same workload simulated by `fairsim`


def measure(tmp: Path, workload: list[str], offline: bool) -> Runs:
    """fairsim-bench against fairsim-serve (both with ENGINE), and optionally `fairsim` on
    the same workload."""
    served = [x for x in workload if x.startswith(("engine.", "serve."))]
    server = Server(tmp / "server", *ENGINE, *served)
    workload = [x for x in workload if not x.startswith("serve.")]
    try:
        args = [f"target.url={server.url}", *workload, "progress=false"]
        run("fairsim-bench", *args, f"hydra.run.dir={tmp / 'bench'}")
        server.stop()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    if offline:
        workload = [x for x in workload if not x.startswith("target.")]
        args = [*workload, *ENGINE, "compare_with=null", "progress=false"]
        run("fairsim", *args, f"hydra.run.dir={tmp / 'offline'}")
    return Runs(tmp / "bench", tmp / "server", tmp / "offline")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return measure(tmp_path_factory.mktemp("realistic"), REALISTIC, offline=True)


def monotonic_times(folder: Path, times: np.ndarray) -> np.ndarray:
    """A run's times on the machine's monotonic clock, from the clock its summary records."""
    clock = json.loads((folder / "summary.json").read_text())["clock"]
    return clock["started_monotonic"] + (times - clock["time_origin"]) / clock["time_scale"]


def test_every_request_is_accounted_for_and_every_token_arrives_when_the_server_simulated_it(
    runs: Runs,
):
    bench = pd.read_parquet(runs.bench / "requests.parquet")
    assert len(bench) >= 40 and (bench.status == "completed").all()
    assert (bench.tokens_emitted == bench.output_len).all()
    assert (bench.reported_tokens == bench.output_len).all()  # the server's usage agrees
    served = pd.read_parquet(runs.server / "requests.parquet")
    served["rid"] = served.client_request_id.astype(int)
    assert sorted(served.rid) == sorted(bench.request_id)  # X-Request-Id joins the records
    ours = pd.read_parquet(runs.bench / "tokens.parquet")
    theirs = pd.read_parquet(runs.server / "tokens.parquet").merge(
        served[["request_id", "rid"]], on="request_id"
    )
    both = ours.merge(
        theirs.drop(columns="request_id").rename(columns={"rid": "request_id"}),
        on=["request_id", "index"],
        suffixes=("_measured", "_simulated"),
    )
    assert len(both) == len(ours) == len(theirs)
    late = monotonic_times(runs.bench, both.time_measured.to_numpy()) - monotonic_times(
        runs.server, both.time_simulated.to_numpy()
    )
    print(f"measured - simulated token time (wall): median {1e3 * np.median(late):.2f} ms, "
          f"p99 {1e3 * np.percentile(late, 99):.2f} ms")  # fmt: skip
    # in simulated time, against decode steps of 16-30 ms: a token may be late by a fraction of
    # a step (median) and, rarely, by one (p99). A quiet machine does ten times better; that
    # figure belongs to benchmarks/serve_load.py, since a busy one (10 ms median, 37 ms p99 of
    # wall time, 2.5 and 9.3 ms simulated) is no fault of the server
    late_simulated = np.abs(late) * 0.25
    assert np.median(late_simulated) <= 0.005
    assert np.percentile(late_simulated, 99) <= 0.025


def test_a_live_run_matches_its_offline_simulation_in_distribution(runs: Runs, tmp_path: Path):
    res = run("fairsim-compare", str(runs.offline), str(runs.bench), "--out", str(tmp_path))
    assert "inter-token latency" in res.stdout
    result = json.loads((tmp_path / "comparison.json").read_text())
    for metric in ("ttft", "itl", "e2e"):
        offline, bench = result["latency"][metric]["offline"], result["latency"][metric]["bench"]
        relative = bench["wasserstein"] / offline["mean"]
        print(f"{metric}: KS {bench['ks']:.3f}, Wasserstein {relative:.2%} of the mean")
        # how far the measured distribution moved from the simulated one, as a share of the
        # mean: the loopback's jitter moves each inter-token gap a little, which a KS test of
        # 5,000 gaps flags (0.084 on a busy machine) but which moves them by 1.2% of the mean;
        # a step cost or time scale off by 10% would move them by about 10%
        assert relative <= 0.05, metric
    assert result["summary"]["bench"]["requests"] == result["summary"]["offline"]["requests"]
    assert (tmp_path / "cdf.png").stat().st_size > 0


def test_calibration_recovers_the_servers_cost_model_from_client_timings(tmp_path: Path):
    runs = measure(tmp_path / "measured", CALIBRATION, offline=False)
    res = run("fairsim-calibrate", str(runs.bench), "--out", str(tmp_path))
    assert "fairsim --config-dir" in res.stdout
    fitted = yaml.safe_load((tmp_path / "cost_model" / "calibrated.yaml").read_text())
    standard_errors = json.loads((tmp_path / "calibration.json").read_text())["standard_errors"]
    off_by_more = []
    for name, truth in TRUE_COST.items():
        value, error = fitted[name], standard_errors[name]
        print(f"{name}: fitted / true - 1 = {value / truth - 1:+.1%} ± {error / truth:.1%}")
        # the loopback's jitter is noise the fit reports (tests/test_calibrate.py checks that
        # its standard errors are honest); on a busy machine it moved the step overhead by up
        # to 24%, within 2 of its standard errors, while its sums with decode_base and the
        # per-request prefill term stay put. Without the burst-delay terms, a burst's delay
        # growing with its size (1.0 ms of wall time for 5 decode tokens, 1.8 ms for 20-40;
        # 1.7 ms for a one-request prefill, 2.2-3.0 ms for 4-8) moved step_overhead 5-11% low
        # on a quiet machine, 1.2-3.8 of its small standard errors, and 13.2% (4.7) in one CI
        # run; with them, while the server formed the next step before handing out the tokens
        # of the last (the burst before a prefill late by the prefill's forming), 12.6% (4.0)
        if abs(value - truth) > max(0.10 * truth, 4 * error):
            off_by_more.append((name, value, error, truth))
    assert not off_by_more
    delay = json.loads((tmp_path / "calibration.json").read_text())["burst_delay"]
    print("burst delay per token (ms, simulated):", {k: 1e3 * v for k, v in delay.items()})
    true_model = instantiate({"_target_": "cost_models.LinearStepCost", **TRUE_COST})
    model = instantiate(OmegaConf.create(fitted))
    steps = [  # typical decode batches (size, context) and prefills (prompt lengths)
        *((model.decode_time(b, c), true_model.decode_time(b, c)) for b, c in TYPICAL_DECODES),
        *((model.prefill_time(p), true_model.prefill_time(p)) for p in TYPICAL_PREFILLS),
    ]
    print("typical steps, fitted / true - 1:", [f"{100 * (a / b - 1):+.2f}%" for a, b in steps])
    for fitted_time, true_time in steps:
        assert fitted_time == pytest.approx(true_time, rel=0.05)
    # fairsim runs the fitted model as written
    run(
        "fairsim",
        "--config-dir",
        str(tmp_path),
        "cost_model=calibrated",
        "workload.duration=5",
        "compare_with=null",
        "progress=false",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
