import numpy as np
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf
from test_vtc_artifact_logs import fcfs_router_fit, log_path, router_timings

from conftest import ROOT, a10g_cost, random_trace, shared_file
from cost_models import ConstantStepCost, LinearStepCost, ProfileError, TableStepCost
from cost_models.profiles import (
    RouterTimings,
    centred_on_runs,
    fit_router_timings,
    fit_vtc_profile,
    vtc_profile_table,
)
from policies import FCFS
from simulator.apps.papers.vtc_tables import ARTIFACT_SPEED_CENTRE, artifact_log_requests
from simulator.engines import simulate
from simulator.engines.slora import SLoRAConfig


def test_a10g_defaults_land_on_the_published_speed_facts():
    cost = a10g_cost()
    kernel = LinearStepCost(**{**vars(cost), "step_overhead": 0.0})
    # the speeds the VTC artifact's A10G profile measured, with about ±7% around them:
    # prefill about 4,600 tokens/s
    rate = 2048 / kernel.prefill_time(np.array([256] * 8))
    assert 4300 < rate < 4900
    # decode steps of 36-40 ms at batch 13-38 with contexts of 256-768 tokens per request
    for batch, ctx in [(13, 640), (19, 384), (38, 162)]:  # profiled (I + O/2) points
        t = kernel.decode_times(batch, np.array([batch * ctx]))[0]
        assert 0.033 < t < 0.042, (batch, ctx, t)


def test_conf_coefficients_are_the_documented_fit_of_the_profile():
    fitted = fit_vtc_profile(shared_file("vtc/cost_profile.json"))
    conf = OmegaConf.load(ROOT / "conf/cost_model/a10g_llama7b.yaml")
    for name in (
        "prefill_per_token",
        "prefill_per_request",
        "decode_base",
        "decode_per_seq",
        "decode_per_context_token",
    ):
        assert conf[name] == pytest.approx(getattr(fitted, name), rel=1e-12), name


def test_artifact_cost_model_is_the_router_fit_of_the_artifacts_fcfs_logs_at_one_speed():
    """Every in-loop term is the router fit of the two FCFS runs times one factor (the speed
    `centred_on_runs` sets: the slow test in tests/test_vtc_artifact_logs.py recomputes it)."""
    fitted = fcfs_router_fit()
    conf = OmegaConf.load(ROOT / "conf/cost_model/a10g_llama7b_artifact.yaml")
    terms = [name for name in vars(fitted) if name != "frontend_latency"]
    factors = {name: conf.get(name, 0.0) / getattr(fitted, name) for name in terms
               if getattr(fitted, name)}  # fmt: skip
    assert len(factors) == 6 and all(conf.get(name, 0.0) == 0.0 for name in terms
                                     if name not in factors)  # fmt: skip
    factor = factors["decode_base"]
    assert round(factor, 5) == ARTIFACT_SPEED_CENTRE  # < 1: both FCFS runs went slower than most
    for name, value in factors.items():
        assert value == pytest.approx(factor, rel=1e-12), name
    # the prefill terms are the kernel fit's; the loop costs tens of ms per step end to end
    assert (fitted.prefill_per_token, fitted.prefill_per_request) == (
        a10g_cost().prefill_per_token,
        a10g_cost().prefill_per_request,
    )
    assert 0.02 < fitted.step_overhead + fitted.decode_base < 0.04


def light_load_ttft_excess(measured, simulated) -> np.ndarray:
    """Request by request (one trace: the same rows in arrival order), measured minus simulated
    time to first token, of the completed requests the simulation serves within 0.1 s of their
    send (no queue: the step under way and their own prefill)."""
    a = measured.sort_values("arrival", kind="stable")
    s = simulated.sort_values("arrival", kind="stable")
    np.testing.assert_array_equal(a.arrival.to_numpy(), s.arrival.to_numpy())
    ttft_a = (a.first_token_at - a.arrival).to_numpy()
    ttft_s = (s.first_token_at - s.arrival).to_numpy()
    done = (a.status.to_numpy() == "completed") & (s.status.to_numpy() == "completed")
    light = done & (ttft_s < 0.1)
    return ttft_a[light] - ttft_s[light]


