import json

import numpy as np
import pandas as pd
import pytest

from conftest import a10g_cost, random_trace
from cost_models import ConstantStepCost
from policies import FCFS
from simulator.engines import SLoRAConfig, simulate
from simulator.metrics import latency
from simulator.report.run_folder import load_run, write_run
from traces import Trace


def run(seed=1, **cfg):
    tr = random_trace(seed, 200, 3, 300, 200, 5.0)
    return simulate(tr, FCFS(), a10g_cost(), SLoRAConfig(**cfg))


def test_run_folder_round_trip_and_public_columns(tmp_path):
    tl = run()
    written = write_run(tl, tmp_path, {"seed": 1})
    back = load_run(tmp_path)
    pd.testing.assert_frame_equal(written.requests, back.requests)
    pd.testing.assert_frame_equal(written.tokens, back.tokens)
    pd.testing.assert_frame_equal(written.steps, back.steps)
    for col in (
        "request_id",
        "client",
        "arrival",
        "prompt_len",
        "output_len",
        "status",
        "reason",
        "admitted_at",
        "first_token_at",
        "finished_at",
    ):
        assert col in back.requests.columns
    assert list(back.tokens.columns) == ["request_id", "index", "time"]
    for col in ("start", "end", "kind", "batch_size", "num_tokens", "kv_used"):
        assert col in back.steps.columns
    s = back.summary
    assert s["status_counts"]["completed"] == len(back.requests)
    assert s["output_tokens"] == back.requests.output_len.sum() == len(back.tokens)
    assert s["config"] == {"seed": 1} and len(s["config_digest"]) == 16
    assert set(s["latency"]) == {"c0", "c1", "c2", "all"}
    json.dumps(s, allow_nan=False)  # strict JSON


def test_parquet_written_in_row_groups_reads_back_as_the_frame_with_its_types(
    tmp_path, monkeypatch
):
    """write_parquet writes a row group at a time (bounded memory): the file holds one group per
    PARQUET_ROW_GROUP rows, and reads back equal to the frame and to a one-shot write, also
    when a later part's object column has values where the first part's is all null."""
    import pyarrow.parquet as pq

    from simulator.report import run_folder

    monkeypatch.setattr(run_folder, "PARQUET_ROW_GROUP", 4)
    ids = np.full(10, None, dtype=object)
    ids[7:] = ["x-7", "x-8", "x-9"]
    frame = pd.DataFrame(
        {
            "request_id": np.arange(10),
            "client": pd.Categorical.from_codes(np.arange(10) % 2, categories=["a", "b"]),
            "reason": pd.array([None] * 5 + ["r"] * 5, dtype="string"),
            "time": np.linspace(0.0, 1.0, 10),
            "client_request_id": ids,
        }
    )
    run_folder.write_parquet(frame, tmp_path / "parts.parquet")
    frame.to_parquet(tmp_path / "whole.parquet", index=False)
    assert pq.ParquetFile(tmp_path / "parts.parquet").metadata.num_row_groups == 3
    back = pd.read_parquet(tmp_path / "parts.parquet")
    pd.testing.assert_frame_equal(back, pd.read_parquet(tmp_path / "whole.parquet"))
    assert back.client_request_id.isna().tolist() == [v is None for v in ids]
    assert back.client_request_id.iloc[7:].tolist() == ["x-7", "x-8", "x-9"]
    run_folder.write_parquet(frame.iloc[:0], tmp_path / "empty.parquet")
    assert list(pd.read_parquet(tmp_path / "empty.parquet").columns) == list(frame.columns)


def test_load_run_rejects_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a fairsim run folder"):  # IncompleteRunError
        load_run(tmp_path)


