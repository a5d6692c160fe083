"""Capacity-search drivers against analytic pass/fail functions with known thresholds, and one
end-to-end search on the simulator checked against a direct sweep."""

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from simulator.api import compose_config
from simulator.apps.capacity.cli import (
    SimulatedService,
    capacity_search,
    lower_bound_hints,
    write_results,
)
from simulator.apps.capacity.searches import (
    EVALSCOPE_METRICS,
    STEADY_STATE_UNITS,
    Condition,
    Probe,
    SearchResult,
    etalon_search,
    evalscope_search,
    parse_sla_params,
    results_table,
    veeksha_search,
)
from simulator.core.errors import ConfigError


def below(threshold):
    return lambda x: (x <= threshold, {"x": x})


@pytest.mark.parametrize("start", [0.5, 3.0, 7.0, 40.0])
@pytest.mark.parametrize("threshold", [1.37, 6.5, 12.0])
def test_etalon_search_brackets_the_threshold_from_above_and_below(start, threshold):
    res = etalon_search(below(threshold), start)
    assert res.best_value is not None and res.best_value <= threshold
    assert len(res.history) <= 20
    fails = [p.value for p in res.history if not p.passed]
    # converged: within 2.5% of the threshold or at the 0.01 grid, and never past it
    assert threshold - res.best_value <= max(0.025 * threshold, 0.011) + 1e-9
    assert all(f > threshold for f in fails)


def test_etalon_search_reports_when_nothing_passes():
    res = etalon_search(below(-1.0), 2.0)
    assert res.best_value is None and res.note == "no probed load met the SLO"
    with pytest.raises(ValueError, match="start"):
        etalon_search(below(1.0), 0.0)


@pytest.mark.parametrize("start", [1, 3, 20, 70])
@pytest.mark.parametrize("threshold", [1, 2, 13, 50])
def test_etalon_search_on_integers_finds_the_exact_threshold(start, threshold):
    res = etalon_search(below(threshold), start, decimals=0)
    assert all(isinstance(p.value, int) for p in res.history)
    # integer bisection stops when the midpoint repeats: the bracket is [threshold, threshold+1]
    # unless the 2.5% rule stops it first
    assert res.best_value is not None and res.best_value <= threshold
    assert threshold - res.best_value <= 0.025 * threshold + 1e-9
    assert etalon_search(below(0), start, decimals=0).best_value is None


@pytest.mark.parametrize("start", [1, 5, 17, 100])
@pytest.mark.parametrize("threshold", [1, 9, 33, 64])
def test_veeksha_search_finds_the_exact_integer_threshold(start, threshold):
    res = veeksha_search(below(threshold), start)
    assert res.best_value == threshold or (start > threshold and res.best_value == threshold)
    probed = [p.value for p in res.history]
    assert len(probed) == len(set(probed))


def test_veeksha_search_on_a_float_grid_and_its_bounds():
    assert veeksha_search(below(2.37), 0.5, precision=2).best_value == pytest.approx(2.37)
    assert veeksha_search(below(1e9), 1, upper=40).note == "passed at the upper bound"
    assert veeksha_search(below(0.001), 1).best_value is None


def measure_ttft(threshold_rate):
    """p99_ttft grows with the rate and crosses 2.0 exactly at `threshold_rate`."""
    return lambda v: {
        "p99_ttft": 2.0 * v / threshold_rate,
        "tps": -((v - 37) ** 2) + 5000.0,
        "success_rate": 1.0,
    }


@pytest.mark.parametrize("start", [1, 4, 50])
def test_evalscope_search_integer_threshold_from_either_side(start):
    group = [Condition("p99_ttft", "<=", 2.0)]
    res = evalscope_search(measure_ttft(23), group, start, lower=1, upper=100)
    assert res.best_value == 23 and res.note == "Satisfied"


