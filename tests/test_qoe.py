"""Latency conventions, percentile rules, Andes QoE, goodput, SLOs, the prefill curve and the
Veeksha-compatible files (docs/metrics.md §1, 3, 6, 7)."""

import gzip
import json
import math

import numpy as np
import pandas as pd
import pytest

from conftest import a10g_cost
from cost_models import LinearStepCost
from policies import FCFS, VTC
from simulator.api.prefill_profile import profile_prefill
from simulator.api.run import score_qoe, write_run_with_qoe
from simulator.engines import simulate
from simulator.metrics import latency
from simulator.metrics.prefill_curve import fit_prefill_curve
from simulator.metrics.qoe import QoEConfig, qoe_summary, request_values
from simulator.metrics.slo import SLO, evaluate_slos, parse_slos
from simulator.report.background import Worker
from simulator.report.blockwise import QoESetup
from simulator.report.run_folder import run_tables
from simulator.report.veeksha import prepare_plots
from traces import ClientSpec, Fixed, Poisson, SyntheticWorkload, Uniform


def tables(itt_lists, prompts=None, arrivals=None):
    """requests/tokens tables for completed requests with the given inter-token lists."""
    n = len(itt_lists)
    arrivals = arrivals if arrivals is not None else [10.0 * i for i in range(n)]
    prompts = prompts if prompts is not None else [8] * n
    req_rows, tok_rows = [], []
    for i, itt in enumerate(itt_lists):
        times = arrivals[i] + np.cumsum(itt)
        req_rows.append(
            {
                "request_id": i,
                "client": f"c{i % 2}",
                "arrival": arrivals[i],
                "prompt_len": prompts[i],
                "output_len": len(itt),
                "status": "completed",
                "admitted_at": arrivals[i],
                "finished_at": times[-1],
                "tokens_emitted": len(itt),
            }
        )
        tok_rows += [{"request_id": i, "index": k, "time": t} for k, t in enumerate(times)]
    return pd.DataFrame(req_rows), pd.DataFrame(tok_rows)


def test_veeksha_reference_vector_in_every_convention():
    req, tok = tables([[0.5] + [0.15] * 10])
    for convention in latency.CONVENTIONS:
        lat = latency.per_request_latency(req, tok, convention).iloc[0]
        assert lat.ttft == pytest.approx(0.5)
        assert lat.e2e == pytest.approx(2.0)
        assert lat.tpot == pytest.approx(0.15)
        assert lat.normalized_e2e == pytest.approx(2.0 / 11)
        assert lat.output_throughput == pytest.approx(11 / 2.0)


def test_tpot_conventions_differ_on_one_token_requests_and_etalon_averages_gaps():
    req, tok = tables([[0.3], [0.1, 0.2, 0.4]])
    tpot = {c: latency.per_request_latency(req, tok, c).tpot.tolist() for c in latency.CONVENTIONS}
    assert math.isnan(tpot["vllm"][0])  # vLLM drops one-token requests
    assert tpot["veeksha"][0] == tpot["evalscope"][0] == tpot["etalon"][0] == 0.0
    assert tpot["vllm"][1] == pytest.approx(0.3)  # (t_n - t_1)/(n - 1) = 0.6 / 2
    assert tpot["etalon"][1] == pytest.approx(np.mean([0.2, 0.4]))
    with pytest.raises(ValueError, match="convention"):
        latency.per_request_latency(req, tok, "tgi")


def test_percentile_rules():
    v = np.array([0.011, 0.022, 0.033, 0.044, 0.055, 0.066, 0.077, 0.088, 0.099, 0.111])
    assert latency.percentile(v, 90) == pytest.approx(np.percentile(v, 90))
    # EvalScope 1.14.1's calculate_percentiles on the same list gives {0: 0.011, 50: 0.055,
    # 90: 0.099, 99: 0.111, 100: 0.111} (nearest rank ceil(n p / 100), 4 decimals)
    want = {0: 0.011, 50: 0.055, 90: 0.099, 99: 0.111, 100: 0.111}
    assert {p: latency.percentile(v, p, "evalscope") for p in want} == want
    assert latency.percentile(np.array([0.12345678, 1.5]), 50, "evalscope") == 0.1235
    assert math.isnan(latency.percentile(np.array([]), 50))
    with pytest.raises(ValueError, match="method"):
        latency.percentile(v, 50, "ddsketch")


