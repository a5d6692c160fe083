"""Calibration against the VTC paper's published numbers (reference.md), via simulator.paper_tables.

No row is tuned: every row runs its experiment config as shipped (VTC rows with the artifact's
lift, as all its runs had). Known deviations beyond ±30% (recorded in the closing notes) are
asserted with the bound they do meet, so a regression still fails:
- VTC(oracle) on the overload suites (Tables 4, 5): the paper's differences are nearly zero (Avg
  Diff 0.3-0.5 tokens/s out of ~900); ours are too (< 5 tokens/s) but not within 30%.
- Table 4 VTC (profiled) Max Diff +49%; VTC(±50%) Max Diff -53% (Table 5) and +34% (Table 6).
  With evenly spaced arrivals and deterministic step times the two-client overload runs lock
  into one of two regimes (Max Diff ~30 or ~210 for VTC, depending on the arrival phases); the
  GPU's timing noise is not modelled.
- On the real trace VTC(oracle) and VTC tie within 2% (paper: oracle 11% lower).
"""

from functools import cache

import pytest

from conftest import SHARED_DATA
from simulator.apps.run import compose_config, simulate_config
from simulator.apps.vtc_tables import ROWS, PaperRow, measure
from simulator.metrics import latency

PAPER_FCFS_OVERLOAD_TOKENS_PER_S = 876  # Table 4
NEAR_ZERO = {("4", "VTC(oracle)"), ("5", "VTC(oracle)")}
LOOSE = {("4", "VTC"), ("5", "VTC(±50%)"), ("6", "VTC(±50%)")}
needs_real = pytest.mark.skipif(
    not (SHARED_DATA / "vtc" / "real_trace.csv").exists(),
    reason="../shared/data/vtc/real_trace.csv is absent (the real-trace rows need ../shared)",
)


@cache
def measured(row: PaperRow) -> dict:
    return measure(row)


def table(name: str) -> dict[str, dict]:
    return {r.label: measured(r) for r in ROWS if r.table == name}


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
    else:
        assert m["rejected"] == 0
    if row.max_diff is not None:
        assert m["max_diff"] == pytest.approx(row.max_diff, rel=0.30)
        assert m["avg_diff"] == pytest.approx(row.avg_diff, rel=0.30)


@needs_real
def test_real_trace_orderings_match_the_paper():
    t = table("2")
    d = {k: v["max_diff"] for k, v in t.items()}
    assert d["RPM(5)"] < d["VTC(oracle)"] <= 1.02 * d["VTC"]
    assert d["VTC"] < 0.6 * d["LCF"] and d["LCF"] <= d["FCFS"]
    tput = {k: v["throughput_tokens_per_s"] for k, v in t.items()}
    assert tput["RPM(5)"] < 0.5 * min(tput[k] for k in ("FCFS", "LCF", "VTC", "VTC(oracle)"))
    # stricter limits reject more, serve less and are fairer
    limits = ["RPM(5)", "RPM(10)", "RPM(15)", "RPM(20)", "RPM(30)"]
    rejected = [t[k]["rejected"] for k in limits]
    assert rejected == sorted(rejected, reverse=True)
    assert [tput[k] for k in limits] == sorted(tput[k] for k in limits)


@pytest.mark.parametrize(
    "row", [r for r in ROWS if r.table in ("4", "5", "6")], ids=lambda r: f"T{r.table}-{r.label}"
)
def test_overload_suite_rows_within_30_percent(row):
    m = measured(row)
    key = (row.table, row.label)
    if key in NEAR_ZERO:
        assert m["max_diff"] < 10 and m["avg_diff"] < 5
    elif key in LOOSE:
        assert m["max_diff"] == pytest.approx(row.max_diff, rel=0.6)
        assert m["avg_diff"] == pytest.approx(row.avg_diff, rel=0.4)
    else:
        assert m["max_diff"] == pytest.approx(row.max_diff, rel=0.30)
        assert m["avg_diff"] == pytest.approx(row.avg_diff, rel=0.30)
    if row.throughput is not None:
        assert m["throughput_tokens_per_s"] == pytest.approx(row.throughput, rel=0.05)


def test_overload_ordering_prediction_helps():
    t = table("5")
    assert t["VTC(oracle)"]["avg_diff"] < t["VTC(±50%)"]["avg_diff"] < t["VTC"]["avg_diff"]
    assert t["VTC"]["avg_diff"] < t["FCFS"]["avg_diff"] / 3


@pytest.mark.parametrize("overrides", [[], ["experiment=vtc_overload"]])
def test_fcfs_overload_throughput_within_10_percent_of_the_paper(overrides):
    tl = simulate_config(compose_config(["policy=fcfs", *overrides]))
    tput = latency.token_throughput(tl.requests_frame())
    assert tput == pytest.approx(PAPER_FCFS_OVERLOAD_TOKENS_PER_S, rel=0.10)
    # decode concurrency near the paper's 19-20 (10,000 / 512)
    decode = tl.steps["kind"] == 1
    assert 18.5 < tl.steps["batch_size"][decode].mean() < 21.5