def test_evalscope_lower_and_upper_bound_notes_and_failed_requests():
    group = [Condition("p99_ttft", "<", 0.01)]
    res = evalscope_search(measure_ttft(23), group, 16, lower=10, upper=40)
    assert res.best_value is None and res.note == "Failed at lower bound (10)"
    ok = [Condition("p99_ttft", "<=", 1e9)]
    assert evalscope_search(measure_ttft(23), ok, 2, 1, 40).note == "Reached upper bound"

    def lossy(v):  # every metric fine, but requests fail above 12
        return {"p99_ttft": 0.0, "success_rate": 1.0 if v <= 12 else 0.99}

    assert evalscope_search(lossy, ok, 2, 1, 100).best_value == 12


def test_evalscope_groups_are_anded_within_and_searched_separately():
    groups = parse_sla_params([{"p99_ttft": "<=2", "tps": ">=3000"}, {"p99_ttft": "<1"}])
    assert [len(g) for g in groups] == [2, 1]
    m = measure_ttft(23)
    both = evalscope_search(m, groups[0], 4, 1, 100)
    assert both.best_value == 23  # tps >= 3000 holds up to 81; the TTFT bound binds first
    second = evalscope_search(m, groups[1], 4, 1, 100)
    assert second.best_value == 11  # 2 v / 23 < 1  <=>  v <= 11
    table = results_table([both, second])
    assert "| Criteria" in table and "p99_ttft <= 2 AND tps >= 3000" in table


def test_evalscope_extremum_finds_the_peak_of_a_unimodal_metric():
    (group,) = parse_sla_params([{"tps": "max"}])
    for start in (1, 5, 30, 64):
        res = evalscope_search(measure_ttft(23), group, start, 1, 200)
        assert res.best_value == 37, start
        assert res.note.startswith("Best tps: 5000")


def test_sla_params_grammar_errors():
    with pytest.raises(ValueError, match="accepted: <=, >=, <, >"):
        parse_sla_params([{"p99_ttft": "=2"}])
    with pytest.raises(ValueError, match="extremum"):
        parse_sla_params([{"tps": "max", "p99_ttft": "<2"}])
    with pytest.raises(ValueError, match="non-empty"):
        parse_sla_params([])


def test_a_misspelled_sla_metric_is_refused_naming_the_accepted_ones():
    """Before, `p99_ttfb` was taken and every probe failed for want of the metric."""
    with pytest.raises(ValueError, match=r"unknown metric 'p99_ttfb' \(did you mean p99_ttft\?\)"):
        parse_sla_params([{"p99_ttft": "<=2"}, {"p99_ttfb": "<=2"}])


@pytest.mark.parametrize("mode", ["evalscope", "steady_state"])
def test_each_probe_measures_exactly_the_metrics_a_criterion_may_name(mode):
    cfg = capacity_cfg("capacity.num_requests=40", f"capacity.mode={mode}")
    service = SimulatedService(cfg)
    measure = service.evalscope_metrics if mode == "evalscope" else service.steady_state_metrics
    assert sorted(measure(1.0, 1)) == sorted([*EVALSCOPE_METRICS, "success_rate"])


def test_sla_params_read_operators_and_units_as_evalscope_does():
    """EvalScope 1.14.1: a bare number is in the report's unit (TTFT, TPOT: ms; latency: s),
    s or ms converts, unicode operators are read as ASCII."""
    (group,) = parse_sla_params([{"p99_ttft": "≤ 2000", "tps": "≥10", "rps": "≧\u20091"}])
    assert [(c.op, c.threshold) for c in group] == [("<=", 2000.0), (">=", 10.0), (">=", 1.0)]
    (group,) = parse_sla_params(
        [{"p99_ttft": "<=2s", "avg_tpot": "<50ms", "p99_latency": "<=500ms"}]
    )
    assert [c.threshold for c in group] == [2000.0, 50.0, 0.5]
    (group,) = parse_sla_params([{"p99_ttft": "<=2"}], STEADY_STATE_UNITS)  # seconds there
    assert group[0].threshold == 2.0
    with pytest.raises(ValueError, match="unit 'ms' does not fit the metric, which is in tok/s"):
        parse_sla_params([{"tps": ">=10ms"}])
    with pytest.raises(ValueError, match="accepted: <=, >=, <, > followed by a number"):
        parse_sla_params([{"p99_ttft": "<=two"}])