def test_andes_qoe_is_one_when_tokens_beat_the_reading_pace_and_falls_with_a_late_start():
    fast, _ = [0.5] + [0.1] * 9, None  # 10 tok/s > 5 tok/s reading speed, TTFT 0.5 < 1 s
    req, tok = tables([fast, [3.0] + [0.1] * 9])
    qoe = latency.andes_qoe(req, tok, expected_ttft=1.0, reading_speed=5.0)
    assert qoe.iloc[0] == pytest.approx(1.0)
    # Second: first token 2 s late; the user then reads at 0.2 s/token, so every token is 2 s
    # behind the expected timeline: delay 10 * 2, whole = sum(3 + 0.2 i) for i = 0..9.
    whole = sum(3.0 + 0.2 * i for i in range(10))
    assert qoe.iloc[1] == pytest.approx(1 - 20.0 / whole)
    with pytest.raises(ValueError, match="reading_speed"):
        latency.andes_qoe(req, tok, reading_speed=0)


def test_andes_qoe_scored_in_blocks_of_requests_is_the_qoe_scored_at_once():
    from simulator.metrics import fluidity

    rng = np.random.default_rng(3)
    lists = [rng.exponential(0.3, rng.integers(1, 30)) for _ in range(40)]
    req, tok = tables(lists)
    whole = latency.andes_qoe(req, tok)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(fluidity, "BLOCK_VALUES", 17)  # 40 requests of 1..29 tokens: many blocks
        blocked = latency.andes_qoe(req, tok)
    pd.testing.assert_series_equal(blocked, whole, check_exact=True)


def test_tokens_of_every_request_is_the_frame_itself_and_a_subset_otherwise():
    req, tok = tables([[0.5, 0.1], [0.2, 0.3, 0.4]])
    assert latency.tokens_of(tok, req.request_id) is tok
    first = latency.tokens_of(tok, [0])
    assert first.request_id.tolist() == [0, 0]


def test_tbt_values_are_each_requests_own_gaps_in_request_order():
    lists = [[0.5, 0.1, 0.2], [0.3], [0.25, 0.05]]
    req, tok = tables(lists)
    times = [10.0 * i + np.cumsum(itt) for i, itt in enumerate(lists)]
    want = np.concatenate([np.diff(t) for t in times])
    np.testing.assert_array_equal(latency.tbt_values(tok), want)
    np.testing.assert_array_equal(latency.tbt_samples(tok).tbt.to_numpy(), want)
    assert latency.tbt_samples(tok).request_id.tolist() == [0, 0, 2]


def test_goodput_counts_requests_meeting_every_limit_inclusively():
    req, tok = tables([[0.5] + [0.125] * 4, [0.25], [1.5] + [0.125] * 4], arrivals=[0.0, 1.0, 2.0])
    duration = req.finished_at.max() - 0.0
    assert latency.goodput(req, tok, ttft=0.5) == pytest.approx(2 / duration)  # 0.5 inclusive
    assert latency.goodput(req, tok, tpot=0.125) == pytest.approx(3 / duration)  # one token: 0
    assert latency.goodput(req, tok, ttft=0.5, e2e=0.5) == pytest.approx(1 / duration)


def test_slo_parsing_names_the_entry_and_field():
    with pytest.raises(ValueError, match=r"slos\[0\], field 'metric'.*accepted"):
        parse_slos([{"metric": "latency", "percentile": 0.9, "value": 1}])
    with pytest.raises(ValueError, match=r"slos\[1\], field 'percentile'"):
        parse_slos(
            [
                {"metric": "ttfc", "percentile": 0.9, "value": 1},
                {"metric": "ttfc", "percentile": 99, "value": 1},
            ]
        )
    with pytest.raises(ValueError, match="unknown field"):
        parse_slos([{"metric": "ttfc", "percentile": 0.9, "value": 1, "treshold": 2}])
    (slo,) = parse_slos([{"metric": "ttfc", "percentile": 0.99, "value": 0.5}])
    assert slo.key == "ttfc_p99" and slo.name == "ttfc_p99" and slo.lower_is_better


def test_slo_evaluation_follows_veeksha():
    values = {"ttfc": np.array([0.1, 0.2, 0.3, 0.4, 0.5]), "fluidity": np.array([0.8, 1, 1, 1, 1])}
    slos = [
        SLO("ttfc", 0.5, 0.3),  # observed exactly the threshold: met
        SLO("ttfc", 1.0, 0.45),  # percentile >= 1: the maximum 0.5 > 0.45
        SLO("ttfc", 0.0, 0.1),  # <= 0: the minimum
        SLO("fluidity", 0.9, 0.85),  # 90% of requests reach the 10th percentile, 0.88
        SLO("fluidity", 0.9, 0.9),
        SLO("tbc", 0.99, 1.0),  # no data: not met, observed inf
    ]
    res = evaluate_slos(slos, values)
    met = [r["met"] for r in res["results"]]
    assert met == [True, False, True, True, False, False]
    assert res["results"][3]["observed_value"] == pytest.approx(np.quantile([0.8, 1, 1, 1, 1], 0.1))
    assert res["results"][5]["observed_value"] == math.inf
    assert res["all_slos_met"] is False
    assert set(res["results"][0]) == {
        "met",
        "slo_metric_key",
        "observed_value",
        "threshold",
        "percentile",
        "metric",
        "name",
        "lower_is_better",
    }


