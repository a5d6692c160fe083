"""Trace transforms keep what they claim (order, counts, rate after scaling within 1%), and the
built-in tenant mixes match the published facts they approximate."""

import numpy as np
import pytest
from hydra.utils import instantiate

from conftest import shared_file
from simulator.api import compose_config
from traces import (
    AssignClients,
    FilterLengths,
    SampleRescale,
    ScaleTokens,
    ScaleToRate,
    Tenants,
    Trace,
    Window,
    arena_like,
    merge,
    servegen_like,
)
from traces.mixes import ARENA_COUNTS
from traces.transforms import mean_rate


def poisson_trace(n=2000, rate=4.0, seed=0, clients=("a",)):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    return Trace.from_columns(
        client=rng.choice(list(clients), n),
        client_names=list(clients),
        arrival=t,
        prompt_len=rng.integers(1, 20000, n),
        output_len=rng.integers(1, 2000, n),
        source="test",
    )


def test_window_keeps_the_interval_in_order_and_shifts_it():
    tr = poisson_trace()
    out = Window(100.0, 200.0).apply(tr)
    inside = (tr.arrival >= 100) & (tr.arrival < 200)
    assert len(out) == inside.sum()
    assert np.allclose(out.arrival, tr.arrival[inside] - 100.0)
    assert np.array_equal(out.request_id, tr.request_id[inside])
    assert f"dropped {len(tr) - inside.sum()} of {len(tr)}" in out.source
    assert np.array_equal(Window(100.0, 200.0, shift=False).apply(tr).arrival, tr.arrival[inside])
    with pytest.raises(ValueError, match="leaves no requests"):
        Window(1e9, 2e9).apply(tr)


@pytest.mark.parametrize("target", [0.5, 3.0, 40.0])
def test_scale_to_rate_hits_the_target_and_keeps_everything_else(target):
    tr = poisson_trace()
    out = ScaleToRate(target).apply(tr)
    assert mean_rate(out) == pytest.approx(target, rel=0.01)
    assert np.array_equal(out.prompt_len, tr.prompt_len) and len(out) == len(tr)
    gaps, old = np.diff(out.arrival), np.diff(tr.arrival)
    assert np.allclose(gaps / old, gaps[0] / old[0])  # one stretch factor: shape kept


def test_sample_rescale_is_the_vtc_method():
    tr = poisson_trace(n=5000)
    out = SampleRescale(rate=2.5, duration=600.0).apply(tr, np.random.default_rng(1))
    assert len(out) == 1500
    assert out.arrival[0] == 0.0 and out.arrival[-1] == pytest.approx(600.0)
    assert np.all(np.diff(out.request_id) > 0)  # a subset, in the original order
    assert set(out.request_id.tolist()) <= set(tr.request_id.tolist())
    again = SampleRescale(rate=2.5, duration=600.0).apply(tr, np.random.default_rng(1))
    assert np.array_equal(again.request_id, out.request_id)
    with pytest.raises(ValueError, match="needs 2 <= rate \\* duration <= 5000"):
        SampleRescale(rate=100, duration=600).apply(tr)


def test_scale_tokens_rounds_and_keeps_at_least_one():
    tr = Trace.from_columns(
        client=["a"] * 4, arrival=[0, 1, 2, 3], prompt_len=[1, 4, 12, 800], output_len=[3, 4, 5, 8]
    )
    out = ScaleTokens(prompt=0.125, output=0.125).apply(tr)  # FairServe's 1/8
    assert out.prompt_len.tolist() == [1, 1, 2, 100]
    assert out.output_len.tolist() == [1, 1, 1, 1]


def test_scale_tokens_scales_the_tokens_each_prefix_block_id_covers():
    # two 640-token prompts of ten 64-token ids; the second shares the first five (half)
    ids = [np.arange(10), np.r_[np.arange(5), np.arange(10, 15)]]
    tr = Trace.from_columns(
        client=["a", "b"],
        arrival=[0, 1],
        prompt_len=[640, 640],
        output_len=[4, 4],
        block_hashes=ids,
        hash_block_tokens=64,
    )
    out = ScaleTokens(prompt=0.125).apply(tr)
    assert out.hash_block_tokens == 8 and out.prompt_len.tolist() == [80, 80]
    covered = [len(h) * out.hash_block_tokens for h in out.block_hashes]
    assert covered == out.prompt_len.tolist(), "the ids still cover each whole prompt"
    assert ScaleTokens(prompt=0.3).apply(tr).hash_block_tokens == 19  # 64 * 0.3 = 19.2
    assert ScaleTokens(prompt=0.001).apply(tr).hash_block_tokens == 1
    plain = Trace.from_columns(client=["a"], arrival=[0], prompt_len=[640], output_len=[4])
    assert ScaleTokens(prompt=0.125).apply(plain).hash_block_tokens == plain.hash_block_tokens


