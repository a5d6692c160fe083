"""Fairness metrics (docs/metrics.md §4) on hand-built runs whose answers are known in closed
form."""

import numpy as np
import pandas as pd
import pytest

from simulator.core.service import ProfiledService
from simulator.metrics.fairness import (
    accumulated_difference,
    difference_stats,
    fairness_summary,
    jain_index,
    paper_ticks,
    rejections,
    requested_rates,
    response_times,
    served_intervals,
    service_difference,
    service_in,
    service_rates,
)


def frame(rows):
    """rows: (client, arrival, prompt, output, status, first, finish)."""
    df = pd.DataFrame(
        rows,
        columns=[
            "client",
            "arrival",
            "prompt_len",
            "output_len",
            "status",
            "first_token_at",
            "finished_at",
        ],
    )
    df.insert(0, "request_id", np.arange(len(df)))
    df["client"] = pd.Categorical(df["client"], categories=["A", "B"])
    df["tokens_emitted"] = np.where(df.status == "completed", df.output_len, 0)
    df["reason"] = np.where(df.status == "rejected", "rpm_limit", None)
    return df


def steady_run(seconds=700):
    """A: one request per second, service 2 + 2*4 = 10, each served over 1 s -> 10/s.
    B: one per second, service 2 + 2*2 = 6 -> 6/s, and as many rejected requests -> asks 12/s."""
    rows = []
    for k in range(seconds):
        t = k + 0.25  # off every window edge (edges are inclusive, as in the artifact)
        rows.append(("A", t, 2, 4, "completed", t, t + 1.0))
        rows.append(("B", t, 2, 2, "completed", t, t + 1.0))
        rows.append(("B", t, 2, 2, "rejected", np.nan, np.nan))
    return frame(rows)


def test_service_is_spread_uniformly_over_the_token_interval():
    req = frame(
        [
            ("A", 0.0, 10, 5, "completed", 0.0, 10.0),  # 20 over [0, 10]
            ("B", 0.0, 20, 10, "completed", 5.0, 25.0),  # 40 over [5, 25]
            ("B", 0.0, 3, 1, "completed", 7.0, 7.0),  # one token: 5 at t = 7
        ]
    )
    got = service_in(served_intervals(req), np.array([0.0, 10.0]), np.array([10.0, 30.0]))
    np.testing.assert_allclose(got["A"], [20.0, 0.0])
    np.testing.assert_allclose(got["B"], [40 * 5 / 20 + 5, 40 * 15 / 20])


def test_rates_and_both_service_difference_forms():
    iv = served_intervals(steady_run())
    ticks = np.array([100.0, 300.0])
    np.testing.assert_allclose(service_rates(iv, ticks).to_numpy(), [[10, 6], [10, 6]])
    np.testing.assert_allclose(requested_rates(iv, ticks, demand="all")["B"], [12, 12])
    np.testing.assert_allclose(requested_rates(iv, ticks)["B"], [6, 6])  # served only
    # revision: sum_j min(max s - s_j, |r_j - s_j|) = min(4, 6) for B, 0 for A
    rev_all = service_difference(iv, "revision", demand="all")
    np.testing.assert_allclose(rev_all, 4.0)
    np.testing.assert_allclose(rev_all.index, paper_ticks())
    assert len(rev_all) == 19 and rev_all.index[0] == pytest.approx(28.5)
    # B got all it asked for once its rejected requests are not counted (the artifact's way)
    np.testing.assert_allclose(service_difference(iv, "revision"), 0.0)
    orig = service_difference(iv, "original", demand="all")
    np.testing.assert_allclose(orig.iloc[1:], 4.0)  # the first window, [0, 60], starts early
    assert orig.iloc[0] == pytest.approx(4.0, abs=0.02)
    np.testing.assert_allclose(orig.index, 30.0 * np.arange(1, 20))
    # weighted: A's weight 2 makes its normalised service 5 < B's 6, and A got all it asked
    np.testing.assert_allclose(service_difference(iv, demand="all", weights={"A": 2.0}), 0.0)
    assert difference_stats(rev_all) == pytest.approx(
        {"max_diff": 4.0, "avg_diff": 4.0, "diff_var": 0.0}
    )


def test_accumulated_difference_grows_at_the_rate_gap():
    iv = served_intervals(steady_run())
    d = accumulated_difference(iv, np.array([100.25, 200.25]))
    np.testing.assert_allclose(d, [(10 - 6) * 100, (10 - 6) * 200])
    weighted = accumulated_difference(iv, np.array([100.25]), weights={"A": 10 / 6})
    np.testing.assert_allclose(weighted, 0.0, atol=1e-9)


def test_profiled_service_function_is_used_when_given():
    req = frame([("A", 0.0, 100, 50, "completed", 0.0, 5.0)])
    iv = served_intervals(req, service=ProfiledService())
    assert iv["service"].iloc[0] == pytest.approx(float(ProfiledService()(100, 50)))


def test_jain_index_extremes():
    assert jain_index([3.0, 3.0, 3.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0]) == pytest.approx(0.5)
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)


def test_response_times_and_rejections():
    req = frame(
        [
            ("A", 0.0, 1, 2, "completed", 2.0, 3.0),  # TTFT 2, first token at 2
            ("A", 1.0, 1, 2, "completed", 5.0, 6.0),  # TTFT 4, first token at 5
            ("B", 0.0, 1, 2, "rejected", np.nan, np.nan),
            ("B", 0.0, 1, 2, "completed", 70.0, 71.0),
        ]
    )
    rt = response_times(req, np.array([0.0, 70.0]), window=6.0)
    np.testing.assert_allclose(rt["A"], [2.0, np.nan])  # only the first falls in [-3, 3]
    np.testing.assert_allclose(rt["B"], [np.nan, 70.0])
    rej = rejections(req)
    assert rej.to_dict("records") == [
        {"client": "B", "status": "rejected", "reason": "rpm_limit", "requests": 1}
    ]
    summary = fairness_summary(req)
    assert summary["rejected"] == 1 and summary["service_until"] == 1.0  # the last arrival
    assert summary["service_per_client"] == {"A": 0.0, "B": 0.0}  # nothing served by t = 1


def test_bad_form_or_demand_is_a_clear_error():
    iv = served_intervals(steady_run(100))
    with pytest.raises(ValueError, match="form must be one of"):
        service_difference(iv, form="newest")
    with pytest.raises(ValueError, match="demand must be 'served' or 'all'"):
        requested_rates(iv, np.array([50.0]), demand="some")