def test_prefill_curve_recovers_a_quadratic_cost_and_is_flat_outside_the_profile():
    cost = LinearStepCost(
        decode_base=0.02,
        decode_per_seq=0.0,
        decode_per_context_token=0.0,
        prefill_per_token=1e-4,
        prefill_base=0.01,
        prefill_per_token_sq=2e-9,
    )
    profile = profile_prefill(cost)
    assert list(profile.prompt_len) == [256, 512, 1024, 2048, 4096, 8192, 16384]
    curve = fit_prefill_curve(profile)
    assert curve([3000])[0] == pytest.approx(0.01 + 0.3 + 2e-9 * 9e6, rel=1e-6)
    assert curve([10])[0] == curve([256])[0] and curve([10**6])[0] == curve([16384])[0]
    with pytest.raises(ValueError, match="at least 3"):
        fit_prefill_curve(profile.iloc[:2])


def overload(duration=120.0):
    """The VTC overload suite's shape: a light client (1 req/s) and a heavy one (6 req/s)."""
    return SyntheticWorkload(
        clients=[
            ClientSpec("light", Uniform(1.0), Fixed(256), Fixed(128)),
            ClientSpec("heavy", Uniform(6.0), Fixed(256), Fixed(128)),
        ],
        duration=duration,
    ).build(0)


def test_vtc_protects_the_light_clients_fluidity_where_fcfs_does_not():
    trace = overload()
    cfg = QoEConfig(ttft_deadline=2.0, tbt_deadline=0.1)
    light = {}
    for policy in (FCFS(), VTC()):
        tl = simulate(trace, policy, a10g_cost())
        q = qoe_summary(tl.requests_frame(), tl.tokens_frame(), cfg)
        light[policy.name] = q["fluidity_per_client"]["light"]["mean"]
    assert light["vtc"] > 0.9
    assert light["fcfs"] < 0.5


def test_fluidity_falls_as_load_rises():
    cfg = QoEConfig(ttft_deadline=0.5, tbt_deadline=0.04)
    means = []
    for rate in (0.5, 2.0, 4.0, 8.0):
        trace = SyntheticWorkload(
            clients=[ClientSpec("c", Poisson(rate), Fixed(200), Fixed(100))], duration=200.0
        ).build(1)
        tl = simulate(trace, FCFS(), a10g_cost())
        means.append(qoe_summary(tl.requests_frame(), tl.tokens_frame(), cfg)["fluidity"]["mean"])
    assert all(a >= b for a, b in zip(means, means[1:], strict=False)), means
    assert means[0] > means[-1] + 0.2