def test_an_evalscope_rate_point_sends_twice_the_rate_in_requests_paced_to_end_at_n_over_rate():
    """EvalScope: number = round(2 x rate); exponential gaps scaled so the last request is
    sent at number / rate; the workload's own lengths."""
    cfg = capacity_cfg("capacity.mode=evalscope", "capacity.variable=rate")
    service = SimulatedService(cfg)
    for rate in (1, 3, 7):
        trace = service.evalscope_trace(float(rate), seed=5)
        assert len(trace) == 2 * rate
        assert trace.arrival[-1] == pytest.approx(2.0)  # number / rate = 2 s
        assert np.all(np.diff(trace.arrival) >= 0) and trace.arrival[0] > 0
    again = service.evalscope_trace(3.0, seed=5)
    np.testing.assert_array_equal(again.arrival, service.evalscope_trace(3.0, seed=5).arrival)
    cfg = capacity_cfg("capacity.mode=evalscope", "capacity.number_multiplier=0.5")
    assert len(SimulatedService(cfg).evalscope_trace(3.0, seed=5)) == 2  # round(1.5)


def test_with_evalscopes_seed_rate_points_send_when_evalscope_sends():
    """EvalScope seeds numpy's legacy stream once (--seed) and draws each point's gaps from it
    in turn; with capacity.client_seed the offline points draw the same numbers."""
    cfg = capacity_cfg("capacity.mode=evalscope", "capacity.client_seed=7")
    service = SimulatedService(cfg)
    stream = np.random.RandomState(7)
    for rate in (2.0, 4.0, 3.0):  # in the order a search probes them
        n = round(2 * rate)
        sent = np.cumsum(stream.exponential(1.0 / rate, size=n))
        sent *= (n / rate) / sent[-1]
        np.testing.assert_array_equal(service.evalscope_trace(rate, seed=0).arrival, sent)


def test_an_evalscope_users_point_starts_its_users_a_dispatch_gap_apart():
    cfg = capacity_cfg(
        "capacity.mode=evalscope", "capacity.variable=concurrency", "capacity.dispatch_gap=0.001"
    )
    trace = SimulatedService(cfg).evalscope_trace(4.0, seed=1)
    assert len(trace) == 8  # round(2 x 4) requests, each user sends 2
    first = trace.arrival[trace.predecessor() < 0]  # each user's first request
    np.testing.assert_allclose(np.sort(first), [0.0, 0.001, 0.002, 0.003], atol=1e-12)


def test_point_metrics_in_evalscopes_units_and_rounding():
    """A hand-computed point: three requests sent at 0, 1 and 2 s, one failed; TTFT and TPOT in
    ms rounded to 2 decimals, latency in s to 4; rps and tps over first send to last end."""
    from simulator.apps.capacity.cli import point_metrics

    requests = pd.DataFrame(
        {
            "request_id": [0, 1, 2],
            "client": ["c", "c", "c"],
            "arrival": [0.0, 1.0, 2.0],
            "status": ["completed", "completed", "rejected"],
            "first_token_at": [0.1234567, 1.5, np.nan],
            "finished_at": [1.1234567, 1.5, np.nan],
            "tokens_emitted": [5, 1, 0],
            "output_len": [5, 1, 3],
            "prompt_len": [8, 8, 8],
        }
    )
    tokens = pd.DataFrame(
        {
            "request_id": [0, 0, 0, 0, 0, 1],
            "index": [0, 1, 2, 3, 4, 0],
            "time": [0.1234567, 0.3734567, 0.6234567, 0.8734567, 1.1234567, 1.5],
        }
    )
    m = point_metrics(requests, tokens)
    assert m["success_rate"] == pytest.approx(2 / 3)
    assert m["avg_ttft"] == round((123.4567 + 500.0) / 2, 2) == 311.73
    assert m["avg_tpot"] == 250.0  # the one-token request has no TPOT and is left out
    assert m["p99_ttft"] == 500.0 and m["p50_ttft"] == 123.4567  # nearest rank, 4 decimals
    assert m["avg_latency"] == round((1.1234567 + 0.5) / 2, 4) == 0.8117
    assert m["rps"] == round(2 / 1.5, 4) and m["tps"] == round(6 / 1.5, 4)
    seconds = point_metrics(requests, tokens, scale=1.0, rounded=False)
    assert seconds["avg_ttft"] == pytest.approx((0.1234567 + 0.5) / 2, rel=1e-12)