def test_etalon_filter_drops_or_caps_long_requests():
    tr = poisson_trace()
    f = FilterLengths(prompt_below=16384, output_below=1024)
    out = f.apply(tr)
    keep = (tr.prompt_len < 16384) & (tr.output_len < 1024)
    assert len(out) == keep.sum() and np.array_equal(out.request_id, tr.request_id[keep])
    assert out.prompt_len.max() < 16384 and out.output_len.max() < 1024
    assert f"dropped {(~keep).sum()} of {len(tr)}" in out.source
    capped = FilterLengths(prompt_below=16384, output_below=1024, cap=True).apply(tr)
    assert len(capped) == len(tr) and capped.output_len.max() == 1023


def test_assign_clients_zipf_explicit_and_heavy_tail_shares():
    tr = poisson_trace(n=20000)
    z = AssignClients("zipf", num_clients=4, alpha=1.0).apply(tr, np.random.default_rng(0))
    expected = (1 / np.arange(1, 5)) / (1 / np.arange(1, 5)).sum()
    assert np.allclose(np.bincount(z.client) / len(z), expected, atol=0.01)
    s = AssignClients("shares", shares={"big": 3, "small": 1}).apply(tr)
    assert s.client_names == ("big", "small")
    assert np.bincount(s.client)[0] / len(s) == pytest.approx(0.75, abs=0.01)
    h = AssignClients("heavy_tail", num_clients=30, alpha=1.1).apply(tr, np.random.default_rng(2))
    shares = np.sort(np.bincount(h.client, minlength=30))[::-1] / len(h)
    assert shares[:3].sum() > 0.3  # a few clients carry much of the load
    assert np.array_equal(h.arrival, tr.arrival)
    with pytest.raises(ValueError, match="mode: got 'even'"):
        AssignClients("even").apply(tr)


def test_merge_makes_tenants_and_keeps_every_request_in_time_order():
    a, b = poisson_trace(300, seed=1), poisson_trace(200, seed=2, clients=("x", "y"))
    m = merge({"chat": a, "batch": b})
    assert len(m) == 500 and m.client_names == ("chat", "batch/x", "batch/y")
    assert np.all(np.diff(m.arrival) >= 0)
    assert sorted(m.arrival.tolist()) == sorted([*a.arrival.tolist(), *b.arrival.tolist()])
    assert np.bincount(m.client)[0] == 300
    assert m.request_id.tolist() == list(range(500))


def test_tenants_workload_merges_parts_with_their_own_seeds():
    w = Tenants({"arena": arena_like(2.5, 100.0), "pool": servegen_like(5, 2.0, 100.0)})
    t = w.build(3)
    assert t.num_clients == 27 + 5
    assert np.array_equal(w.build(3).arrival, t.arrival)


def test_arena_like_matches_the_vtc_real_trace_facts():
    t = arena_like(total_rate=50.0, duration=600.0).build(0)
    shares = np.bincount(t.client, minlength=27) / len(t)
    expected = np.array(ARENA_COUNTS) / sum(ARENA_COUNTS)
    assert np.allclose(shares, expected, atol=0.005)
    assert np.median(t.prompt_len) == pytest.approx(40, abs=3)
    assert t.prompt_len.mean() == pytest.approx(136, rel=0.05)
    assert np.median(t.output_len) == pytest.approx(211, abs=8)
    assert t.output_len.mean() == pytest.approx(256, rel=0.05)
    assert t.prompt_len.max() <= 1023 and t.output_len.max() <= 1023


def test_servegen_like_pool_is_fixed_by_pool_seed_and_heavy_tailed():
    a, b = servegen_like(pool_seed=4), servegen_like(pool_seed=4)
    assert a == b and a != servegen_like(pool_seed=5)
    rates = np.array([c.arrival.mean_rate(600) for c in a.clients])
    assert rates.sum() == pytest.approx(5.0)
    assert rates[0] > 5 * np.median(rates)


@pytest.mark.parametrize("name", ["arena_like", "servegen_like"])
def test_builtin_mixes_are_workload_configs(name):
    cfg = compose_config([f"workload={name}", "workload.duration=60"])
    trace = instantiate(cfg.workload, _convert_="all").build(0)
    assert len(trace) > 10


@pytest.mark.parametrize(
    "suite, data",
    [
        ("conversation", "etalon_lengths/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"),
        (
            "summarization",
            "etalon_lengths/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
        ),
        ("translation", "etalon_lengths/bwb_stats_llama2_tokenizer_filtered_v2.csv"),
        ("coding", "azure2023/code.csv"),
    ],
)
def test_etalon_suite_configs_with_the_recommended_filter(suite, data):
    shared_file(data)  # skips without ../shared/data
    plain = compose_config([f"experiment=etalon_{suite}"])
    filtered = compose_config([f"experiment=etalon_{suite}", "length_filter=etalon"])
    assert plain.workload.filter is None and filtered.engine.batch_max_tokens == 16384
    trace = instantiate(filtered.workload, _convert_="all").build(0)
    assert trace.prompt_len.max() < 16384 and trace.output_len.max() < 1024
