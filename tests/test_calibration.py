"""Calibration against the VTC paper's published numbers (Tables 2-6, transcribed in
simulator/apps/papers/vtc_tables.py's ROWS), via simulator.apps.papers.vtc_tables.

No constant of the tables' cost model was chosen to match a published figure: the experiments
run `cost_model=a10g_llama7b_artifact`, whose prefill terms fit the artifact's kernel profile
and whose decode terms and step overhead fit the per-request timings of its two FCFS runs
(test_cost_models re-runs both fits). The default model (`a10g_llama7b`) keeps the kernel fit
plus a 4 ms step overhead calibrated once on FCFS's 876 tokens/s in Table 4.

Checked: every row runs its experiment config as shipped, none tuned (VTC rows with the
artifact's counter lift, as all its runs had), scored as the median of REPLICATIONS jittered
replications (the validation report's procedure, with fewer runs: one run of a row whose figure
is a maximum over windows spreads by a third). Rows are asserted within the paper's figures
(±30% Max/Avg Diff, ±5% throughput), except the known deviations in DEVIATIONS, which are
asserted against the bounds they were measured to meet (regression pins), each with its cause.
"""

from functools import cache

import numpy as np
import pytest

from conftest import SHARED_DATA
from simulator.api import compose_config, simulate_config
from simulator.apps.papers.vtc_tables import ROWS, PaperRow, measure
from simulator.metrics import latency

PAPER_FCFS_OVERLOAD_TOKENS_PER_S = 876  # Table 4
# Rows that do not match the paper within 30%: (Max Diff bound, Avg Diff bound, how each bound is
# read: "abs" absolute tokens/s, "rel" relative to the paper's value). Measured (Max / Avg Diff):
DEVIATIONS = {
    # the paper's differences are nearly zero (Avg Diff 0.34 and 0.51 out of ~900 tokens/s);
    # ours are too (medians of Max / Avg Diff about 2.6 / 0.3 and 3.5 / 0.5 with the end-to-end
    # cost fit; 5.34 / 0.61 and 7.39 / 0.84 before it, 5.17 / 2.87 and 7.16 / 3.97 before the
    # server's n + 2 prompt tokens) but not within 30% of so small a number
    ("4", "VTC(oracle)"): (10.0, 2.0, "abs"),
    ("5", "VTC(oracle)"): (10.0, 2.0, "abs"),
    # VTC(±50%) draws its prediction errors per replication, and its differences spread widely
    # (20 replications: Max Diff 21.1 to 43.8 from p5 to p95, the published 33.98 inside); the
    # medians of 5 replications lie 31% (Max) and 35% (Avg Diff) below the published figures
    ("5", "VTC(±50%)"): (0.40, 0.40, "rel"),
}
# Table 4 VTC and Tables 5 and 6 VTC(±50%) were deviations here at n prompt tokens (204.78 /
# 94.66, 16.00 / 8.30, 133.64 / 61.43); with the server's n + 2 they are within 30%.
needs_real = pytest.mark.skipif(
    not (SHARED_DATA / "vtc" / "real_trace.csv").exists(),
    reason="../shared/data/vtc/real_trace.csv is absent (the real-trace rows need ../shared)",
)


REPLICATIONS = 5


@cache
def measured(row: PaperRow) -> dict:
    """Each figure's median over the first REPLICATIONS replications of the report."""
    runs = [measure(row, replication=i) for i in range(REPLICATIONS)]
    numbers = [k for k, v in runs[0].items() if isinstance(v, int | float)]
    return {k: float(np.median([r[k] for r in runs])) for k in numbers}


def table(name: str) -> dict[str, dict]:
    return {r.label: measured(r) for r in ROWS if r.table == name}


@pytest.mark.slow
@needs_real
@pytest.mark.parametrize(
    "row", [r for r in ROWS if r.table in ("2", "3")], ids=lambda r: f"T{r.table}-{r.label}"
)
def test_real_trace_rows_within_the_papers_tolerances(row):
    m = measured(row)
    if row.throughput is not None:
        assert m["throughput_tokens_per_s"] == pytest.approx(row.throughput, rel=0.05)
    if row.rejected is not None:
        assert m["rejected"] == pytest.approx(row.rejected, rel=0.10)
    elif not row.label.startswith("RPM"):  # Table 3 prints no rejected counts for RPM's rows
        assert m["rejected"] == 0
    if row.max_diff is not None:
        assert m["max_diff"] == pytest.approx(row.max_diff, rel=0.30)
        assert m["avg_diff"] == pytest.approx(row.avg_diff, rel=0.30)