def capacity_cfg(*overrides):
    return compose_config(overrides, "capacity")


def test_end_to_end_etalon_search_agrees_with_a_direct_sweep(tmp_path):
    cfg = capacity_cfg("capacity.num_requests=300", "capacity.start=1.0")
    (res,) = capacity_search(cfg)
    assert res.best_value is not None
    service = SimulatedService(cfg)
    # the search's answer passes; the direct sweep's first failure above it is within Etalon's
    # 2.5% stopping tolerance (or the 0.01 grid) of it
    assert service.check_slos(res.best_value)[0]
    sweep = np.round(np.arange(res.best_value, 2 * res.best_value, 0.01), 2)
    first_fail = next(r for r in sweep if not service.check_slos(float(r))[0])
    assert first_fail - res.best_value <= max(0.025 * res.best_value, 0.01) + 0.011
    doc = write_results([res], tmp_path, "etalon")
    saved = json.loads((tmp_path / "capacity_search_results.json").read_text())
    assert saved["best_value"] == res.best_value == doc["best_value"]
    assert len(saved["history"]) == len(res.history)
    assert (tmp_path / "capacity_search.png").stat().st_size > 0


def test_a_probe_whose_clients_give_up_fails_however_fast_the_rest_are_served():
    """`client_timeout` applies to every probe as to a run: at a light load every request is
    served and the SLO met; with clients that give up after 1 s (before most answers end),
    the same load is not sustained, and the probe says how many gave up. EvalScope's probes
    count them as failed requests."""
    plain = SimulatedService(capacity_cfg("capacity.num_requests=100"))
    hasty = SimulatedService(capacity_cfg("capacity.num_requests=100", "client_timeout=1.0"))
    passed, measured = plain.check_slos(0.2)
    assert passed and "clients_gave_up" not in measured
    passed, measured = hasty.check_slos(0.2)
    assert not passed and measured["clients_gave_up"] > 0
    assert hasty.evalscope_metrics(0.2, 1)["success_rate"] < 1.0
    assert plain.evalscope_metrics(0.2, 1)["success_rate"] == 1.0


def test_end_to_end_concurrency_search_agrees_with_a_direct_sweep(tmp_path):
    """Closed-loop users: Veeksha's search lands on the last passing user count of a sweep
    over 1, 2, ... (the miss rate grows with the users here, so the sweep's first failure is
    the search's answer + 1)."""
    cfg = capacity_cfg(
        "capacity.variable=concurrency",
        "capacity.mode=veeksha",
        "capacity.start=2",
        "capacity.num_requests=200",
    )
    (res,) = capacity_search(cfg)
    assert res.variable == "concurrency" and res.best_value is not None
    service = SimulatedService(cfg)
    passes = [service.check_slos(users)[0] for users in range(1, int(res.best_value) + 2)]
    assert all(passes[:-1]) and not passes[-1]
    assert all(float(p.value).is_integer() for p in res.history)
    write_results([res], tmp_path, "veeksha")
    saved = json.loads((tmp_path / "capacity_search_results.json").read_text())
    assert saved["variable"] == "concurrency" and saved["best_value"] == res.best_value


