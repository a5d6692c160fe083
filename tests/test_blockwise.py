"""A run too large for one table (memory_budget_mb) writes its records to disk as it goes and is
scored a block of requests at a time: its run folder must hold what the in-memory path writes.
Each case runs one config twice, with the default budget (one table) and with a budget of a few
hundred tokens (hundreds of blocks, steps and counter events spilled every few hundred rows)."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from simulator.api import compose_config, run_config, simulate_config
from simulator.core.counters import DECODE, CounterLog
from simulator.core.timeline import StepRecorder
from simulator.engines.assemble import ReplicaPart, join_clocks
from simulator.metrics.latency import gaps_within, grouped_tokens
from simulator.metrics.pooled import MEAN_CHUNK, PooledGaps, WeightedValues

TINY_BUDGET = "memory_budget_mb=0.02"  # 327 tokens a block, steps written every 81

CASES = {
    "slora_vtc_with_comparison": ["workload.duration=60"],
    "vllm_cluster_exact_qoe_slos": [
        "engine=vllm",
        "engine.pool_tokens=3000",  # small: preemptions split requests into several runs
        "cluster.replicas=2",
        "workload.duration=60",
        "qoe.ttft_deadline=null",  # the prefill curve's deadline
        "qoe.exact=true",
        "qoe.goodput_ttft=1.0",
        "slos=[{metric: tbc, percentile: 0.9, value: 0.05}, "
        "{metric: fluidity, percentile: 0.99, value: 0.5}]",
    ],
    "fairserve_interactions": ["experiment=fairserve_overload", "workload.duration=30"],
    "horizon_cuts_requests_short": ["engine=vllm", "engine.pool_tokens=3000", "engine.horizon=20"],
    "nothing_completes": ["engine.pool_tokens=100", "workload.duration=10"],
}


def same_values(a: object, b: object, where: str) -> None:
    """Equal, except that a float may differ in its last digits (a mean summed block by
    block): relative 1e-12."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            same_values(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same_values(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-12), where
    else:
        assert a == b, where


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_spilled_run_writes_the_files_and_figures_of_the_in_memory_run(case, tmp_path):
    overrides = [*CASES[case], "progress=false"]
    whole_tl, whole = run_config(compose_config(overrides), tmp_path / "whole")
    blocks_tl, blocks = run_config(compose_config([*overrides, TINY_BUDGET]), tmp_path / "blocks")
    assert whole_tl.step_files is None and blocks_tl.step_files is not None
    if len(whole_tl.token_clock):  # joined on disk, not in memory
        assert isinstance(blocks_tl.token_clock, np.memmap)
    assert np.array_equal(blocks_tl.token_clock, whole_tl.token_clock)
    assert blocks.tokens is None  # nothing per token is held
    a, b = tmp_path / "whole", tmp_path / "blocks"
    assert not (b / ".spill").exists()
    for name in ("requests", "tokens", "steps", "counters"):
        path = f"{name}.parquet"
        assert (a / path).exists() == (b / path).exists(), path
        if (a / path).exists():
            pd.testing.assert_frame_equal(pd.read_parquet(a / path), pd.read_parquet(b / path))
    if len(whole.requests) > 1000:  # the tokens really came in blocks
        assert pq.ParquetFile(b / "tokens.parquet").metadata.num_row_groups > 10
    summaries = [json.loads((f / "summary.json").read_text()) for f in (a, b)]
    for s in summaries:
        s.pop("config"), s.pop("config_digest")
    same_values(*summaries, "summary")
    files = sorted(p.name for p in (a / "metrics").glob("*"))  # none when there is no folder
    assert files == sorted(p.name for p in (b / "metrics").glob("*"))
    for name in files:
        x, y = a / "metrics" / name, b / "metrics" / name
        if name.endswith(".jsonl.gz"):  # the request rows: one gzip member per block here
            assert gzip.decompress(x.read_bytes()) == gzip.decompress(y.read_bytes()), name
        elif name.endswith(".json"):
            same_values(json.loads(x.read_text()), json.loads(y.read_text()), name)
        elif name.endswith(".csv"):
            pd.testing.assert_frame_equal(pd.read_csv(x), pd.read_csv(y), rtol=1e-12)


def test_weighted_values_give_numpys_quantiles_bit_for_bit():
    rng = np.random.default_rng(3)
    for size in (1, 2, 7, 1000):
        distinct = np.sort(rng.exponential(0.05, size).round(rng.integers(2, 9)))
        counts = rng.integers(1, 6, size)
        expanded = np.repeat(distinct, counts)
        w = WeightedValues(distinct, counts)
        for q in (0.0, 0.01, 0.1, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0, *rng.random(20)):
            assert w.quantile(q) == np.quantile(expanded, q)
        for p in (50, 90, 95, 99):
            assert w.percentile(p) == np.percentile(expanded, p)
        assert w.min() == expanded.min() and w.max() == expanded.max()
        assert math.isclose(w.mean(), expanded.mean(), rel_tol=1e-12)


