"""Replicas of a static dispatcher simulated in forked processes (`cluster.processes`): the
timeline is the one a single process gives, field for field and bit for bit."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from conftest import a10g_cost, check_accounting, random_trace
from policies import FCFS, RPM, VTC, FairServe
from simulator.core.requests import COMPLETED
from simulator.core.timeline import Timeline
from simulator.engines import ClusterConfig, SLoRAConfig, VLLMConfig, forked, simulate
from simulator.engines.forked import process_groups
from simulator.engines.online import OnlineRunner
from simulator.engines.runner import ProgressSnapshot, Runner

REQUEST_FIELDS = ("arrival", "status", "reason", "admitted_at", "first_token_at", "finished_at")


def assert_same_timeline(serial: Timeline, forked: Timeline) -> None:
    for name in (*REQUEST_FIELDS, "generated", "token_clock"):
        np.testing.assert_array_equal(getattr(forked, name), getattr(serial, name), err_msg=name)
    assert forked.steps.keys() == serial.steps.keys()
    for name in serial.steps:
        np.testing.assert_array_equal(forked.steps[name], serial.steps[name], err_msg=name)
    assert forked.request_columns.keys() == serial.request_columns.keys()
    for name in serial.request_columns:
        np.testing.assert_array_equal(
            forked.request_columns[name], serial.request_columns[name], err_msg=name
        )
    # token runs come in another order (each process closes its own); every reader sorts them
    a, b = serial.sorted_token_runs(), forked.sorted_token_runs()
    for name in a:
        np.testing.assert_array_equal(b[name], a[name], err_msg=name)
    assert forked.info == serial.info
    assert list(forked.info) == list(serial.info), "same keys in the same order (summary.json)"
    if serial.counters is None:
        assert forked.counters is None
    else:
        pd.testing.assert_frame_equal(forked.counters, serial.counters)


ENGINES = {
    "slora": lambda: SLoRAConfig(pool_tokens=6_000),
    "vllm": lambda: VLLMConfig(pool_tokens=6_000, block_size=16),
}
POLICIES = {"fcfs": FCFS, "vtc": VTC, "rpm": lambda: RPM(limit=8), "fairserve": FairServe}


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize(
    ("replicas", "processes", "dispatcher"),
    [(2, 2, "round_robin"), (3, 2, "client_affinity"), (3, 3, "round_robin")],
)
def test_forked_replicas_give_the_timeline_of_one_process(
    engine, policy, replicas, processes, dispatcher
):
    # overloaded (4 clients at 12 requests/s on small pools): queues, preemptions, rejections
    trace = random_trace(7, 300, 4, 400, 200, 12.0)

    def run(n: int) -> Timeline:
        cluster = ClusterConfig(replicas, dispatcher, processes=n)
        return simulate(trace, POLICIES[policy](), a10g_cost(), ENGINES[engine](), cluster)

    serial, forked = run(1), run(processes)
    check_accounting(forked)
    assert_same_timeline(serial, forked)
    served = serial.request_columns["replica"]
    assert set(served[served >= 0].tolist()) == set(range(replicas)), "every replica served"


def test_a_horizon_leaves_the_same_requests_in_flight_in_every_process():
    trace = random_trace(3, 200, 3, 300, 300, 10.0)
    engine = VLLMConfig(pool_tokens=5_000, horizon=8.0)
    serial, forked = (
        simulate(trace, VTC(), a10g_cost(), engine, ClusterConfig(2, processes=n)) for n in (1, 2)
    )
    assert (serial.reason == "not_arrived").any() and (serial.reason == "running").any()
    assert_same_timeline(serial, forked)


def test_only_offline_runs_of_a_static_dispatcher_are_split_over_processes():
    trace = random_trace(1, 50, 2, 100, 50, 5.0)

    def groups(cluster: ClusterConfig, online: bool = False, **kwargs) -> list[list[int]]:
        make = OnlineRunner if online else Runner
        return process_groups(
            make(trace, FCFS(), a10g_cost(), VLLMConfig(pool_tokens=5_000), cluster, **kwargs)
        )

    assert groups(ClusterConfig(4, processes=2)) == [[0, 2], [1, 3]]
    assert groups(ClusterConfig(2, processes=4)) == [[0], [1]]  # no more than the replicas
    assert groups(ClusterConfig(2, "least_requests", processes=2)) == [[0, 1]]  # coupled
    assert groups(ClusterConfig(2, processes=2), online=True) == [[0, 1]]  # live
    watched = groups(ClusterConfig(2, processes=2), progress=lambda snapshot: None)
    assert watched == [[0], [1]]  # the forked process posts its progress


def test_progress_of_a_forked_run_counts_the_requests_every_process_finished(monkeypatch):
    from simulator.engines import runner

    clock = iter(range(10**9))  # a second of wall time between any two looks: report every time
    monkeypatch.setattr(runner, "wallclock", SimpleNamespace(monotonic=lambda: float(next(clock))))
    trace = random_trace(5, 120, 3, 200, 100, 8.0)
    seen: list[tuple[int, bool, int, bool]] = []

    def progress(snap: ProgressSnapshot) -> None:  # read the live arrays during the call
        odd = ~np.isnan(snap.finished_at[1::2])  # round robin: the forked process's rows
        seen.append((snap.finished, snap.done, snap.total, bool(odd.any())))

    engine = VLLMConfig(pool_tokens=5_000)
    timeline = simulate(trace, FCFS(), a10g_cost(), engine, ClusterConfig(2, processes=2), progress)
    finished = [f for f, _, _, _ in seen]
    assert finished == sorted(finished), "the count never goes back"
    assert seen[-1][:3] == (int((timeline.status == COMPLETED).sum()), True, 120)
    assert [done for _, done, _, _ in seen].count(True) == 1
    assert any(odd and not done for _, done, _, odd in seen), "the forked rows show as they end"
    serial = simulate(trace, FCFS(), a10g_cost(), engine, ClusterConfig(2, processes=1))
    assert_same_timeline(serial, timeline)


def test_where_processes_cannot_be_forked_the_replicas_run_in_this_one(monkeypatch):

    monkeypatch.setattr(forked, "can_fork", lambda: False)
    trace = random_trace(1, 50, 2, 100, 50, 5.0)
    cluster = ClusterConfig(2, processes=2)
    engine = VLLMConfig(pool_tokens=5_000)
    assert process_groups(Runner(trace, FCFS(), a10g_cost(), engine, cluster)) == [[0, 1]]


def test_an_error_in_a_forked_process_is_raised_with_its_traceback(monkeypatch):

    def fail_in_children(runner, group, post):
        if group != [0]:
            raise ValueError(f"replicas {group} failed")
        return original(runner, group, post)

    original = forked.simulate_group
    monkeypatch.setattr(forked, "simulate_group", fail_in_children)
    trace = random_trace(1, 50, 2, 100, 50, 5.0)
    with pytest.raises(ValueError, match=r"replicas \[1\] failed") as err:
        simulate(
            trace, FCFS(), a10g_cost(), VLLMConfig(pool_tokens=5_000), ClusterConfig(2, processes=2)
        )
    assert "in a forked simulation process" in "".join(getattr(err.value, "__notes__", []))


@pytest.mark.parametrize("bad", [0, -1, 1.5, "many", True])
def test_processes_must_be_a_positive_integer_or_auto(bad):
    with pytest.raises(ValueError, match="cluster.processes must be an integer >= 1 or auto"):
        ClusterConfig(2, processes=bad)
    assert ClusterConfig(2, processes="auto").process_count >= 1


def test_auto_processes_become_one_in_a_sweep_job_and_in_parallel_replications():
    from hydra import compose, initialize_config_module
    from hydra.core.hydra_config import HydraConfig

    from simulator.api import instantiate_parts
    from simulator.apps.sweeps.replications import replication_configs

    with initialize_config_module("conf", version_base="1.3"):
        cfg = compose(
            "config", ["cluster.replicas=2", "hydra.mode=MULTIRUN"], return_hydra_config=True
        )
        plain = compose("config", ["cluster.replicas=2"])
    assert cfg.cluster.processes == "auto"
    assert instantiate_parts(cfg)[3].processes == "auto"  # a single run (no Hydra job)
    HydraConfig.instance().set_config(cfg)
    try:
        assert instantiate_parts(cfg)[3].processes == 1  # a multirun job: the sweep uses the CPUs
    finally:
        HydraConfig.instance().cfg = None  # type: ignore[assignment]
    assert [c.cluster.processes for c in replication_configs(plain, 3, jobs=1)] == ["auto"] * 3
    assert [c.cluster.processes for c in replication_configs(plain, 3, jobs=2)] == [1] * 3