def test_concurrency_probes_build_closed_loops_of_that_many_users():
    service = SimulatedService(
        capacity_cfg("capacity.variable=concurrency", "capacity.num_requests=50")
    )
    trace = service.trace(7, seed=0)
    assert trace.chained and len(trace) == 50 and trace.interaction_id.max() == 6
    with pytest.raises(ValueError, match="concurrency must be an integer"):
        service.trace(2.5, seed=0)
    with pytest.raises(ValueError, match="exceeds the 50 requests"):
        service.trace(51, seed=0)
    # a ClosedLoop workload keeps its think time; only the users change
    cl = SimulatedService(
        capacity_cfg(
            "workload=closed_loop_chat",
            "workload.think_time=2.0",
            "capacity.variable=concurrency",
            "capacity.num_requests=30",
        )
    )
    t = cl.trace(3, seed=0)
    assert len(t) == 30 and set(t.think_time[t.call_index > 0]) == {2.0}


def test_capacity_search_rejects_bad_configuration():
    with pytest.raises(ValueError, match="capacity.mode"):
        capacity_search(capacity_cfg("capacity.mode=bisect"))
    with pytest.raises(ValueError, match="needs at least one SLO"):
        capacity_search(capacity_cfg("slos=[]"))
    with pytest.raises(ValueError, match="synthetic workload"):
        SimulatedService(capacity_cfg("workload=vtc_artifact"))
    with pytest.raises(ValueError, match="capacity.variable: got 'users'"):
        SimulatedService(capacity_cfg("capacity.variable=users"))
    with pytest.raises(ValueError, match="closed loops: capacity.variable=concurrency"):
        SimulatedService(capacity_cfg("workload=closed_loop_chat"))
    with pytest.raises(ValueError, match="needs capacity.num_requests"):
        SimulatedService(
            capacity_cfg("capacity.variable=concurrency", "capacity.num_requests=null")
        )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["capacity.mode=veeksha", "capacity.start=10", "capacity.upper=2"], "must be >= capacity"),
        (
            ["capacity.mode=evalscope", "capacity.start=10", "capacity.upper=2"],
            "must be >= capacity",
        ),
        (["capacity.mode=evalscope", "capacity.start=4", "capacity.lower=8"], "capacity.lower"),
        (["capacity.mode=etalon", "capacity.upper=50"], "not used by capacity.mode=etalon"),
        (["capacity.mode=etalon", "capacity.start=0"], "capacity.start must be > 0"),
        (["capacity.mode=veeksha", "capacity.start=-1"], "capacity.start must be > 0"),
        (["capacity.variable=concurrency", "capacity.start=2.5"], "whole number of users"),
        (["capacity.mode=veeksha", "capacity.precision=-1"], "capacity.precision"),
        (["capacity.mode=etalon", "capacity.max_iterations=0"], "capacity.max_iterations"),
    ],
)
def test_capacity_bounds_are_checked_in_every_mode_before_any_probe(overrides, message):
    cfg = capacity_cfg(*overrides)
    with pytest.raises(ConfigError, match=message):
        capacity_search(cfg)


def test_a_search_failing_at_its_lower_bound_says_what_to_try(tmp_path):
    history = [Probe(2, False, {"p99_ttft": 9.0}), Probe(1, False, {"p99_ttft": 4.0})]
    failed = SearchResult("p99_ttft <= 2", "rate", None, "Failed at lower bound (1)", history)
    found = SearchResult("p99_ttft <= 9", "rate", 2, "Satisfied", history)
    (hint,) = lower_bound_hints([failed, found], OmegaConf.create({"lower": 1}))
    assert "fails even at 1 request/s" in hint and "capacity.variable=concurrency" in hint
    users = dataclasses.replace(failed, variable="concurrency")
    (hint,) = lower_bound_hints([users], OmegaConf.create({"lower": 1}))
    assert "cannot meet it at any load" in hint
    write_results([failed, found], tmp_path, "evalscope", "a test run")
    assert (tmp_path / "capacity_search.png").stat().st_size > 0


@pytest.mark.parametrize("override", ["compare_with=fcfs", "replications=3", "pictures=false"])
def test_a_key_the_capacity_search_never_reads_is_refused_not_ignored(tmp_path, override):
    import subprocess

    from conftest import BIN

    res = subprocess.run(
        [str(BIN / "fairsim-capacity"), override, f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr[-2000:]
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in res.stderr
    assert lines[0].startswith(f"fairsim-capacity: error: {override.split('=')[0]}: ")