@pytest.mark.slow
def test_veeksha_files_and_health_checks(tmp_path):
    trace = SyntheticWorkload(
        clients=[ClientSpec("c", Poisson(1.0), Fixed(16), Fixed(20))], duration=120.0
    ).build(2)
    tl = simulate(trace, FCFS(), a10g_cost())
    req, tok = tl.requests_frame(), tl.tokens_frame()
    slos = parse_slos([{"metric": "ttfc", "percentile": 0.99, "value": 5.0}])
    res = write_metrics_as_a_run_does(tmp_path, tl, slos, 1.0)
    tmp_path = tmp_path / "metrics"
    assert res["all_slos_met"] is True
    with gzip.open(tmp_path / "request_level_metrics.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == len(req)
    r0 = rows[0]
    assert len(r0["tbc"]) == r0["num_output_tokens"] - 1 == 19
    assert r0["ttfc"] == pytest.approx(
        tok.time[tok.request_id == r0["request_id"]].min() - r0["scheduler_dispatched_at"]
    )
    stats = json.loads((tmp_path / "prefill_stats.json").read_text())
    assert stats["groups"]["16"]["count"] == len(req)
    checks = json.loads((tmp_path / "health_check_results.json").read_text())
    assert [c["passed"] for c in checks] == [True, True, True]
    for name in ("ttfc", "tbc", "tpot", "e2e", "normalized_e2e", "fluidity"):
        assert (tmp_path / f"{name}.png").stat().st_size > 0
        row = pd.read_csv(tmp_path / f"{name}.csv")
        assert list(row.columns) == ["p50", "p90", "p95", "p99", "min", "max", "mean"]
    # a configured rate far from the observed one fails the dispatch-rate check
    write_metrics_as_a_run_does(tmp_path / "fast", tl, [], 2.0)
    checks_text = (tmp_path / "fast" / "metrics" / "health_check_results.txt").read_text()
    assert "[FAIL] session_dispatch_rate" in checks_text


def write_metrics_as_a_run_does(folder, timeline, slos, rate) -> dict:
    """The run folder with its Veeksha files under metrics/, written the way `run_config`
    writes them (the plots' child, QoE scoring, the summaries); the summary's slo_results."""
    setup = QoESetup(QoEConfig(), None, slos, rate, veeksha=True)
    tables = run_tables(timeline)
    with Worker(prepare_plots) as plots:
        qoe = score_qoe(setup, tables, folder, plots)
        outputs = write_run_with_qoe(timeline, folder, {}, tables, qoe, "test run", plots)
    return outputs.summary["slo_results"]


@pytest.mark.slow
def test_distribution_statistics_leave_out_nan_and_leave_the_values_untouched(tmp_path):
    """Each distribution's CSV holds numpy's statistics of its non-NaN values, whether or not
    there are NaN among them, and the arrays given are not changed (the plots' child reads
    them from shared memory)."""
    from simulator.report.veeksha import DISTRIBUTION_METRICS, write_distributions

    rng = np.random.default_rng(3)
    clean = rng.exponential(0.05, 1000)
    holed = clean.copy()
    holed[[5, 500, 999]] = np.nan
    for name, given in (("clean", clean), ("holed", holed)):
        values = {metric: given for metric in DISTRIBUTION_METRICS}
        before = given.copy()
        out = tmp_path / name
        out.mkdir()
        write_distributions(out, values)
        np.testing.assert_array_equal(given, before)
        kept = given[~np.isnan(given)]
        row = pd.read_csv(out / "tbc.csv").iloc[0]
        want = dict(zip(("p50", "p90", "p95", "p99"), np.percentile(kept, [50, 90, 95, 99])))
        want |= {"min": kept.min(), "max": kept.max(), "mean": kept.mean()}
        for field, value in want.items():
            assert row[field] == pytest.approx(value, rel=1e-15), (name, field)
        assert (out / "tbc.png").stat().st_size > 0


@pytest.mark.slow
def test_values_equal_but_for_their_last_bits_get_a_distribution_plot(tmp_path):
    """Two requests served alike give E2E times a few ulps apart (a histogram of them failed
    the live server's folder once): their plot is drawn, on a linear axis."""
    from simulator.report.veeksha import DISTRIBUTION_METRICS, write_distributions

    nearly = np.array([0.4, np.nextafter(0.4, 1.0), 0.4])
    write_distributions(tmp_path, {metric: nearly for metric in DISTRIBUTION_METRICS})
    assert pd.read_csv(tmp_path / "e2e.csv").iloc[0]["max"] == nearly.max()
    assert (tmp_path / "e2e.png").stat().st_size > 0


def test_prefill_stats_reference_vector():
    from simulator.report.veeksha import prefill_stats

    groups = prefill_stats(np.array([8, 16, 8, 16]), np.array([0.10, 0.30, 0.20, 0.40]))["groups"]
    assert groups["8"]["mean"] == pytest.approx(0.15)
    assert groups["16"]["mean"] == pytest.approx(0.35)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on inf
def test_prefill_stats_are_numpys_statistics_of_each_group_bit_for_bit():
    """Singletons take a shortcut and pairs of percentiles share a call: every field must still
    be what numpy gives for the group alone (NaN and inf included)."""
    from simulator.report.veeksha import prefill_stats

    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 40, 300)
    ttfc = np.round(rng.exponential(0.2, 300), rng.integers(2, 12))
    ttfc[[3, 50]] = np.nan
    ttfc[[7]] = np.inf
    groups = prefill_stats(lengths, ttfc)["groups"]
    assert sorted(groups, key=int) == [str(n) for n in np.unique(lengths)]
    for n, got in groups.items():
        g = ttfc[lengths == int(n)]
        want = {
            "count": g.size,
            "mean": np.mean(g),
            "median": np.median(g),
            "std": np.std(g),
            "min": np.min(g),
            "max": np.max(g),
            "p90": np.percentile(g, 90),
            "p99": np.percentile(g, 99),
        }
        for field, value in want.items():
            assert got[field] == value or (np.isnan(got[field]) and np.isnan(value)), (n, field)


def test_request_values_cover_every_slo_metric():
    req, tok = tables([[0.2, 0.1, 0.1], [0.3, 0.05]])
    values = request_values(req, tok, QoEConfig())
    assert set(values) == {"ttfc", "tbc", "tpot", "e2e", "normalized_e2e", "fluidity", "miss_rate"}
    assert sorted(values["tbc"]) == pytest.approx([0.05, 0.1, 0.1])