@needs_real
def test_real_trace_orderings_match_the_paper():
    t = table("2")
    d = {k: v["max_diff"] for k, v in t.items()}
    # VTC(oracle) is no less fair than VTC (the paper: 329.46 against 368.40), within the spread
    # of a maximum over 19 windows (20-replication medians 356 and 381; of 5, 369 and 356)
    assert d["RPM(5)"] < d["VTC(oracle)"] <= 1.1 * d["VTC"]
    # the paper's LCF and FCFS are 1.3% apart (750.49, 759.97): about as unfair, far above VTC
    # (fairsim's LCF lies 7-11% above its FCFS); VTC's is under half of either (0.48-0.49),
    # fairsim's 0.56-0.62 of FCFS's
    assert d["VTC"] < 0.7 * min(d["LCF"], d["FCFS"])
    assert d["LCF"] == pytest.approx(d["FCFS"], rel=0.15)
    tput = {k: v["throughput_tokens_per_s"] for k, v in t.items()}
    assert tput["RPM(5)"] < 0.5 * min(tput[k] for k in ("FCFS", "LCF", "VTC", "VTC(oracle)"))
    # stricter limits reject more, serve less and are fairer
    limits = ["RPM(5)", "RPM(10)", "RPM(15)", "RPM(20)", "RPM(30)"]
    rejected = [t[k]["rejected"] for k in limits]
    assert rejected == sorted(rejected, reverse=True)
    assert [tput[k] for k in limits] == sorted(tput[k] for k in limits)


OVERLOAD_ROWS = [r for r in ROWS if r.table in ("4", "5", "6")]


@pytest.mark.slow
@pytest.mark.parametrize(
    "row",
    [r for r in OVERLOAD_ROWS if (r.table, r.label) not in DEVIATIONS],
    ids=lambda r: f"T{r.table}-{r.label}",
)
def test_overload_suite_rows_within_30_percent_of_the_paper(row):
    m = measured(row)
    assert m["max_diff"] == pytest.approx(row.max_diff, rel=0.30)
    assert m["avg_diff"] == pytest.approx(row.avg_diff, rel=0.30)
    if row.throughput is not None:
        assert m["throughput_tokens_per_s"] == pytest.approx(row.throughput, rel=0.05)


@pytest.mark.slow
@pytest.mark.parametrize(
    "row",
    [r for r in OVERLOAD_ROWS if (r.table, r.label) in DEVIATIONS],
    ids=lambda r: f"T{r.table}-{r.label}",
)
def test_known_deviations_stay_within_the_bounds_they_were_measured_to_meet(row):
    m = measured(row)
    max_bound, avg_bound, kind = DEVIATIONS[(row.table, row.label)]
    if kind == "abs":
        assert m["max_diff"] < max_bound and m["avg_diff"] < avg_bound
    else:
        assert m["max_diff"] == pytest.approx(row.max_diff, rel=max_bound)
        assert m["avg_diff"] == pytest.approx(row.avg_diff, rel=avg_bound)
    if row.throughput is not None:
        assert m["throughput_tokens_per_s"] == pytest.approx(row.throughput, rel=0.05)


def test_overload_ordering_prediction_helps():
    t = table("5")
    assert t["VTC(oracle)"]["avg_diff"] < t["VTC(±50%)"]["avg_diff"] < t["VTC"]["avg_diff"]
    assert t["VTC"]["avg_diff"] < t["FCFS"]["avg_diff"] / 3


@pytest.mark.parametrize("overrides", [[], ["experiment=vtc_overload"]])
def test_fcfs_throughput_is_the_papers_with_the_kernel_and_the_end_to_end_cost(overrides):
    tl = simulate_config(compose_config(["policy=fcfs", *overrides]))
    tput = latency.token_throughput(tl.requests_frame())
    assert tput == pytest.approx(PAPER_FCFS_OVERLOAD_TOKENS_PER_S, rel=0.10)
    # decode concurrency near the paper's 19-20 (10,000 / 512)
    decode = tl.steps["kind"] == 1
    assert 18.5 < tl.steps["batch_size"][decode].mean() < 21.5