def test_same_seed_gives_identical_files(tmp_path):
    write_run(run(seed=3), tmp_path / "a", {"seed": 3})
    write_run(run(seed=3), tmp_path / "b", {"seed": 3})
    for name in ("requests.parquet", "tokens.parquet", "steps.parquet", "summary.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_throughput_is_tokens_of_completed_over_last_finish():
    tl = run()
    req = tl.requests_frame()
    done = req[req.status == "completed"]
    expected = (done.prompt_len + done.output_len).sum() / done.finished_at.max()
    assert latency.token_throughput(req) == pytest.approx(expected)


def veeksha_like_tables():
    """One request: arrival 0, tokens at 0.5 then every 0.15 s (11 tokens)."""
    times = 0.5 + 0.15 * np.arange(11)
    requests = pd.DataFrame(
        {
            "request_id": [7],
            "client": ["a"],
            "arrival": [0.0],
            "prompt_len": [8],
            "output_len": [11],
            "status": ["completed"],
            "finished_at": [times[-1]],
        }
    )
    tokens = pd.DataFrame({"request_id": 7, "index": np.arange(11), "time": times})
    return requests, tokens


def test_latency_reference_vector():
    requests, tokens = veeksha_like_tables()
    lat = latency.per_request_latency(requests, tokens).iloc[0]
    assert lat.ttft == pytest.approx(0.5)
    assert lat.e2e == pytest.approx(2.0)
    assert lat.tpot == pytest.approx(0.15)
    assert lat.normalized_e2e == pytest.approx(2.0 / 11)
    gaps = latency.tbt_samples(tokens).tbt.to_numpy()
    np.testing.assert_allclose(gaps, 0.15)
    assert gaps.shape[0] == 10


def test_one_token_requests_have_no_tpot():
    requests = pd.DataFrame(
        {
            "request_id": [1],
            "client": ["a"],
            "arrival": [1.0],
            "prompt_len": [3],
            "output_len": [1],
            "status": ["completed"],
            "finished_at": [1.2],
        }
    )
    tokens = pd.DataFrame({"request_id": [1], "index": [0], "time": [1.2]})
    lat = latency.per_request_latency(requests, tokens).iloc[0]
    assert np.isnan(lat.tpot) and lat.ttft == pytest.approx(0.2)
    summary = latency.latency_summary(requests, tokens)
    assert np.isnan(summary["all"]["tpot"]["mean"])


def test_kv_utilisation_is_time_weighted():
    steps = pd.DataFrame({"start": [0.0, 1.0], "end": [1.0, 4.0], "kv_used": [100, 50]})
    u = latency.kv_utilisation(steps, 100)
    assert u == {"mean": pytest.approx((1.0 + 0.5 * 3) / 4), "peak": 1.0}


def test_percentile_summary_uses_linear_interpolation():
    p = latency.percentiles(np.array([1.0, 2.0, 3.0, 4.0]))
    assert p["p50"] == 2.5 and p["p90"] == pytest.approx(3.7) and p["mean"] == 2.5


@pytest.mark.parametrize("n", [1, 2, 7, 100, 1001])
def test_percentile_summary_equals_one_percentile_call_per_p_bit_for_bit(n):
    """The summary takes all its percentiles from one numpy call; each must be exactly the
    value `percentile` gives alone (one partition per p), NaNs left out."""
    rng = np.random.default_rng(n)
    v = np.round(rng.exponential(0.05, n), rng.integers(2, 12))  # ties included
    v[rng.random(n) < 0.1] = np.nan
    got = latency.percentiles(v, (1, 50, 90, 99, 100))
    for p in (1, 50, 90, 99, 100):
        alone = latency.percentile(v, p)
        assert got[f"p{p}"] == alone or (np.isnan(alone) and np.isnan(got[f"p{p}"]))


def test_constant_cost_batch_closed_form():
    """n identical requests at t=0 fit in one mini-batch: all share the same token times."""
    n, out = 8, 20
    tr = Trace.from_columns(
        client=["a"] * n, arrival=[0.0] * n, prompt_len=[10] * n, output_len=[out] * n
    )
    tl = simulate(tr, FCFS(), ConstantStepCost(0.2, 0.05), SLoRAConfig())
    np.testing.assert_allclose(tl.finished_at, 0.2 + (out - 1) * 0.05)
    assert latency.token_throughput(tl.requests_frame()) == pytest.approx(
        n * (10 + out) / (0.2 + (out - 1) * 0.05)
    )


def test_token_grouping_does_not_depend_on_the_row_order_of_the_token_table():
    """Metrics group tokens by request without sorting when the table is already grouped (as a
    run folder is); a table grouped in another order, or shuffled, gives the same answers."""
    from simulator.metrics.latency import grouped_tokens

    rng = np.random.default_rng(0)
    counts = rng.integers(1, 6, 30)
    ids = rng.permutation(1000)[:30]
    tokens = pd.DataFrame(
        {
            "request_id": np.repeat(ids, counts),
            "index": np.concatenate([np.arange(c) for c in counts]),
            "time": np.cumsum(rng.exponential(0.01, counts.sum())),
        }
    )
    reference = tokens.sort_values(["request_id", "index"], kind="stable")
    for frame in (reference, tokens, tokens.sample(frac=1.0, random_state=1)):
        got = grouped_tokens(frame)
        assert np.array_equal(got[0], np.sort(ids))
        assert np.array_equal(got[1], counts[np.argsort(ids)])
        assert np.array_equal(got[2], reference["time"].to_numpy())