def test_weighted_values_with_uncounted_values_give_the_counted_ones_quantiles():
    """A subset of pooled gaps weights every gap, 0 where the subset has none (at either end
    too): the figures are those of the counted values alone."""
    rng = np.random.default_rng(4)
    for size in (3, 50, 1000):
        distinct = np.sort(rng.exponential(0.05, size).round(rng.integers(2, 9)))
        counts = rng.integers(0, 4, size).astype(np.int32)
        counts[[0, -1]] = 0  # the smallest and largest values are not counted
        counts[size // 2] = 2  # at least one is
        expanded = np.repeat(distinct, counts)
        w = WeightedValues(distinct, counts)
        assert w.size == expanded.size
        for q in (0.0, 0.01, 0.5, 0.99, 1.0, *rng.random(20)):
            assert w.quantile(q) == np.quantile(expanded, q)
        assert w.min() == expanded.min() and w.max() == expanded.max()
        assert math.isclose(w.mean(), expanded.mean(), rel_tol=1e-12)
    nothing = WeightedValues(distinct, np.zeros(size, dtype=np.int32))
    assert nothing.size == 0
    assert all(math.isnan(f) for f in (nothing.min(), nothing.max(), nothing.mean()))
    assert math.isnan(nothing.quantile(0.5))


def test_the_mean_of_more_weighted_values_than_one_chunk_is_their_weighted_average():
    rng = np.random.default_rng(5)
    values = np.sort(rng.exponential(0.05, 2 * MEAN_CHUNK + 12_345))
    counts = rng.integers(0, 5, values.size).astype(np.int32)
    expected = np.dot(values, counts.astype(np.float64)) / counts.sum()
    assert math.isclose(WeightedValues(values, counts).mean(), expected, rel_tol=1e-12)


@pytest.mark.parametrize(
    "overrides",
    [["workload.duration=60"], ["engine=vllm", "engine.pool_tokens=2000", "workload.duration=60"]],
    ids=["slora_prefill_then_decode_runs", "vllm_preempted_runs"],
)
def test_pooled_gaps_from_the_token_clock_are_the_per_token_gaps(overrides):
    tl = simulate_config(compose_config(overrides))
    requests = tl.requests_frame()
    ids, counts, times = grouped_tokens(tl.tokens_frame())
    gaps = gaps_within(times, counts)
    completed = (requests.status == "completed").to_numpy()
    pool = PooledGaps(tl)
    for rows in (np.ones(len(requests), dtype=bool), completed, ~completed):
        mine = np.isin(ids, requests.request_id[rows]).repeat(counts - 1)
        expect = np.sort(gaps[mine])
        got = pool.of(rows)
        assert np.array_equal(np.repeat(got.values, got.counts), expect)
    if "engine=vllm" in overrides:
        assert int(requests.preemptions.sum()) > 0  # runs split by preemption were pooled


def test_counter_events_written_to_disk_come_back_by_time_ties_in_logged_order(tmp_path):
    rng = np.random.default_rng(5)
    names = ["a", "b", "c"]
    memory, spilled = CounterLog(), CounterLog()
    spilled.spill_to(tmp_path / "events.parquet", 17)
    for burst in range(40):  # a cluster replica logs a burst of steps client by client
        steps = np.sort(burst + rng.random(rng.integers(1, 30))).round(1)  # with ties
        for client in range(3):
            values = rng.random(steps.shape[0])
            for log in (memory, spilled):
                log.add_many(steps, client, values, values.cumsum(), DECODE)
        for log in (memory, spilled):
            log.add(float(burst + 0.5), 0, 1.0, 2.0, 0)
    parts: list[pd.DataFrame] = []
    spilled.write_sorted(names, parts.append)
    assert len(parts) > 10
    pd.testing.assert_frame_equal(pd.concat(parts, ignore_index=True), memory.frame(names))
    assert not Path(tmp_path / "events.parquet").exists()


def test_step_records_written_to_disk_are_the_in_memory_records(tmp_path):
    memory, spilled = StepRecorder(), StepRecorder()
    spilled.spill_to(tmp_path / "steps.parquet", 5)
    rng = np.random.default_rng(2)
    t = 0.0
    for i in range(30):
        k = int(rng.integers(1, 4))
        ends = t + np.cumsum(rng.random(k))
        for rec in (memory, spilled):
            rec.record(t, ends, list(range(i, i + k)), i % 3, k + 1, 2 * k, i % 2)
        t = float(ends[-1]) + 0.5
    spilled.close()
    read = pq.read_table(spilled.spill_file()).to_pandas()
    expect = pd.DataFrame(memory.columns())
    pd.testing.assert_frame_equal(read, expect)
    assert pq.ParquetFile(spilled.spill_file()).metadata.num_row_groups > 3
    for key, column in memory.clock_columns().items():
        on_disk = spilled.clock_columns()[key]
        assert isinstance(on_disk, np.memmap)  # the clock stays on disk until read
        assert np.array_equal(on_disk, column)
    assert len(spilled) == len(memory)  # (the steps a replica counts: its jitter index)


def test_the_replicas_clocks_are_joined_into_one_copy_each_replicas_own_let_go_of():
    """At a run's end each recorder hands its step clock over and keeps no reference to it;
    joined, each part points into the timeline's clock, so no replica's own copy is held."""
    recorders = [StepRecorder(), StepRecorder(), StepRecorder()]
    for i, rec in enumerate(recorders):
        rec.record(0.0, np.arange(1.0, 2.0 + i), list(range(1 + i)), DECODE, 1, 1)
    parts = [
        ReplicaPart(steps={}, clock=rec.take_clock_columns()["end"], now=0.0, kv_used=0, counts={})
        for rec in recorders
    ]
    own = [part.clock for part in parts]
    expected = np.concatenate(own)
    joined = join_clocks(parts)
    np.testing.assert_array_equal(joined, expected)
    for part, mine in zip(parts, own, strict=True):
        assert np.shares_memory(part.clock, joined) and not np.shares_memory(mine, joined)
    with pytest.raises(RuntimeError, match="handed over"):
        recorders[0].clock_columns()
    assert len(recorders[0]) == 0
