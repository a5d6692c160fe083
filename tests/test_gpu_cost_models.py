"""GPU cost models (cost_models/hardware.py, roofline.py, vidur_profile.py) against the published
architectures, physical limits (the vendors' data sheets) and one measurement of a
Llama-2-7B-shaped layer on an H100 (tests/data/h100_llama2_7b_timings.json, made by
benchmarks/gpu_layer_timings.py)."""

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import shared_file
from cost_models import MODELS, RooflineCost, VidurProfileCost
from policies import FCFS
from simulator.engines import SLoRAConfig, simulate
from traces import Trace

MEASURED = json.loads((Path(__file__).parent / "data" / "h100_llama2_7b_timings.json").read_text())
GIB = 1024**3


def test_presets_match_the_published_parameter_counts():
    published = {"llama-2-7b": 6.74e9, "llama-2-13b": 13.0e9, "llama-2-70b": 69.0e9,
                 "llama-3-8b": 8.03e9}  # fmt: skip
    for name, params in published.items():
        assert MODELS[name].params == pytest.approx(params, rel=0.01)
    assert MODELS["llama-2-7b"].kv_bytes_per_token == 2 * 32 * 4096 * 2  # 0.5 MiB, no GQA
    assert MODELS["llama-2-70b"].kv_bytes_per_token == 2 * 80 * 8 * 128 * 2  # GQA: 8 KV heads


def test_kv_capacity_is_memory_less_weights():
    r = RooflineCost("llama-2-7b", "a10g")
    free = 24 * GIB * 0.9 - MODELS["llama-2-7b"].weight_bytes - 2 * GIB
    assert r.kv_capacity_tokens() == int(free // (512 * 1024))
    assert 10_000 < r.kv_capacity_tokens() < 20_000  # the VTC paper's A10G pool was 10,000
    tp2 = RooflineCost("llama-2-70b", "h100", tp=2)
    assert tp2.kv_capacity_tokens() > 0
    with pytest.raises(ValueError, match="does not fit"):
        RooflineCost("llama-2-70b", "a10g").kv_capacity_tokens()


def test_physical_limits_bound_every_step():
    for gpu, bw, peak in (("a10g", 600e9, 125e12), ("a100-80gb", 2.0e12, 312e12),
                          ("h100", 3.35e12, 989e12)):  # fmt: skip
        r = RooflineCost("llama-2-7b", gpu)
        m = r.model_spec
        assert r.decode_time(1, 100) > m.weight_bytes / bw  # decode reads every weight
        assert r.prefill_time(np.array([2000])) > 2 * m.params * 2000 / peak
        ctx = np.array([1_000, 10_000, 100_000])
        np.testing.assert_array_equal(  # element-wise, as the engine's fast-forward needs
            r.decode_times(32, ctx), [r.decode_time(32, int(c)) for c in ctx]
        )


def test_roofline_lands_near_an_h100_measurement():
    """Where a step is bound by compute or bandwidth (not kernel launches), within 15%."""
    r = RooflineCost("llama-2-7b", "h100")
    for tokens in (512, 1024, 2048, 4096):
        measured = MEASURED["linear_ms"][str(tokens)] / 1e3
        assert float(r.linear_time(tokens)) == pytest.approx(measured, rel=0.15)
    for key in ("32,512", "32,2048", "128,1024"):
        b, c = map(int, key.split(","))
        measured = MEASURED["decode_attention_ms"][key] / 1e3
        assert float(r.attention_time(b * c, b * c, 0)) == pytest.approx(measured, rel=0.2)
    # a single token is launch-bound on a real GPU: the roofline is a lower bound there
    assert float(r.linear_time(1)) < MEASURED["linear_ms"]["1"] / 1e3


def test_vidur_profile_matches_the_same_measurement():
    shared_file("vidur_profiles/compute/h100/Llama-2-7b-hf/mlp.csv")
    v = VidurProfileCost("llama-2-7b", "h100")
    for tokens in (512, 1024, 2048, 4096):
        measured = MEASURED["linear_ms"][str(tokens)] / 1e3
        assert float(v.token_level_time(tokens)) == pytest.approx(measured, rel=0.1)
    # beyond the profiled 4,096 tokens it scales in proportion
    assert float(v.token_level_time(8192)) == pytest.approx(2 * float(v.token_level_time(4096)))
    tp2 = VidurProfileCost("llama-2-7b", "h100", tp=2)
    assert float(tp2.token_level_time(4096)) < 0.7 * float(v.token_level_time(4096))
    assert tp2.decode_time(32, 16_000) > float(tp2.token_level_time(32))  # + all-reduce etc.
    with pytest.raises(ValueError, match="no rows"):
        VidurProfileCost("llama-2-7b", "h100", tp=3)


def test_bad_descriptions_are_named():
    with pytest.raises(ValueError, match="cost_model.model='gpt-5': accepted: a preset"):
        RooflineCost("gpt-5", "h100")
    with pytest.raises(
        ValueError, match="cost_model.gpu='tpu': accepted: a100-40gb, a100-80gb, a10g, b200"
    ):
        RooflineCost("llama-2-7b", "tpu")
    with pytest.raises(ValueError, match=r"cost_model.gpu=\[1, 2\]: accepted"):  # a fuzzed list
        RooflineCost("llama-2-7b", [1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="link bandwidth"):
        RooflineCost("llama-2-7b", "a10g", tp=2)
    with pytest.raises(ValueError, match="compute_efficiency"):
        RooflineCost(compute_efficiency=1.5)


def test_the_engine_runs_on_a_roofline_model():
    cost = RooflineCost("llama-2-7b", "h100")
    tr = Trace.from_columns(
        client=["a"] * 4, arrival=[0.0, 0.0, 1.0, 1.0], prompt_len=[500] * 4, output_len=[50] * 4
    )
    tl = simulate(tr, FCFS(), cost, SLoRAConfig(pool_tokens=cost.kv_capacity_tokens()))
    assert (tl.requests_frame()["status"] == "completed").all()
    ttft = tl.first_token_at[0] - tr.arrival[0]
    assert ttft == pytest.approx(cost.prefill_time(np.array([500, 500])))