@pytest.mark.slow
def test_artifact_front_end_is_the_fcfs_real_runs_first_token_excess_at_light_load():
    """`frontend_latency` of the artifact's cost model: the median of what the artifact's FCFS
    run of the real trace (a run the router fit reads) takes to a first token beyond fairsim's
    without a front end, over the requests fairsim serves at once. The excess is there in every
    logged run of the real trace, about 45-70 ms: time outside the engine loop."""
    from simulator.api import compose_config, simulate_config
    from simulator.apps.papers.vtc_tables import ROWS

    conf = OmegaConf.load(ROOT / "conf/cost_model/a10g_llama7b_artifact.yaml")
    excess = {}
    for row in (r for r in ROWS if r.table == "2"):
        cfg = compose_config([*row.overrides, "cost_model.frontend_latency=0"])
        simulated = simulate_config(cfg).requests_frame()
        excess[row.label] = light_load_ttft_excess(
            artifact_log_requests(log_path(row))[0], simulated
        )
    assert float(np.median(excess["FCFS"])) == pytest.approx(conf.frontend_latency, rel=1e-9)
    assert len(excess["FCFS"]) > 50
    for label, gaps in excess.items():
        assert len(gaps) > 50 and 0.04 < np.median(gaps) < 0.08, label


@pytest.mark.parametrize("seed, rate", [(1, 3.0), (2, 6.0)])
def test_router_fit_predicts_the_step_times_of_a_router_simulated_with_a_known_cost(seed, rate):
    # a known cost behind FCFS on the S-LoRA router; the fit sees only each request's times
    true = LinearStepCost(
        decode_base=0.012,
        decode_per_seq=2e-4,
        decode_per_context_token=1.5e-6,
        prefill_per_token=2e-4,
        prefill_per_request=5e-4,
        step_overhead=0.02,
    )
    tr = random_trace(seed=seed, n=400, clients=4, max_prompt=600, max_output=300, rate=rate)
    tl = simulate(tr, FCFS(), true, SLoRAConfig(pool_tokens=20_000))
    fit = fit_router_timings([router_timings(tl.requests_frame())], true)
    steps = {k: np.asarray(v) for k, v in tl.steps.items()}
    decode = steps["kind"] == 1
    batch, ctx = steps["batch_size"], steps["kv_used"]

    def decode_times(c):
        return np.array([c.decode_time(int(b), int(x)) for b, x in zip(batch[decode], ctx[decode])])

    def prefill_times(c):
        per_request = c.prefill_per_request * batch[~decode]
        return c.step_overhead + per_request + c.prefill_per_token * steps["num_tokens"][~decode]

    assert decode.sum() > 1000 and (~decode).sum() > 100
    assert np.mean(np.abs(decode_times(fit) / decode_times(true) - 1)) < 0.04
    assert np.mean(np.abs(prefill_times(fit) / prefill_times(true) - 1)) < 0.12
    busy = decode_times(fit).sum() + prefill_times(fit).sum()
    assert busy == pytest.approx(decode_times(true).sum() + prefill_times(true).sum(), rel=0.01)


def test_router_fit_needs_requests_with_decode_steps():
    one = RouterTimings(*(np.array([v]) for v in (0.0, 0.1, 0.2, 10, 2)))
    with pytest.raises(ProfileError, match="3 or more output tokens"):
        fit_router_timings([one], a10g_cost())


def test_linear_model_is_elementwise_and_validates():
    cost = a10g_cost()
    ctx = np.array([100, 5000, 9000])
    many = cost.decode_times(20, ctx)
    one_by_one = [cost.decode_times(20, ctx[i : i + 1])[0] for i in range(3)]
    assert many.tolist() == one_by_one
    assert [cost.decode_time(20, int(c)) for c in ctx] == one_by_one  # the one-step path
    assert ConstantStepCost(0.1, 0.02).decode_time(5, 100) == 0.02
    with pytest.raises(ValueError, match="decode_base"):
        LinearStepCost(
            decode_base=-1, decode_per_seq=0, decode_per_context_token=0, prefill_per_token=1e-4
        )


def write_profile(path, rows):
    path.write_text(
        "phase,batch_size,tokens,seconds\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n"
    )


def test_table_model_interpolates_and_extrapolates(tmp_path):
    # decode = 0.01 + 0.001 * b + 1e-6 * ctx on a grid; prefill = 1e-4 * tokens
    rows = [("prefill", 1, t, 1e-4 * t) for t in (100, 1000, 2000)]
    rows += [
        ("decode", b, c, 0.01 + 0.001 * b + 1e-6 * c)
        for b in (1, 10, 50)
        for c in (100, 5000, 20000)
    ]
    p = tmp_path / "profile.csv"
    write_profile(p, rows)
    m = TableStepCost(p)
    assert m.prefill_time(np.array([250, 250])) == pytest.approx(0.05)
    assert m.prefill_time(np.array([3000])) == pytest.approx(0.3)  # end segment extrapolated
    inside = m.decode_times(20, np.array([8000.0, 12000.0]))
    np.testing.assert_allclose(inside, 0.01 + 0.02 + 1e-6 * np.array([8000, 12000]))
    outside = m.decode_times(200, np.array([50000.0]))  # beyond the grid: the fitted plane
    assert outside[0] == pytest.approx(0.01 + 0.2 + 0.05)
    assert [m.decode_time(20, 8000), m.decode_time(200, 50000)] == [inside[0], outside[0]]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("phase,batch_size,seconds\nprefill,1,0.1\n", "missing column"),
        (
            "phase,batch_size,tokens,seconds\nprefill,1,10,abc\ndecode,1,1,0.1\n",
            "line 2, field 'seconds'",
        ),
        (
            "phase,batch_size,tokens,seconds\nprefil,1,10,0.1\ndecode,1,1,0.1\n",
            "line 2, field 'phase'",
        ),
        ("phase,batch_size,tokens,seconds\nprefill,1,10,0.1\n", "no 'decode' rows"),
    ],
)
def test_bad_profiles_name_file_row_and_field(tmp_path, text, message):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(ProfileError, match=message):
        TableStepCost(p)


def test_vtc_profile_as_a_table_model_matches_its_points(tmp_path):
    table = vtc_profile_table(shared_file("vtc/cost_profile.json"))
    p = tmp_path / "vtc.csv"
    table.to_csv(p, index=False)
    m = instantiate({"_target_": "cost_models.TableStepCost", "path": str(p)})
    dec = table[table.phase == "decode"]
    got = [m.decode_times(int(b), np.array([t]))[0] for b, t in zip(dec.batch_size, dec.tokens)]
    np.testing.assert_allclose(got, dec.seconds, rtol=1e-9)


def test_centring_on_runs_scales_every_in_loop_term_by_the_geometric_mean_speed():
    cost = LinearStepCost(
        decode_base=0.01,
        decode_per_seq=1e-4,
        decode_per_context_token=1e-6,
        prefill_per_token=2e-4,
        prefill_per_request=5e-4,
        prefill_base=1e-3,
        prefill_per_token_sq=1e-9,
        step_overhead=0.02,
        frontend_latency=0.05,
    )
    centred = centred_on_runs(cost, [0.98, 1.02, 0.97])
    factor = (0.98 * 1.02 * 0.97) ** (1 / 3)
    for name, value in vars(cost).items():
        expected = value if name == "frontend_latency" else value * factor
        assert getattr(centred, name) == pytest.approx(expected, rel=1e-12), name
    # a step takes the factor's share of its time; the front end lies outside the loop
    assert centred.decode_time(8, 4000) == pytest.approx(factor * cost.decode_time(8, 4000))
    assert centred_on_runs(cost, [1.0, 1.0]) == cost
    for bad in ([], [1.0, 0.0], [-1.0]):
        with pytest.raises(ProfileError, match="speeds must be positive"):
            centred_on_runs(cost, bad)
